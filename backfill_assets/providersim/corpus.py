"""A corpus with a true label and a difficulty per post, and the truth the simulator reads.

``python -m backfill_assets.providersim.corpus --posts N --tenants T --harmless 0.85 --seed S
--policy FILE --out DIR`` writes posts.jsonl, gold.csv and corpus.json, the same for the same
arguments; ``SimConfig.corpus`` and ``accuracy`` make the simulator answer by them (answers.py,
moderations.py; docs/providers.md, "The corpus generator"). No real slur: mild stand-ins.
"""

from __future__ import annotations

import argparse
import bisect
import csv
import hashlib
import itertools
import json
import random
import sys
import unicodedata
import warnings
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, Literal, get_args

import orjson
from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field

from backfill_assets.domain.policy.dialect_sections import MODERATION_CATEGORIES
from backfill_assets.domain.policy.document import Policy
from backfill_assets.domain.policy.file import builtin_policy, load_policy

if sys.argv[:1] == ["-m"]:  # python -m ...corpus: the package (its config) imported us first
    warnings.filterwarnings("ignore", f"'{__name__}' found in sys.modules", RuntimeWarning)
Difficulty = Literal["easy", "medium", "hard"]
DIFFICULTIES: tuple[Difficulty, ...] = get_args(Difficulty)
DEFAULT_SHARES = {"easy": 0.7, "medium": 0.2, "hard": 0.1}
_FROZEN = ConfigDict(extra="forbid", frozen=True)
Row = tuple[str, str, str, dict[str, Any]]  # tenant, post id, text, truth (as corpus.json)


class Accuracy(BaseModel):
    """The probability that a model answers a post's true label, per difficulty."""

    model_config = _FROZEN
    easy: float = Field(ge=0.0, le=1.0)
    medium: float = Field(ge=0.0, le=1.0)
    hard: float = Field(ge=0.0, le=1.0)


# A small or cheap model (and the moderation endpoint), and a strong one. Unknown models: CHEAP.
CHEAP = Accuracy(easy=0.98, medium=0.85, hard=0.6)
STRONG = Accuracy(easy=0.995, medium=0.97, hard=0.9)
_CHEAP_MODELS = ("gpt-4o-mini", "gpt-4.1-mini", "gpt-4.1-nano", "gpt-5-mini", "gpt-5-nano")
DEFAULT_ACCURACY: dict[str, Accuracy] = {
    **dict.fromkeys(("gpt-4o", "gpt-4.1", "gpt-5", "o3", "o4"), STRONG),
    **dict.fromkeys((*_CHEAP_MODELS, "o4-mini", "omni-moderation", "text-moderation"), CHEAP),
}


def accuracy_of(table: Mapping[str, Accuracy], model: str, difficulty: Difficulty) -> float:
    """``model``'s accuracy at ``difficulty``: its own entry, else the longest entry that is a
    prefix of its name (``gpt-4o-mini-2024-07-18`` is ``gpt-4o-mini``'s), else ``CHEAP``."""
    found = table.get(model)
    if found is None:
        prefixes = [name for name in table if model.startswith(name)]
        found = table[max(prefixes, key=len)] if prefixes else CHEAP
    return {"easy": found.easy, "medium": found.medium, "hard": found.hard}[difficulty]


def text_sha(text: str) -> str:
    """A post's key in corpus.json: the sha256 hex of its NFC text (UTF-8)."""
    return hashlib.sha256(unicodedata.normalize("NFC", text).encode("utf-8")).hexdigest()


class CorpusPost(BaseModel):
    """One post's truth."""

    model_config = _FROZEN
    label: str
    rule: str | None = None
    difficulty: Difficulty
    # The moderation category the post shows as (the policy's first for its rule, else for its
    # label), or for a harmless medium or hard post the label's it looks like; None: none.
    category: str | None = None
    # The label a wrong answer picks when it does not pick the none label (None: any other).
    near: str | None = None


def _checked(posts: dict[str, CorpusPost]) -> dict[str, CorpusPost]:
    for key, post in posts.items():
        if len(key) != 64 or key.strip("0123456789abcdef"):
            raise ValueError(f"corpus posts are keyed by sha256 hex of their text, got {key!r}")
        if post.category is not None and post.category not in MODERATION_CATEGORIES:
            raise ValueError(f"unknown moderation category {post.category!r}")
    return posts


