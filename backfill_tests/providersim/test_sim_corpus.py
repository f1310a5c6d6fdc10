"""The corpus generator (``providersim/corpus.py``) and the simulator answering its posts by their
true label: per model and difficulty as often as configured, over real HTTP."""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import time
import unicodedata
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from backfill_assets.domain.policy.file import load_policy
from backfill_assets.domain.policy.rubric import Rubric
from backfill_assets.ingest.gold import read_gold
from backfill_assets.providers.models.openai_wire import token_logprobs
from backfill_assets.providers.models.rules import count_tokens
from backfill_assets.providersim import SimConfig
from backfill_assets.providersim.args import add_cli_arguments, config_from_args
from backfill_assets.providersim.corpus import (
    CHEAP,
    DIFFICULTIES,
    STRONG,
    Accuracy,
    Corpus,
    accuracy_of,
    main,
)
from backfill_tests.policy_helpers import DOCS_POLICIES
from backfill_tests.providersim.conftest import StartSim

FORUM = DOCS_POLICIES / "forum-moderation.yaml"
CHEAP_MODEL, STRONG_MODEL, MODERATION_MODEL = "gpt-4o-mini", "gpt-4o", "omni-moderation-latest"
# One post in three of each difficulty, half of them harmful: enough of each to measure.
SHARES = "easy=1,medium=1,hard=1"


def _generate(out: Path, posts: int, seed: int = 11, *extra: str) -> Path:
    argv = ["--posts", str(posts), "--tenants", "7", "--seed", str(seed), "--out", str(out)]
    assert main([*argv, "--policy", str(FORUM), *extra]) == 0
    return out


