"""Hysteresis: the detectors' candidates, evaluated once per analysis tick, open a
finding only after holding for ``sustain`` consecutive evaluations, refresh it while
they hold, and resolve it after ``clear_after`` consecutive clear evaluations, so a
finding does not flap. The streak counters live in the store
(``Store.detector_streaks``): a restarted collector, or a one-shot ``batchscope``
command, continues the count instead of starting over."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from collector.analysis.detect.detectors import DETECTOR_KINDS, Key, detect, evaluated_keys
from collector.analysis.detect.settings import DetectorSettings
from collector.analysis.detect.windows import read_window
from collector.records import Finding
from collector.store import DetectorStreak, Store, StoredFinding


def run_detectors(
    store: Store, settings: DetectorSettings, *, now: float | None = None
) -> list[StoredFinding]:
    """Evaluate every detector on the window ending at ``now`` and apply hysteresis
    against the store; returns the active findings (of every kind) afterwards.

    Per (kind, target, subject), one evaluation:

    * condition holds — the holding streak grows (the clear streak resets); an open
      finding is refreshed (severity, summary, ``window_end``, evidence); without
      one, a finding opens once the streak reaches ``sustain``, its ``window_start``
      the start of the streak's first window;
    * condition clear (the subject was evaluated, no candidate) — the holding streak
      resets; an open finding's clear streak grows and it resolves at ``clear_after``;
    * no data (too few samples, target down) — nothing changes, except that an open
      finding whose ``window_end`` is older than ``stale_after_s`` resolves, and a
      streak not evaluated for that long is forgotten.

    Streaks are kept in the store (``Store.replace_detector_streaks``). Call it once
    per analysis tick; a call less than ``settings.min_gap_s`` after the previous one
    refreshes open findings but does not count as another evaluation.
    """
    now = time.time() if now is None else now
    window = read_window(store, settings, now=now)
    candidates = {(f.kind, f.target, f.subject): f for f in detect(window, settings)}
    evaluated = evaluated_keys(window)
    streaks = {s.key: s for s in store.detector_streaks()}
    active = _active_by_key(store, now)

    evaluation = _Evaluation(store, settings, now)
    kept: list[DetectorStreak] = []
    for key in sorted(set(candidates) | set(streaks) | set(active)):
        current = streaks.get(key) or DetectorStreak(*key)
        finding = active.get(key)
        candidate = candidates.get(key)
        streak: DetectorStreak | None
        if candidate is not None:
            streak = evaluation.holds(current, finding, candidate)
        elif key in evaluated:
            streak = evaluation.clear(current, finding)
        else:
            streak = evaluation.no_data(current, finding)
        if streak is not None and (streak.holding > 0 or finding is not None):
            kept.append(streak)
    store.replace_detector_streaks(kept)
    return store.active_findings()


@dataclass(frozen=True)
class _Evaluation:
    """One evaluation tick: the store it writes findings to, the settings and the time.
    Each method takes one key's streak and open finding and returns its next streak."""

    store: Store
    settings: DetectorSettings
    now: float

    def counts(self, streak: DetectorStreak) -> bool:
        """Whether this evaluation advances a streak (see ``DetectorSettings.min_gap_s``)."""
        return self.now - streak.evaluated_at >= self.settings.min_gap_s

    def holds(
        self, streak: DetectorStreak, finding: StoredFinding | None, candidate: Finding
    ) -> DetectorStreak:
        """The condition holds: grow the streak; refresh the open finding, or open one
        once the streak is long enough."""
        if self.counts(streak):
            streak = replace(
                streak,
                holding=streak.holding + 1,
                clearing=0,
                since=streak.since if streak.holding > 0 else candidate.window_start,
                evaluated_at=self.now,
            )
        if finding is not None:
            self.store.update_finding(
                finding.id,
                severity=candidate.severity,
                summary=candidate.summary,
                window_end=candidate.window_end,
                evidence=candidate.evidence,
            )
        elif streak.holding >= self.settings.sustain:
            self.store.add_finding(
                kind=candidate.kind,
                severity=candidate.severity,
                target=candidate.target,
                subject=candidate.subject,
                summary=candidate.summary,
                window_start=streak.since if streak.since is not None else candidate.window_start,
                window_end=candidate.window_end,
                evidence=candidate.evidence,
                created_at=self.now,
            )
        return streak

    def clear(self, streak: DetectorStreak, finding: StoredFinding | None) -> DetectorStreak | None:
        """Evaluated and clear: reset the holding streak, grow an open finding's clear
        streak and resolve it at ``clear_after``; ``None`` once resolved."""
        if self.counts(streak):
            streak = replace(
                streak,
                holding=0,
                clearing=streak.clearing + 1 if finding is not None else 0,
                since=None,
                evaluated_at=self.now,
            )
        if finding is not None and streak.clearing >= self.settings.clear_after:
            self.store.resolve_finding(finding.id, self.now)
            return None
        return streak

    def no_data(
        self, streak: DetectorStreak, finding: StoredFinding | None
    ) -> DetectorStreak | None:
        """Not evaluated this time: nothing changes, but a stale open finding resolves
        and a stale streak is forgotten (``None``)."""
        stale_after_s = self.settings.stale_after_s
        if finding is not None:
            if self.now - finding.window_end > stale_after_s:
                self.store.resolve_finding(finding.id, self.now)
                return None
            return streak
        if self.now - streak.evaluated_at > stale_after_s:
            return None  # a streak whose subject went away
        return streak


def _active_by_key(store: Store, now: float) -> dict[Key, StoredFinding]:
    """Open findings of the detectors' kinds by key. Should a key have two (a crash
    between writes), the oldest stays and the others are resolved."""
    active: dict[Key, StoredFinding] = {}
    for f in store.active_findings():
        if f.kind not in DETECTOR_KINDS:
            continue
        key = (f.kind, f.target, f.subject)
        if key in active:
            store.resolve_finding(f.id, now)
        else:
            active[key] = f
    return active


def detector_job(
    settings: DetectorSettings | None = None,
) -> Callable[[Store, float], list[StoredFinding]]:
    """The detectors as a scheduler analysis (``CollectorService(analyses=[...])``)."""
    chosen = settings or DetectorSettings()

    def run_detectors_job(store: Store, now: float) -> list[StoredFinding]:
        return run_detectors(store, chosen, now=now)

    return run_detectors_job