class Corpus(BaseModel):
    """corpus.json: the policy it was made for, its none label and every post's truth."""

    model_config = _FROZEN
    version: Literal[1] = 1
    policy: str
    none_label: str
    posts: Annotated[dict[str, CorpusPost], AfterValidator(_checked)]

    def truth(self, text: str) -> CorpusPost | None:
        """The truth of a post's text (None: not in the corpus)."""
        return self.posts.get(text_sha(text))


def _read_file(value: Any) -> Any:
    if not isinstance(value, str | PathLike):
        return value
    try:
        return json.loads(Path(value).read_text("utf-8"))
    except (OSError, ValueError) as exc:  # a validation error, not a traceback
        raise ValueError(f"cannot read the corpus {str(value)!r}: {exc}") from None


# SimConfig.corpus: a parsed corpus.json, or the path of one.
CorpusFile = Annotated[Corpus, BeforeValidator(_read_file)]

# Word lists (``|``-separated) and templates (``theme kind: text``), read once at import. Kinds:
# easy, medium and hard posts of a harmful theme; ``soft`` and ``quote``: harmless medium and
# hard posts that borrow the theme's words; ``plain``: harmless easy posts.
_WORDS = """
name: Sam|Priya|Tomasz|Aiko|Mateo|Zoë|Farid|Lena|Kwame|Ines|Jonas|Mara|Oskar|Noor|Dev|Ruth|Bao
name: Elif|Chidi|Hana|Luca|Freya|Omar|Nina|Rafael|Tess|Yusuf|Greta|Milo|Ada|Viktor|Sofía|Kai
sig: mod_fan|quietreader|Dev|nightowl42|the_gardener|Mara K.|bikeguy|T.|admin-in-training|Ruth
thing: router|sourdough starter|bike chain|new patch|garden shed|3D printer|raid boss|keyboard
thing: espresso machine|camera lens|tomato plants|chess opening|fantasy league|mod pack|drone
thing: cover letter|guitar amp|heat pump|car battery|knitting pattern|tax form|phone update
thing: board game|fish tank|laptop fan|running shoes|podcast|compost heap|e-reader|van build
place: library|community hall|pub|skate park|allotment|gym|market|book club|car park|café|ferry
place: town square|climbing wall|swimming pool|station|co-working space|bakery|chess club|rink
when: tonight|after the meetup|next weekend|on Friday|tomorrow|after work|at the next game|soon
harm: hurt you|break your nose|smash your face in|put you in hospital|beat you up|end you
harm: break your legs|make you bleed|knock your teeth out|make you regret being born
insult: clown|moron|muppet|donkey|waste of space|joke|loser|fool|dimwit|numpty|halfwit|buffoon
insult: plonker|twit|brainless troll|walking disaster
group: cyclists|vegans|left-handers|night-shift workers|people from Eastbrook|city folk|golfers
group: people from Norvale|the over-fifties|console gamers|tourists|landlords|cat people
opener: ||Long time lurker here.|Update:|Quick one.|Honestly?|Not gonna lie.|Ok so.|Hi all.
opener: Sorry, long post.|Day {n} of this.|Hey everyone.|Re the {thing}:|Throwaway account.
closer: || Thoughts?| lol| Cheers.| Just saying.| (edited)| Anyway.| :)| Any ideas?| - {sig}
closer:  Thanks in advance.| Rant over.| Cheers, {sig}| Edit: typo.| Sorry for the caps.| /rant
"""
_TEMPLATES = """
threat easy: {name}, I will {harm} {when}.
threat easy: I know where you live, {name}. I am going to {harm} at the {place}.
threat medium: If {name} shows up at the {place} again he won't leave in one piece.
threat medium: Someone should teach {name} a lesson he won't walk away from {when}.
threat hard: Nice {thing} you have there, {name}. Shame if something happened to it {when}.
threat hard: Say that again at the {place}, {name}. Bring a friend. You'll need one.
threat hard: Got your address off the {place} sign-up sheet, {name}. No reason. See you {when}.
threat soft: This {thing} is killing me, {n} hours and still stuck.
threat soft: The {thing} destroyed me again. I will get my revenge {when}, {name}.
threat quote: Reporting this: someone in the {thing} thread wrote "I will {harm}". Mods?
threat quote: My villain says "I will {harm}" in chapter {n}. Too dark for {name}'s kids?
abuse easy: {name}, you are a complete {insult} and everyone at the {place} knows it.
abuse easy: Only a {insult} would write a {thing} review this bad. Well done, {name}.
abuse medium: Not saying {name} is a {insult}, but every {thing} post of theirs reads like one.
abuse medium: {name} strikes again with the dumbest {thing} advice on the forum. Impressive.
abuse hard: Wow {name}, what a genius take on the {thing}. A true gift to this forum. /s
abuse hard: Bless your heart, {name}. Reading the {thing} manual must be so hard for you.
abuse hard: {name} posted about the {thing} again, everyone lower your expectations.
abuse soft: I feel like such a {insult} for leaving the {thing} at the {place}.
abuse soft: My {n}-year-old called me a {insult} over the {thing} and honestly, fair.
abuse quote: Someone called me a {insult} in my DMs about the {thing}. Screenshot sent to mods.
abuse quote: Our quiz team at the {place} is The {insult} Squad and we're proud of it, {name}.
hate easy: All {group} are vermin and should be thrown off this forum, {thing} thread first.
hate easy: I can't stand {group}. They ruin everything they touch, the {thing} included.
hate medium: Funny how every problem at the {place} starts when {group} show up.
hate medium: Ban {group} from the {place} and watch the {thing} queue vanish overnight.
hate hard: Just asking questions: why do {group} always get the best {thing}? Wake up.
hate hard: {group} being {group} again at the {place}. We all know what they're like.
hate hard: Interesting how the {thing} went downhill once {group} started posting. Just noticing.
hate soft: Why do {group} love the {thing} so much? Genuinely curious.
hate soft: Does anyone else find {group} oddly good at the {thing}? Asking for {name}.
hate quote: Quoting the troll in the {thing} thread: "{group} are filth". We need better mods.
hate quote: As one of the {group} here, we call ourselves the weirdos of the {place}. Love it.
self easy: I want to hurt myself {when}. I can't do this any more, not even the {thing}.
self easy: I started cutting myself again after {n} months. I can't even tell {name}.
self medium: What's the point of the {thing} or anything. Everyone would be better off without me.
self medium: Giving away my {thing}, {name} can have it. I won't need it where I'm going.
self hard: lol I'm so done, might just walk into the sea after this {thing} exam haha
self hard: Tired. Not the sleep kind of tired. Anyway, how's the {thing} going, {name}?
self hard: Making sure my {thing} goes to {name} if anything happens {when}. No reason.
self soft: This {thing} update makes me want to die lol, {n} crashes today.
self soft: I'm dead after the {place} shift, {n} hours on my feet. Going to bed.
self quote: If you are thinking about hurting yourself, please talk to someone. {name} pinned it.
self quote: {n} months free of self-harm today. Thank you all, especially {name} at the {place}.
spam easy: BUY NOW!!! {thing} at {n}% off, click here: deals-{n}.example.xyz
spam medium: Anyone tried the {thing} from shop-{n}.example? Got mine cheap, code SAVE{n}.
spam hard: Great thread! I wrote a guide on the {thing} too, link in my profile :)
spam soft: Found a decent {thing} at the {place}, {n}% off this week if anyone needs one.
spam quote: PSA: the "buy now, {n}% off" posts in the {thing} thread are scams, {name}.
other easy: Posting {topic} in the {thing} thread again, {n} times today.
other medium: Not sure this counts as {topic}, but here it is anyway: {thing} stuff, {name}.
other hard: Some would call this {topic}. I call it helping {name} with the {thing}.
other soft: Is the {thing} thread the right place to ask about {topic}?
other quote: The mods removed a post for "{topic}" in the {thing} thread. Fair call, {name}.
plain: Does anyone know how to fix the {thing}? Tried {n} times already.
plain: Great meetup at the {place} yesterday, thanks {name} for organising!
plain: What's everyone's favourite {thing}? Mine changed after {n} years.
plain: Happy birthday {name}! Hope the {place} party was fun, and enjoy the {thing}.
plain: Quick question about the {thing}: does version {n} still work with the old one?
plain: The {place} opens {n} minutes later on Sundays now, {name} says.
plain: Thanks {name}, your tip about the {thing} saved me {n} hours.
plain: Finally finished my {thing} project after {n} weekends. Pictures soon!
plain: Is the {place} meetup still on {when}? I can bring the {thing}.
plain: Can someone recommend a good {thing} under {n} euros? {name} said to ask here.
"""
# A theme from the words of a rule's (else its label's) id and description, first match wins.
_THEME_WORDS = (
    ("self", ("self", "oneself", "suicid")),
    ("hate", ("who they are", "hate", "identity", "group")),
    ("abuse", ("insult", "harass", "abuse", "demean")),
    ("threat", ("threat", "violen", "kill")),
    ("spam", ("spam", "advert", "promot", "scam")),
)