def _rows(out: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(posts.jsonl line, its truth in corpus.json), in file order."""
    posts = json.loads((out / "corpus.json").read_text("utf-8"))["posts"]
    lines = [json.loads(line) for line in (out / "posts.jsonl").read_text("utf-8").splitlines()]
    return [(line, posts[_sha(line["text"])]) for line in lines]


def _sha(text: str) -> str:
    return hashlib.sha256(unicodedata.normalize("NFC", text).encode("utf-8")).hexdigest()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("corpus")
    return _generate(out, 1500, 11, "--harmless", "0.5", "--difficulty", SHARES, "--gold", "300")


def test_the_same_seed_writes_the_same_files_and_keeps_the_shares_asked(tmp_path: Path) -> None:
    first, again, other = (
        _generate(tmp_path / n, 6000, s) for n, s in [("a", 5), ("b", 5), ("c", 6)]
    )
    for name in ("posts.jsonl", "gold.csv", "corpus.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes()
        assert (first / name).read_bytes() != (other / name).read_bytes()
    rows = _rows(first)
    texts = [line["text"] for line, _truth in rows]
    assert len(rows) == 6000 and len(set(texts)) == 6000
    assert all(unicodedata.normalize("NFC", t) == t for t in texts)
    labels = Counter(truth["label"] for _line, truth in rows)
    assert labels["ok"] / 6000 == pytest.approx(0.85, abs=0.02)
    assert all(labels[lb] / 6000 == pytest.approx(0.05, abs=0.015) for lb in ("threat", "abuse"))
    assert labels["self_harm"] / 6000 == pytest.approx(0.05, abs=0.015)
    levels = Counter(truth["difficulty"] for _line, truth in rows)
    for level, share in {"easy": 0.7, "medium": 0.2, "hard": 0.1}.items():
        assert levels[level] / 6000 == pytest.approx(share, abs=0.02)
    tenants = Counter(line["tenant_id"] for line, _truth in rows)
    assert len(tenants) == 7 and max(tenants.values()) > 3 * min(tenants.values())  # mixed sizes
    for _line, truth in rows:
        if truth["label"] != "ok":  # a harmful post's rule is its label's, its category too
            rule_of = {"threat": {"V-1"}, "abuse": {"H-1", "H-2"}, "self_harm": {"S-1"}}
            assert truth["rule"] in rule_of[truth["label"]] and truth["category"] is not None
        elif truth["difficulty"] == "easy":
            assert (truth["rule"], truth["category"]) == (None, None)
    assert Corpus.model_validate_json((first / "corpus.json").read_bytes()).none_label == "ok"


def test_the_shares_of_difficulty_and_labels_follow_the_options(tmp_path: Path) -> None:
    out = _generate(
        tmp_path, 3000, 2, "--difficulty", "easy=0,medium=1,hard=3", "--labels", "abuse=1"
    )
    rows = _rows(out)
    levels = Counter(truth["difficulty"] for _line, truth in rows)
    assert levels["easy"] == 0 and levels["hard"] / 3000 == pytest.approx(0.75, abs=0.03)
    assert {truth["label"] for _line, truth in rows} == {"ok", "abuse"}
    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path), "--difficulty", "easy=1,extreme=1"])


def test_gold_csv_is_read_by_the_products_gold_reader_without_a_rejection(corpus: Path) -> None:
    gold = read_gold(corpus / "gold.csv", "eval")
    assert len(gold.rows) == 300 and gold.rejected == []
    truths = {line["post_id"]: truth for line, truth in _rows(corpus)}
    for row in gold.rows:
        truth = truths[row.post.post_id]
        assert (row.label, row.rule) == (truth["label"], truth["rule"])
    with (corpus / "gold.csv").open(encoding="utf-8", newline="") as fh:
        assert next(csv.reader(fh)) == ["id", "text", "label", "rule"]


def test_a_hundred_thousand_posts_generate_in_seconds(tmp_path: Path) -> None:
    started = time.monotonic()
    _generate(tmp_path, 100_000, 3, "--tenants", "50")
    assert time.monotonic() - started < 10.0
    assert (tmp_path / "posts.jsonl").read_bytes().count(b"\n") == 100_000


def _chat(
    client: httpx.Client, rubric: Rubric, model: str, key: str, text: str
) -> tuple[str, float | None, str]:
    """(label, p_label, content) as the product reads a chat-json answer with logprobs."""
    schema = {"name": "moderation", "strict": True, "schema": rubric.schema}
    body = {"model": model, "messages": rubric.messages(key, text), "logprobs": True}
    body["response_format"] = {"type": "json_schema", "json_schema": schema}
    resp = client.post("/chat/completions", json=body)
    assert resp.status_code == 200, resp.text
    choice = resp.json()["choices"][0]
    content = choice["message"]["content"]
    out, p_label = rubric.read(content, key, token_logprobs(choice["logprobs"]))
    return out.label, p_label, content


def _key(model: str, post_id: str) -> str:
    return hashlib.sha256(f"{model}:{post_id}".encode()).hexdigest()


@pytest.mark.parametrize(("model", "expected"), [(CHEAP_MODEL, CHEAP), (STRONG_MODEL, STRONG)])
def test_a_chat_model_is_right_per_difficulty_as_often_as_configured(
    start_sim: StartSim, corpus: Path, model: str, expected: Accuracy
) -> None:
    sim = start_sim(corpus=corpus / "corpus.json")
    rubric = Rubric(load_policy(FORUM))
    right: dict[str, list[bool]] = defaultdict(list)
    p_right, p_wrong = [], []
    with httpx.Client(base_url=sim.base_url) as client:
        for line, truth in _rows(corpus):
            key = _key(model, line["post_id"])
            label, p_label, _content = _chat(client, rubric, model, key, line["text"])
            assert p_label is not None
            right[truth["difficulty"]].append(label == truth["label"])
            (p_right if label == truth["label"] else p_wrong).append(p_label)
        # The same request, the same answer.
        line, _truth = _rows(corpus)[0]
        once = _chat(client, rubric, model, _key(model, "again"), line["text"])
        assert _chat(client, rubric, model, _key(model, "again"), line["text"]) == once
    tolerance = 0.08 if expected.hard < 0.8 else 0.05  # ~500 posts each: about 4 sigma
    shares = {level: sum(right[level]) / len(right[level]) for level in DIFFICULTIES}
    for level, share in shares.items():
        assert share == pytest.approx(getattr(expected, level), abs=tolerance), level
    assert shares["hard"] < min(shares["medium"], shares["easy"])
    assert sum(p_right) / len(p_right) > sum(p_wrong) / len(p_wrong) + 0.1
    # A threshold on p_label separates sure from unsure answers, imperfectly.
    assert sum(p >= 0.97 for p in p_right) > len(p_right) / 4
    assert 0 < sum(p >= 0.9 for p in p_wrong) < len(p_wrong) / 3


def test_the_moderation_endpoint_errs_on_hard_posts(start_sim: StartSim, corpus: Path) -> None:
    sim = start_sim(corpus=str(corpus / "corpus.json"))
    rubric = Rubric(load_policy(FORUM), dialect="openai-moderation")  # the forum's thresholds
    rows = _rows(corpus)
    wrong: dict[tuple[bool, str], list[bool]] = defaultdict(list)
    with httpx.Client(base_url=sim.base_url) as client:
        for start in range(0, len(rows), 32):
            chunk = rows[start : start + 32]
            body = {"model": MODERATION_MODEL, "input": [line["text"] for line, _t in chunk]}
            results = client.post("/moderations", json=body).json()["results"]
            for (_line, truth), result in zip(chunk, results, strict=True):
                out, _p = rubric.read(json.dumps(result), "k" * 64)
                harmless, level = truth["label"] == "ok", truth["difficulty"]
                wrong[harmless, level].append(out.label != truth["label"])
                scores = sorted(result["category_scores"].values())
                # Every category near 0 but the one the post shows as (none: plain harmless).
                assert scores[-1 if harmless and level == "easy" else -2] < 0.01
    assert not any(wrong[True, "easy"])  # a plain harmless post is never flagged
    for harmless in (True, False):
        rates = {
            level: sum(wrong[harmless, level]) / len(wrong[harmless, level])
            for level in DIFFICULTIES
        }
        assert rates["easy"] < rates["medium"] < rates["hard"]
        assert rates["hard"] == pytest.approx(1 - CHEAP.hard, abs=0.1)


def test_pinned_scores_still_win_over_the_corpus(start_sim: StartSim, corpus: Path) -> None:
    line = next(ln for ln, truth in _rows(corpus) if truth["category"] == "violence")
    pin = hashlib.sha256(line["text"].encode()).hexdigest()
    sim = start_sim(corpus=corpus / "corpus.json", moderation_scores={pin: {"violence": 0.123}})
    body = {"model": MODERATION_MODEL, "input": [line["text"]]}
    result = httpx.post(f"{sim.base_url}/moderations", json=body).json()["results"][0]
    assert result["category_scores"]["violence"] == 0.123


def test_posts_outside_the_corpus_get_the_answers_they_got_before(
    start_sim: StartSim, corpus: Path
) -> None:
    sim = start_sim(corpus=corpus / "corpus.json")
    line, _truth = _rows(corpus)[0]
    with httpx.Client(base_url=sim.base_url) as client:
        outside = _chat(client, Rubric(), CHEAP_MODEL, "c" * 64, "free money, click here")
        inside = _chat(client, Rubric(load_policy(FORUM)), CHEAP_MODEL, "d" * 64, line["text"])
        body = {"model": MODERATION_MODEL, "input": ["I will kill you tomorrow"]}
        scores = client.post("/moderations", json=body).json()["results"][0]["category_scores"]
        meter = client.get(sim.base_url.removesuffix("/v1") + "/_sim/meter").json()
    # Golden: what the simulator answered before the corpus existed.
    assert outside == ("spam", pytest.approx(0.947391575976599), GOLDEN_CHAT)
    assert (scores["violence"], scores["harassment/threatening"]) == (0.927295, 0.87504)
    # Billing is unchanged: a call's completion tokens are its answer's.
    tokens = count_tokens(outside[2]) + count_tokens(inside[2])
    assert meter["billed_completion_tokens"] == tokens


GOLDEN_CHAT = (
    '{"schema_version": 1, "correlation_id": "' + "c" * 64 + '", "label": "spam", '
    '"rule_ids": [], "confidence": 0.7941}'
)


def test_the_command_line_reads_a_corpus_and_accuracies(corpus: Path) -> None:
    parser = argparse.ArgumentParser()
    add_cli_arguments(parser)
    argv = ["--corpus", str(corpus / "corpus.json"), "--accuracy", "my-model=1,0.5,0"]
    config = config_from_args(parser.parse_args(argv))
    assert config.corpus is not None and len(config.corpus.posts) == 1500
    assert accuracy_of(config.accuracy, "my-model-v2", "medium") == 0.5
    assert accuracy_of(config.accuracy, "gpt-4o-mini-2024-07-18", "hard") == CHEAP.hard
    assert accuracy_of(config.accuracy, "gpt-4o-2024-08-06", "hard") == STRONG.hard
    assert accuracy_of(config.accuracy, "some-model", "easy") == CHEAP.easy
    assert accuracy_of(SimConfig(accuracy={}).accuracy, "gpt-4o", "hard") == CHEAP.hard
    with pytest.raises(SystemExit):
        parser.parse_args(["--accuracy", "m=1,2,0"])
    with pytest.raises(ValidationError, match="cannot read the corpus"):
        SimConfig(corpus=corpus / "missing.json")
    with pytest.raises(ValidationError, match="sha256 hex"):
        SimConfig(
            corpus={
                "policy": "p",
                "none_label": "ok",
                "posts": {"text": {"label": "ok", "difficulty": "easy"}},
            }
        )
