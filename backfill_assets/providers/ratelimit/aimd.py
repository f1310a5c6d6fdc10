"""Adaptive admission: the share of the configured rate to use, from 429s and latency (pure).

AIMD with memory, in the spirit of TCP CUBIC:

- a 429 cuts the share multiplicatively, once per "epoch": a 429 for a request sent before
  the last cut says nothing about the new rate, so it is ignored (no cascade of cuts from the
  burst of 429s one overload produces);
- the share the refused request was sent at is remembered; the share then recovers quickly
  (exponentially, ``recover_tau_s``) to ``headroom`` of it, and only then probes slowly
  (``probe_per_s``) above, so the job spends its time just under the real limit instead of
  saw-toothing between half of it and all of it;
- latency inflation (a fast log-latency average well above a slow one) means the provider is
  queueing: a mild cut of the share and of the target, at most once per ``latency_epoch_s``.

All times are seconds on the caller's clock; nothing here sleeps or reads a clock.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class AimdConfig:
    """Knobs of the controller (defaults tuned against the provider simulator)."""

    decrease: float = 0.85
    headroom: float = 0.97
    recover_tau_s: float = 3.0
    probe_per_s: float = 0.004
    floor: float = 0.02
    latency_decrease: float = 0.95
    latency_tolerance: float = 2.0
    latency_epoch_s: float = 2.0
    latency_min_samples: int = 50
    latency_alpha_fast: float = 0.05
    latency_alpha_slow: float = 0.005


class AdaptiveRate:
    """The share (``floor``..1) of the configured limit the limiter may use right now."""

    def __init__(self, config: AimdConfig | None = None, now: float = 0.0) -> None:
        self.cfg = config or AimdConfig()
        self._share = 1.0
        self._target = 1.0
        self._stamp = now
        self._epoch_start = -math.inf
        self._latency_cut_at = -math.inf
        self._fast: float | None = None
        self._slow: float | None = None
        self._samples = 0
        self.cuts = 0
        self.latency_cuts = 0

    @property
    def target(self) -> float:
        """The share the controller recovers to before probing."""
        return self._target

    def share(self, now: float) -> float:
        """The share in force at ``now`` (recovery and probing since the last call included)."""
        dt = max(0.0, now - self._stamp)
        self._stamp = max(self._stamp, now)
        if dt == 0.0:
            return self._share
        cfg = self.cfg
        if self._share < self._target:
            gap = (self._target - self._share) * math.exp(-dt / cfg.recover_tau_s)
            # Within 0.5% of the target counts as there; probing takes over from here.
            self._share = self._target if gap < 0.005 * self._target else self._target - gap
        else:
            self._share = min(1.0, self._share * math.exp(cfg.probe_per_s * dt))
        return self._share

    def on_rate_limited(self, sent_share: float, sent_at: float, now: float) -> bool:
        """A 429 for a request sent at ``sent_at`` under ``sent_share``; True if it cut."""
        if sent_at < self._epoch_start:
            return False
        current = self.share(now)
        cfg = self.cfg
        self._target = max(cfg.floor, sent_share * cfg.headroom)
        self._share = max(cfg.floor, min(current, sent_share) * cfg.decrease)
        self._epoch_start = now
        self.cuts += 1
        return True

    def on_latency(self, seconds: float, now: float) -> bool:
        """A completed call's latency; True if latency inflation cut the share."""
        if seconds <= 0.0:
            return False
        sample = math.log(seconds)
        cfg = self.cfg
        self._samples += 1
        if self._fast is None or self._slow is None:
            self._fast = self._slow = sample
        elif self._samples <= cfg.latency_min_samples:
            # Warm-up: both start from the plain mean, so one odd first sample cannot fake
            # an inflation later.
            self._fast += (sample - self._fast) / self._samples
            self._slow = self._fast
        else:
            self._fast += cfg.latency_alpha_fast * (sample - self._fast)
            self._slow += cfg.latency_alpha_slow * (sample - self._slow)
        if self._samples <= cfg.latency_min_samples:
            return False
        inflated = self._fast - self._slow > math.log(cfg.latency_tolerance)
        if not inflated or now - self._latency_cut_at < cfg.latency_epoch_s:
            return False
        # The target moves too: a provider that stays slow keeps the rate down until the slow
        # average has absorbed the new latency, then probing wins the rate back.
        self._share = max(cfg.floor, self.share(now) * cfg.latency_decrease)
        self._target = min(self._target, self._share)
        self._latency_cut_at = now
        self.latency_cuts += 1
        return True