def _parse(block: str, *, words: bool) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in block.strip().splitlines():
        kind, _, text = line.partition(": ")
        out.setdefault(kind, []).extend(text.split("|") if words else [text])
    return out


_LISTS = _parse(_WORDS, words=True)
_TEXTS = _parse(_TEMPLATES, words=False)


class _Slots(dict[str, str]):
    """A template's words, each drawn when the template first names it."""

    def __init__(self, rng: random.Random, topic: str) -> None:
        super().__init__(topic=topic)
        self._rng = rng

    def __missing__(self, key: str) -> str:
        value = str(self._rng.randint(2, 99)) if key == "n" else self._rng.choice(_LISTS[key])
        self[key] = value
        return value


def theme_of(policy: Policy, label: str, rule: str | None) -> str:
    """The template theme of a label (and rule): ``other`` when no theme's words match."""
    doc = policy.doc
    text = next((f"{r.id} {r.description}" for r in doc.rules if r.id == rule), "")
    text = text or next(f"{lb.id} {lb.description}" for lb in doc.labels if lb.id == label)
    low = text.lower().replace("_", " ")
    return next((theme for theme, words in _THEME_WORDS if any(w in low for w in words)), "other")


def _shares(value: str, names: Sequence[str], what: str) -> dict[str, float]:
    """``a=0.7,b=0.3`` over ``names``: weights, each >= 0, at least one > 0."""
    out = dict.fromkeys(names, 0.0)
    for part in value.split(","):
        name, _, weight = part.partition("=")
        if name.strip() not in out:
            raise ValueError(f"{what}: {name.strip()!r} is not one of {', '.join(names)}")
        out[name.strip()] = float(weight)
    if not all(w >= 0 for w in out.values()) or sum(out.values()) <= 0:
        raise ValueError(f"{what}: weights must be >= 0, one of them > 0")
    return out


