"""The increases of one series over a window, from its lean readings
(``Store.counter_series``), in one pass over its sample pairs.

Exactly what ``collector.analysis.rates`` makes of the same samples read as
``ModelSample`` records: ``window_rates`` (``counter_increase`` of every pair, added up
by ``CounterIncrease.total``, the same float operations in the same order) and the
executions per batch size of ``window_batch_stats``; the tests hold the two to equal
results. Here no record is built per pair or per batch size, and each sample's batch
stats are decoded once: over a fleet's window the records cost most of an evaluation.
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from collector.analysis.rates import (
    CORE_COUNTERS,
    PLAUSIBLE_COUNTERS,
    CounterIncrease,
    CounterTrack,
    PairKind,
    batch_size_increases,
    cumulative_increases,
    judge_pair,
)
from collector.records import MODEL_COUNTERS
from collector.store.windows import BATCH_ENTRY, CounterReading

__all__ = ["SeriesIncrease", "series_increase"]

# The counters whose going down is a restart (``rates.metrics_reset``), by position in
# ``CounterReading.counters``.
_CORE_AT = tuple(MODEL_COUNTERS.index(name) for name in CORE_COUNTERS)
_PLAUSIBLE_AT = tuple(MODEL_COUNTERS.index(name) for name in PLAUSIBLE_COUNTERS)
_SIZE = BATCH_ENTRY.batch_size
_COUNT = BATCH_ENTRY.infer_count
_NS_AT = (BATCH_ENTRY.input_ns, BATCH_ENTRY.infer_ns, BATCH_ENTRY.output_ns)
# A stored batch stats entry is read by ``rates.batch_size_increases`` as it is: both
# are ``records.BATCH_STAT_FIGURES``.

_BatchEntries = Sequence[Sequence[int]]


@dataclass(frozen=True)
class SeriesIncrease:
    """A series' summed increases over its window (as ``CounterIncrease.total`` of
    ``counter_increase`` over every pair) and its executions per executed batch size
    (as ``window_batch_stats``; sizes with none are absent)."""

    increase: CounterIncrease
    batch_executions: Mapping[int, int]


def series_increase(readings: Sequence[CounterReading]) -> SeriesIncrease:
    """The increases over every consecutive pair of ``readings`` (oldest first); the
    batch stats over each statistics pair (``rates.stats_pair``: a reading with
    statistics and the last one with them before it)."""
    seconds = 0.0
    sums = [0.0] * len(MODEL_COUNTERS)
    failures: dict[str, float] = {}
    batch_ns: float | None = None
    batch_seconds = 0.0
    executions: dict[int, int] = {}
    resets = 0
    # The last reading with statistics (its decoded batch stats), and whether a restart
    # or a break came since it: ``rates.stats_pair``'s track.
    base: CounterReading | None = None
    base_entries: _BatchEntries = ()
    restarted = broken = False
    if readings and readings[0].stats_counts is not None:
        base, base_entries = readings[0], readings[0].batch_stats()
    track = CounterTrack()
    for prev, cur in zip(readings, readings[1:], strict=False):
        pc, cc = prev.counters, cur.counters
        kind = judge_pair(
            track,
            [pc[i] for i in _PLAUSIBLE_AT],
            [cc[i] for i in _PLAUSIBLE_AT],
            seconds=cur.collected_at - prev.collected_at,
            down=any(cc[i] < pc[i] for i in _CORE_AT),
        )
        seconds += max(cur.collected_at - prev.collected_at, 0.0)
        if prev.stats_counts is not None:
            restarted = broken = False  # prev is the base
        restarted = restarted or kind is PairKind.RESTART
        broken = broken or kind is PairKind.BREAK
        pair_base: CounterReading | None = None
        pair_entries: _BatchEntries = ()
        cur_entries: _BatchEntries = ()
        from_zero = reloaded = False
        if cur.stats_counts is not None:
            cur_entries = cur.batch_stats()
            if base is not None and not broken:
                ps, cs = base.stats_counts, cur.stats_counts
                assert ps is not None
                reloaded = cs[0] < ps[0] or cs[1] < ps[1]
                pair_base, pair_entries, from_zero = base, base_entries, restarted or reloaded
            base, base_entries, restarted, broken = cur, cur_entries, False, False
        if kind is PairKind.BREAK:
            # Another source's counters: a new baseline that adds nothing.
            for reason in cur.failure_by_reason:
                failures.setdefault(reason, 0.0)
            resets += 1
            if cur.stats_counts is not None:
                batch_ns = (batch_ns or 0.0) + 0.0
            continue
        reset = kind is PairKind.RESTART
        sums = list(map(operator.add, sums, cumulative_increases(pc, cc, reset=reset)))
        _add_failures(failures, prev.failure_by_reason, cur.failure_by_reason, reset)
        if reset or reloaded:
            resets += 1
        if pair_base is not None:
            ns = _add_batches(executions, () if from_zero else pair_entries, cur_entries)
            batch_ns = (batch_ns or 0.0) + float(ns)
            batch_seconds += max(cur.collected_at - pair_base.collected_at, 0.0)
        elif cur.stats_counts is not None:
            batch_ns = (batch_ns or 0.0) + 0.0  # the series' first statistics: a baseline
    increase = CounterIncrease(
        seconds=seconds,
        counters=dict(zip(MODEL_COUNTERS, sums, strict=True)),
        failure_by_reason=failures,
        batch_compute_ns=batch_ns,
        batch_seconds=batch_seconds,
        resets=resets,
    )
    return SeriesIncrease(increase, dict(sorted(executions.items())))


def _add_failures(
    totals: dict[str, float],
    prev: Mapping[str, float],
    cur: Mapping[str, float],
    reset: bool,
) -> None:
    """Add one pair's failure increases by reason (``rates.counter_increase``)."""
    if not reset and cur == prev:
        # Nothing failed since (the usual case): each reason adds exactly 0.0.
        for reason in cur:
            totals.setdefault(reason, 0.0)
        return
    before = [prev.get(reason, 0.0) for reason in cur]
    for reason, increase in zip(
        cur, cumulative_increases(before, cur.values(), reset=reset), strict=True
    ):
        totals[reason] = totals.get(reason, 0.0) + increase


def _add_batches(executions: dict[int, int], prev: _BatchEntries, cur: _BatchEntries) -> int:
    """Add one pair's executions per batch size to ``executions`` (as
    ``rates.batch_stats_increase``) and return its batch compute time in ns (as
    ``rates.counter_increase``'s), by ``rates.batch_size_increases``."""
    before = {entry[_SIZE]: entry for entry in prev}  # a repeated size: its last, as in rates
    input_at, infer_at, output_at = _NS_AT
    total_ns = 0
    for increase in batch_size_increases(before, cur):
        size = increase[_SIZE]
        executions[size] = executions.get(size, 0) + increase[_COUNT]
        total_ns += increase[input_at] + increase[infer_at] + increase[output_at]
    return total_ns