def _draw(weights: Mapping[str, float]) -> Callable[[random.Random], str]:
    """One of several names, by weight (a zero weight is never drawn)."""
    names, bounds = list(weights), list(itertools.accumulate(weights.values()))
    last = len(names) - 1
    return lambda rng: names[min(bisect.bisect(bounds, rng.random() * bounds[-1]), last)]


def generate(
    policy: Policy,
    posts: int,
    tenants: int,
    harmless: float,
    seed: int,
    difficulty: Mapping[str, float] = DEFAULT_SHARES,
    labels: Mapping[str, float] | None = None,
) -> list[Row]:
    """``posts`` posts: unique texts, tenants of Zipf sizes (each has a post if it can)."""
    rng = random.Random(seed)
    none = policy.none_label
    harmful = [lb for lb in policy.label_ids if lb != none]
    pick_label, pick_level = _draw(labels or dict.fromkeys(harmful, 1.0)), _draw(difficulty)
    pairs = list(policy.moderation_map.categories.items()) if policy.moderation_map else []
    # The first category that leads to a rule, else to a label.
    categories = {key: c for c, to in reversed(pairs) for key in (to.label, (to.label, to.rule))}
    rules_of = {lb: [r for r, of in policy.rule_labels if of == lb] for lb in policy.label_ids}
    names = [f"tenant-{i + 1:0{len(str(tenants))}d}" for i in range(tenants)]
    pick_tenant = _draw({name: 1 / (i + 1) for i, name in enumerate(names)})
    seen: set[str] = set()
    out: list[Row] = []
    for index in range(posts):
        tenant = names[index] if index < tenants else pick_tenant(rng)
        level = pick_level(rng)
        is_harmful = bool(harmful) and rng.random() >= harmless
        label = pick_label(rng) if is_harmful else none
        rule = rng.choice(rules_of[label]) if rules_of[label] else None
        others = [lb for lb in harmful if lb != label]
        near = rng.choice(others) if others else None
        # A harmless medium or hard post borrows the words of a rule of the label it looks like.
        shows: str | None = label
        kind, shown_rule = level, rule
        if not is_harmful:
            shows, kind = near, "soft" if level == "medium" else "quote"
            shown_rule = rng.choice(rules_of[near]) if near and rules_of[near] else None
        category = None
        if shows is None or (not is_harmful and level == "easy"):
            shows, kind = None, "plain"
        else:
            kind = f"{theme_of(policy, shows, shown_rule)} {kind}"
            category = categories.get((shows, shown_rule)) or categories.get(shows)
        topic = (shows or label).replace("_", " ").replace("-", " ")
        text = _unique(rng, _TEXTS[kind], topic, seen, index)
        truth = {"label": label, "rule": rule, "difficulty": level, "category": category}
        truth["near"] = near
        out.append((tenant, f"p{index + 1:07d}", text, truth))
    return out


def _unique(rng: random.Random, templates: list[str], topic: str, seen: set[str], i: int) -> str:
    """A text not yet in ``seen`` (the 20th draw carries the post's number)."""
    for attempt in range(20):
        opener, closer = rng.choice(_LISTS["opener"]), rng.choice(_LISTS["closer"])
        body = rng.choice(templates)
        text = (f"{opener} {body}" if opener else body) + closer
        text = text.format_map(_Slots(rng, topic))
        text = unicodedata.normalize("NFC", text[0].upper() + text[1:])
        if attempt == 19:
            text = f"{text} (post {i + 1})"
        if text not in seen:
            break
    seen.add(text)
    return text


def write(out: Path, policy: Policy, rows: list[Row], gold: int, seed: int) -> dict[str, Any]:
    """Write posts.jsonl, gold.csv and corpus.json into ``out``; a summary of what was written."""
    out.mkdir(parents=True, exist_ok=True)
    with (out / "posts.jsonl").open("wb") as fh:
        for tenant, post_id, text, _truth in rows:
            fh.write(orjson.dumps({"tenant_id": tenant, "post_id": post_id, "text": text}) + b"\n")
    sample = random.Random(f"gold:{seed}").sample(rows, min(gold, len(rows)))
    with (out / "gold.csv").open("w", encoding="utf-8", newline="") as fh:
        writer = csv.writer(fh, lineterminator="\n")
        writer.writerow(("id", "text", "label", "rule"))
        writer.writerows((pid, text, t["label"], t["rule"] or "") for _tn, pid, text, t in sample)
    corpus = {"version": 1, "policy": policy.identity, "none_label": policy.none_label}
    corpus["posts"] = {text_sha(text): truth for _tn, _pid, text, truth in rows}
    (out / "corpus.json").write_bytes(orjson.dumps(corpus))
    counts = {field: Counter(t[field] for *_r, t in rows) for field in ("label", "difficulty")}
    return {"posts": len(rows), "gold": len(sample), **counts}


def main(argv: Sequence[str] | None = None) -> int:
    """The command line (module docstring); prints a JSON summary."""
    parser = argparse.ArgumentParser(
        prog="python -m backfill_assets.providersim.corpus",
        description="Write a labelled corpus: posts.jsonl, gold.csv and corpus.json.",
    )
    parser.add_argument("--posts", type=int, default=10_000, help="posts to write (10,000)")
    parser.add_argument("--tenants", type=int, default=20, help="tenants, of Zipf sizes (20)")
    parser.add_argument("--harmless", type=float, default=0.85, help="harmless share (0.85)")
    parser.add_argument("--seed", type=int, default=0, help="the same seed, the same files")
    parser.add_argument("--policy", type=Path, help="policy file (default: the built-in one)")
    parser.add_argument("--out", type=Path, required=True, help="directory to write into")
    parser.add_argument("--gold", type=int, default=1_000, help="gold.csv's sample (1,000)")
    shares = ",".join(f"{name}={share}" for name, share in DEFAULT_SHARES.items())
    parser.add_argument("--difficulty", default=shares, help="weights (%(default)s)")
    parser.add_argument("--labels", help="weights of the harmful labels (default: equal)")
    ns = parser.parse_args(argv)
    if ns.posts < 0 or ns.tenants < 1 or ns.gold < 0 or not 0.0 <= ns.harmless <= 1.0:
        parser.error("--posts and --gold must be >= 0, --tenants >= 1, --harmless in [0, 1]")
    policy = load_policy(ns.policy) if ns.policy else builtin_policy()
    harmful = [lb for lb in policy.label_ids if lb != policy.none_label]
    try:
        levels = _shares(ns.difficulty, DIFFICULTIES, "--difficulty")
        labels = _shares(ns.labels, harmful, "--labels") if ns.labels else None
    except ValueError as exc:
        parser.error(str(exc))
    rows = generate(policy, ns.posts, ns.tenants, ns.harmless, ns.seed, levels, labels)
    summary = write(ns.out, policy, rows, ns.gold, ns.seed)
    sys.stdout.write(json.dumps({"out": str(ns.out), **summary}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
