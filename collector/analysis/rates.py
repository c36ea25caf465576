"""Per-window rates from cumulative counters.

Triton's counters only grow while a model stays loaded. When Triton restarts or a
model is reloaded they start again from zero; a sample pair in which any of the core
counters went down is a *reset*: the later sample's values are what accrued since the
restart, so they are the increase for that pair (Prometheus's ``increase()`` makes
the same assumption). But counters also fall part-way when one address reaches
another long-running server (a load balancer, a DNS name that moves): the new values
then are that server's whole history, not what accrued since the last scrape. So a
drop counts as a restart only when the new values are plausible for the time elapsed
(``judge_pair``): each of the ``PLAUSIBLE_COUNTERS`` at most ``RESTART_FACTOR`` times
what the series' last counted rate accrues over the pair, plus ``RESTART_FLOOR``.
Otherwise the pair is a *break*: the later sample is a new baseline and the pair adds
nothing. A rise is a break too when it passes ``SURGE_FACTOR`` times the last counted
rate after a counted pair (a move to a server that has counted longer), or when it
returns to the source left at the last break. No rate can then be negative, and none
spikes.

Window rates are ratios of summed increases (Σ Δqueue / Σ Δsuccess), never averages
of per-pair ratios, so a quiet pair does not weigh as much as a busy one.

This is the one module that turns counters into increases, increases into rates, and
merges rates: over consecutive windows of one series (``merge_over_time``: rollups,
chart buckets) and across series over one window (``merge_over_series``: the versions
of a model). A merge turns each part back into its increases (``increase_from_rates``)
and divides their sums again, so a merged rate is the rate over the whole, exactly.
"""

from __future__ import annotations

import enum
import itertools
import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import Any

from collector.records import (
    BATCH_STAT_FIGURES,
    MODEL_COUNTERS,
    BatchStat,
    Duration,
    ModelPeaks,
    ModelRates,
    ModelSample,
    build_record,
)
from collector.sources.triton_metrics import REQUEST_SUMMARY

__all__ = [
    "BATCH_FIGURES",
    "CORE_COUNTERS",
    "PLAUSIBLE_COUNTERS",
    "RESTART_FACTOR",
    "RESTART_FLOOR",
    "SURGE_FACTOR",
    "CounterIncrease",
    "CounterTrack",
    "PairKind",
    "batch_size_increases",
    "batch_stats_increase",
    "bucket_rates",
    "counter_increase",
    "cumulative_increases",
    "gauge_max",
    "gauge_mean",
    "increase_from_rates",
    "is_reset",
    "judge_pair",
    "merge_over_series",
    "merge_over_time",
    "metrics_reset",
    "peak_rates",
    "rates_between",
    "rates_from_increase",
    "request_p95_us",
    "sample_pair_kind",
    "stats_pair",
    "stats_reset",
    "StatsPair",
    "sum_batch_stats",
    "window_batch_stats",
    "window_rates",
]


@dataclass
class CounterIncrease:
    """Summed increases of every counter over one or more sample pairs, under the names
    of the counters themselves: ``counters`` by the ``ModelMetrics`` field of each
    (``MODEL_COUNTERS``), ``failure_by_reason`` those of its failures by reason."""

    seconds: float = 0.0
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(MODEL_COUNTERS, 0.0))
    failure_by_reason: dict[str, float] = field(default_factory=dict)
    batch_compute_ns: float | None = None  # from statistics-API batch_stats, when present
    # The seconds ``batch_compute_ns`` accrued over: from each statistics pair's first
    # sample to its second, which need not be consecutive samples (``stats_pair``).
    batch_seconds: float = 0.0
    # Busy seconds per model instance, and the seconds they were measured over: what a
    # busy share turns back into (``increase_from_rates``) when the batch times and the
    # instance count behind it are gone.
    busy_instance_s: float | None = None
    busy_window_s: float = 0.0
    resets: int = 0

    @classmethod
    def total(cls, parts: Iterable[CounterIncrease]) -> CounterIncrease:
        """The increases of ``parts`` added up (their windows too)."""
        out = cls()
        sums, failures = out.counters, out.failure_by_reason
        for part in parts:
            out.seconds += part.seconds
            for name, value in part.counters.items():
                sums[name] += value
            for reason, value in part.failure_by_reason.items():
                failures[reason] = failures.get(reason, 0.0) + value
            if part.batch_compute_ns is not None:
                out.batch_compute_ns = (out.batch_compute_ns or 0.0) + part.batch_compute_ns
                out.batch_seconds += part.batch_seconds
            if part.busy_instance_s is not None:
                out.busy_instance_s = (out.busy_instance_s or 0.0) + part.busy_instance_s
                out.busy_window_s += part.busy_window_s
            out.resets += part.resets
        return out


# Each per-second rate and the counter it is the increase per second of.
_PER_SECOND = {
    "requests_per_s": "request_success",
    "inferences_per_s": "inference_count",
    "executions_per_s": "exec_count",
}
# Each per-request time and the duration counter it is the increase per request of.
_PER_REQUEST = {
    "queue_us_per_request": "queue_duration_us",
    "compute_input_us_per_request": "compute_input_duration_us",
    "compute_infer_us_per_request": "compute_infer_duration_us",
    "compute_output_us_per_request": "compute_output_duration_us",
    "request_us_per_request": "request_duration_us",
}
_PER_SECOND_PAIRS = tuple(_PER_SECOND.items())
_PER_REQUEST_PAIRS = tuple(_PER_REQUEST.items())

#: The ``ModelMetrics`` counters whose going down means Triton restarted
#: (``metrics_reset``).
CORE_COUNTERS = (
    "request_success",
    "inference_count",
    "exec_count",
    "request_duration_us",
    "queue_duration_us",
    "compute_infer_duration_us",
)


_core_counters = operator.attrgetter(*CORE_COUNTERS)
_model_counters = operator.attrgetter(*MODEL_COUNTERS)

#: The counters whose new values, after a drop, must be plausible for the time elapsed
#: for the drop to count as a restart (the time counters follow them).
PLAUSIBLE_COUNTERS = ("request_success", "inference_count", "exec_count")
#: How many times the last counted rate a counter may accrue over a pair after a drop.
RESTART_FACTOR = 4.0
#: What any counter may accrue over a pair after a drop whatever its last rate (an idle
#: model that restarts and takes a burst).
RESTART_FLOOR = 1000.0
#: How many times the last counted rate a rise may reach and still be the load's: a
#: surge is counted, a move to a server that counted for longer (minutes or hours of
#: its load at once) is not.
SURGE_FACTOR = 100.0
_plausible_counters = operator.attrgetter(*PLAUSIBLE_COUNTERS)


class PairKind(enum.Enum):
    """What a sample pair of one series is (``judge_pair``)."""

    COUNTED = "counted"  # the counters grew: the increase is their difference
    RESTART = "restart"  # they went down to values that accrued since a restart
    BREAK = "break"  # they moved to another source's: a new baseline, no increase


@dataclass
class CounterTrack:
    """What ``judge_pair`` remembers of one series from one pair to the next."""

    # Per second, of ``PLAUSIBLE_COUNTERS``, over the last pair that was not a break.
    per_s: tuple[float, ...] | None = None
    # ``PLAUSIBLE_COUNTERS`` of the sample before the last break: the source left.
    left: tuple[float, ...] | None = None
    # Whether the last pair judged was counted (neither a restart nor a break).
    steady: bool = False
    # The last sample with statistics (``stats_pair``), and whether a restart or a break
    # came in the pairs judged since it.
    stats_base: ModelSample | None = None
    stats_restarted: bool = False
    stats_broken: bool = False


def judge_pair(
    track: CounterTrack,
    before: Sequence[float],
    now: Sequence[float],
    *,
    seconds: float,
    down: bool,
) -> PairKind:
    """Judge a pair of one series from its ``PLAUSIBLE_COUNTERS`` (``before``, ``now``),
    the seconds between them and whether a core counter went ``down``, and update
    ``track`` (the series' pairs are judged in order with the same one).

    A drop is a restart when each counter's new value is at most ``RESTART_FACTOR``
    times what its last counted rate accrues over ``seconds``, plus ``RESTART_FLOOR``
    (the floor alone while no rate is known); otherwise a break. A rise is a break when
    it passes ``SURGE_FACTOR`` times the last counted rate (plus the floor) and the pair
    before was counted (its rate is the load's, not that of a part of a pair, as across
    a restart or break), or when it passes the restart bound and reaches the values of
    the source left at the last break. A break keeps the last counted rate."""
    rates = track.per_s
    span = max(seconds, 0.0)

    def restart_bound() -> list[float]:
        if rates is None:
            return [RESTART_FLOOR] * len(now)
        return [RESTART_FACTOR * r * span + RESTART_FLOOR for r in rates]

    if down:
        kind = PairKind.RESTART if all(map(operator.le, now, restart_bound())) else PairKind.BREAK
        accrued: Sequence[float] = now
    else:
        accrued = list(map(operator.sub, now, before))
        left = track.left
        back = (
            left is not None
            and all(map(operator.ge, now, left))
            and any(map(operator.gt, accrued, restart_bound()))
        )
        moved = (
            rates is not None
            and track.steady
            and any(
                map(operator.gt, accrued, [SURGE_FACTOR * r * span + RESTART_FLOOR for r in rates])
            )
        )
        kind = PairKind.BREAK if back or moved else PairKind.COUNTED
    track.steady = kind is PairKind.COUNTED
    if kind is PairKind.BREAK:
        # Left by a drop, a source that counted longer: a rise to it is a move back. Left
        # by a rise, one that counted less: a move back to it is a drop.
        track.left = tuple(before) if down else None
    elif span > 0:
        track.per_s = tuple([max(a, 0.0) / span for a in accrued])
    return kind


def sample_pair_kind(track: CounterTrack, prev: ModelSample, cur: ModelSample) -> PairKind:
    """``judge_pair`` of two ``ModelSample`` records."""
    return judge_pair(
        track,
        _plausible_counters(prev.metrics),
        _plausible_counters(cur.metrics),
        seconds=cur.collected_at - prev.collected_at,
        down=metrics_reset(prev, cur),
    )


def metrics_reset(prev: ModelSample, cur: ModelSample) -> bool:
    """True when a core counter of the metrics endpoint went down (Triton restarted)."""
    return any(map(operator.lt, _core_counters(cur.metrics), _core_counters(prev.metrics)))


def stats_reset(prev: ModelSample, cur: ModelSample) -> bool:
    """True when the statistics API's counters went down. A model reload restarts them
    while the metrics endpoint's counters of the same model may keep counting, so the
    two sources are segmented separately."""
    if prev.stats is None or cur.stats is None:
        return False
    return (
        cur.stats.execution_count < prev.stats.execution_count
        or cur.stats.inference_count < prev.stats.inference_count
    )


def is_reset(prev: ModelSample, cur: ModelSample) -> bool:
    """True when the pair straddles a restart or reload (a core counter went down)."""
    return metrics_reset(prev, cur) or stats_reset(prev, cur)


def cumulative_increases(
    before: Iterable[float], now: Iterable[float], *, reset: bool
) -> list[float]:
    """The increase of each cumulative counter between two readings of them (in the
    same order). Across a reset, and for a lone counter that went down, it is the new
    value: what accrued since the counter started again."""
    if reset:
        return list(now)
    return [n if n < b else n - b for b, n in zip(before, now, strict=True)]


#: A batch size's cumulative figures as plain numbers (``batch_size_increases``).
BATCH_FIGURES = BATCH_STAT_FIGURES
_EXECUTIONS_AT = BATCH_FIGURES.index("compute_infer.count")
_NS_AT = tuple(BATCH_FIGURES.index(f"compute_{d}.ns") for d in ("input", "infer", "output"))
_batch_figures = operator.attrgetter("figures")  # ``BATCH_FIGURES``, read once per record


def batch_size_increases(
    before: Mapping[int, Sequence[int]], now: Iterable[Sequence[int]]
) -> list[Sequence[int]]:
    """The increase at each batch size between two cumulative readings of a model's
    batch stats, each size's figures as plain numbers (``BATCH_FIGURES``); ``before``
    holds them by batch size, ``now`` in its order. A size that executed nothing new
    is left out; a new size, or one whose executions went down (a reload), counts from
    zero (its figures ``now``); any other has the increase of each figure, none below
    zero."""
    out = []
    for figures in now:
        executions = figures[_EXECUTIONS_AT]
        previous = before.get(figures[0])
        if previous is None or executions < previous[_EXECUTIONS_AT]:
            if executions > 0:
                out.append(figures)
        elif executions > previous[_EXECUTIONS_AT]:
            increase = list(map(operator.sub, figures, previous))
            if min(increase) < 0:
                increase = [d if d > 0 else 0 for d in increase]
            increase[0] = figures[0]  # the batch size
            out.append(increase)
    return out


def batch_stats_increase(
    prev: Sequence[BatchStat] | None, cur: Sequence[BatchStat], *, reset: bool = False
) -> tuple[BatchStat, ...]:
    """Executions and time per executed batch size between two cumulative readings;
    sizes with no new execution are left out."""
    before = {b.batch_size: _batch_figures(b) for b in (prev or ())} if not reset else {}
    out: list[BatchStat] = []
    for increase in batch_size_increases(before, map(_batch_figures, cur)):
        size, input_n, input_ns, infer_n, infer_ns, output_n, output_ns = increase
        out.append(
            BatchStat(
                batch_size=size,
                compute_input=Duration(input_n, input_ns),
                compute_infer=Duration(infer_n, infer_ns),
                compute_output=Duration(output_n, output_ns),
            )
        )
    return tuple(sorted(out, key=lambda s: s.batch_size))


def sum_batch_stats(parts: Iterable[Sequence[BatchStat]]) -> tuple[BatchStat, ...]:
    """Increases per executed batch size added up, size by size."""
    totals: dict[int, BatchStat] = {}
    for part in parts:
        for b in part:
            t = totals.get(b.batch_size)
            totals[b.batch_size] = (
                b
                if t is None
                else BatchStat(
                    batch_size=b.batch_size,
                    compute_input=_duration_sum(t.compute_input, b.compute_input),
                    compute_infer=_duration_sum(t.compute_infer, b.compute_infer),
                    compute_output=_duration_sum(t.compute_output, b.compute_output),
                )
            )
    return tuple(totals[size] for size in sorted(totals))


def window_batch_stats(
    samples: Sequence[ModelSample], *, since: float | None = None
) -> tuple[BatchStat, ...]:
    """Executions and time per executed batch size over a window of one series: the
    ``batch_stats`` increases of every statistics pair (``stats_pair``) ending at or
    after ``since``, summed per size. A pair across a restart or reload counts from
    zero, as ``counter_increase`` does; one across a break adds nothing."""
    track = CounterTrack()
    parts = []
    for prev, cur in zip(samples, samples[1:], strict=False):
        pair = stats_pair(track, prev, cur, sample_pair_kind(track, prev, cur))
        if pair is None or (since is not None and cur.collected_at < since):
            continue
        assert pair.base.stats is not None and cur.stats is not None
        parts.append(
            batch_stats_increase(
                pair.base.stats.batch_stats, cur.stats.batch_stats, reset=pair.from_zero
            )
        )
    return sum_batch_stats(parts)


@dataclass(frozen=True)
class StatsPair:
    """A sample's statistics paired with those of ``base``, the series' last sample with
    statistics before it; ``from_zero`` when a restart or reload came between, so the
    second sample's batch stats count from zero; ``reloaded`` when it was the statistics'
    own counters that went down (a model reload)."""

    base: ModelSample
    from_zero: bool
    reloaded: bool


def stats_pair(
    track: CounterTrack, prev: ModelSample, cur: ModelSample, kind: PairKind
) -> StatsPair | None:
    """The statistics pair that ``cur`` ends, given the consecutive pair ``prev``,
    ``cur`` judged ``kind``; ``track`` (the series') carries the last sample with
    statistics across samples without them, as when the statistics API is read less
    often than the metrics. ``None`` when ``cur`` has no statistics, when none came
    before it, and across a break (another source's counters: a new baseline)."""
    base: ModelSample | None
    if prev.stats is not None:
        base, restarted, broken = prev, False, False
    else:
        base, restarted, broken = track.stats_base, track.stats_restarted, track.stats_broken
    restarted = restarted or kind is PairKind.RESTART
    broken = broken or kind is PairKind.BREAK
    if cur.stats is None:
        track.stats_base, track.stats_restarted, track.stats_broken = base, restarted, broken
        return None
    track.stats_base, track.stats_restarted, track.stats_broken = cur, False, False
    if base is None or broken:
        return None
    reloaded = stats_reset(base, cur)
    return StatsPair(base, restarted or reloaded, reloaded)


def _duration_sum(a: Duration, b: Duration) -> Duration:
    return Duration(count=a.count + b.count, ns=a.ns + b.ns)


def counter_increase(
    prev: ModelSample, cur: ModelSample, track: CounterTrack | None = None
) -> CounterIncrease:
    """Increases between two consecutive samples of the same series. ``track`` carries
    the series' last counted rate from pair to pair (``judge_pair``) and its last sample
    with statistics (``stats_pair``); without one, a drop counts as a restart only up to
    ``RESTART_FLOOR``, and the batch compute time is that since ``prev``. A break adds
    nothing."""
    track = track if track is not None else CounterTrack()
    kind = sample_pair_kind(track, prev, cur)
    pair = stats_pair(track, prev, cur, kind)
    seconds = max(cur.collected_at - prev.collected_at, 0.0)
    if kind is PairKind.BREAK:
        return CounterIncrease(
            seconds=seconds,
            failure_by_reason=dict.fromkeys(cur.metrics.request_failure_by_reason, 0.0),
            batch_compute_ns=0.0 if cur.stats is not None else None,
            resets=1,
        )
    reset = kind is PairKind.RESTART
    p, c = prev.metrics, cur.metrics
    reasons, failed_before = c.request_failure_by_reason, p.request_failure_by_reason
    # The counts before by reason, looked up in C: a reason new since is at 0.
    before = map(failed_before.get, reasons, itertools.repeat(0.0))
    failures = dict(
        zip(reasons, cumulative_increases(before, reasons.values(), reset=reset), strict=True)
    )
    increases = dict(
        zip(
            MODEL_COUNTERS,
            cumulative_increases(_model_counters(p), _model_counters(c), reset=reset),
            strict=True,
        )
    )
    batch_ns: float | None = None
    batch_seconds = 0.0
    if pair is not None:
        assert pair.base.stats is not None and cur.stats is not None
        batch_ns = float(
            _batch_compute_ns_increase(
                () if pair.from_zero else pair.base.stats.batch_stats, cur.stats.batch_stats
            )
        )
        batch_seconds = max(cur.collected_at - pair.base.collected_at, 0.0)
    elif cur.stats is not None:
        batch_ns = 0.0  # the first statistics of the series: a baseline, over no time
    reloaded = pair is not None and pair.reloaded
    return CounterIncrease(
        seconds=seconds,
        counters=increases,
        failure_by_reason=failures,
        batch_compute_ns=batch_ns,
        batch_seconds=batch_seconds,
        resets=1 if reset or reloaded else 0,
    )


def _batch_compute_ns_increase(prev: Sequence[BatchStat], cur: Sequence[BatchStat]) -> int:
    """The summed compute time of ``batch_stats_increase(prev, cur)``, without making
    its records: this runs for every series at every scrape."""
    records = {b.batch_size: b for b in prev}
    # A record the parser kept (the same object) did not change: left out unread.
    changed = [b for b in cur if records.get(b.batch_size) is not b]
    before = {
        b.batch_size: _batch_figures(records[b.batch_size])
        for b in changed
        if b.batch_size in records
    }
    input_at, infer_at, output_at = _NS_AT
    total = 0
    for increase in batch_size_increases(before, map(_batch_figures, changed)):
        total += increase[input_at] + increase[infer_at] + increase[output_at]
    return total


def _ratio(numerator: float, denominator: float) -> float | None:
    return numerator / denominator if denominator > 0 else None


def rates_from_increase(inc: CounterIncrease, *, instance_count: int | None) -> ModelRates:
    window = inc.seconds
    c, failures = inc.counters, inc.failure_by_reason
    busy = None
    if inc.batch_compute_ns is not None and instance_count and inc.batch_seconds > 0:
        busy = inc.batch_compute_ns / (inc.batch_seconds * 1e9 * instance_count)
    elif inc.busy_instance_s is not None and inc.busy_window_s > 0:
        busy = inc.busy_instance_s / inc.busy_window_s
    requests = c["request_success"]
    # Every field of ``ModelRates``, so ``build_record`` fills the record directly: this
    # runs for every series at every scrape.
    values: dict[str, Any] = {"window_s": window}
    if window > 0:
        for rate, counter in _PER_SECOND_PAIRS:
            values[rate] = c[counter] / window
        values["fail_per_s"] = sum(failures.values()) / window
        values["fail_per_s_by_reason"] = {r: v / window for r, v in sorted(failures.items())}
    else:
        for rate, _ in _PER_SECOND_PAIRS:
            values[rate] = 0.0
        values["fail_per_s"] = 0.0
        values["fail_per_s_by_reason"] = dict.fromkeys(sorted(failures), 0.0)
    for rate, counter in _PER_REQUEST_PAIRS:
        values[rate] = c[counter] / requests if requests > 0 else None
    values["avg_batch_size"] = _ratio(c["inference_count"], c["exec_count"])
    values["queue_share"] = _ratio(c["queue_duration_us"], c["request_duration_us"])
    values["busy_share"] = busy
    values["resets"] = inc.resets
    return build_record(ModelRates, values)


def rates_between(
    prev: ModelSample,
    cur: ModelSample,
    *,
    instance_count: int | None = None,
    track: CounterTrack | None = None,
) -> ModelRates:
    """Rates over the window between two consecutive samples of one series; ``track``
    as for ``counter_increase``."""
    return rates_from_increase(counter_increase(prev, cur, track), instance_count=instance_count)


def window_rates(
    samples: Sequence[ModelSample], *, instance_count: int | None = None
) -> ModelRates | None:
    """Rates over a window of samples of one series, oldest first; ``None`` with fewer
    than two samples."""
    if len(samples) < 2:
        return None
    track = CounterTrack()
    total = CounterIncrease.total(
        counter_increase(prev, cur, track) for prev, cur in zip(samples, samples[1:], strict=False)
    )
    return rates_from_increase(total, instance_count=instance_count)


# --------------------------------------------------------------------------- merging rates


def increase_from_rates(r: ModelRates) -> CounterIncrease:
    """The increases behind ``r`` over its window: the inverse of ``rates_from_increase``.

    Per-request figures turn back into durations through the requests, the batch size
    into inferences per execution, and the busy share into busy seconds per instance
    (``busy_instance_s`` over ``busy_window_s``)."""
    window = r.window_s
    requests = r.requests_per_s * window
    increases = {counter: getattr(r, rate) * window for rate, counter in _PER_SECOND.items()}
    for rate, counter in _PER_REQUEST.items():
        per_request = getattr(r, rate)
        increases[counter] = per_request * requests if per_request is not None else 0.0
    return CounterIncrease(
        seconds=window,
        counters=increases,
        failure_by_reason={reason: v * window for reason, v in r.fail_per_s_by_reason.items()},
        busy_instance_s=r.busy_share * window if r.busy_share is not None else None,
        busy_window_s=window if r.busy_share is not None else 0.0,
        resets=r.resets,
    )


def _merged(parts: Iterable[ModelRates], seconds: float) -> ModelRates:
    total = CounterIncrease.total(increase_from_rates(part) for part in parts)
    total.seconds = seconds
    return rates_from_increase(total, instance_count=None)


def merge_over_time(parts: Sequence[ModelRates]) -> ModelRates | None:
    """Rates of one series over the union of consecutive windows ``parts`` (e.g. the
    scrapes in a rollup bucket): summed increases over the summed windows. Each average
    comes out weighted as the whole-window figure: per-second rates and the busy share
    by window length, per-request times by requests, the batch size by executions, the
    queue share by request time. ``None`` for no parts."""
    if not parts:
        return None
    return _merged(parts, sum(p.window_s for p in parts))


def merge_over_series(parts: Sequence[ModelRates]) -> ModelRates | None:
    """Rates of several series over the same window (e.g. the versions of one model):
    per-second rates add, per-request figures are weighted by requests (the batch size
    by executions), the busy share is the mean over the series (each has its own
    instances), the window is the longest. ``None`` for no parts."""
    if not parts:
        return None
    longest = max(p.window_s for p in parts)
    # Each part over the longest window, so its per-second rates add unchanged.
    return _merged([replace(p, window_s=longest) for p in parts], longest)


def peak_rates(parts: Sequence[ModelRates]) -> ModelPeaks | None:
    """The highest of each ``ModelPeaks`` figure over ``parts``; ``None`` for no parts."""
    if not parts:
        return None
    return ModelPeaks(
        **{f.name: gauge_max(getattr(p, f.name) for p in parts) for f in fields(ModelPeaks)}
    )


def bucket_rates(
    samples: Sequence[ModelSample], *, since: float, until: float, bucket_s: float
) -> list[tuple[float, ModelRates]]:
    """Rates per ``bucket_s``-long bucket counted from ``since`` of the samples of ONE
    series (oldest first) with ``since <= collected_at <= until``, merged over time
    from their stored per-scrape rates (samples without rates are left out). Each
    bucket is labelled with the time of its latest sample; empty buckets are absent."""
    if not bucket_s > 0 or not math.isfinite(bucket_s):
        raise ValueError(f"bucket_s must be a positive number, got {bucket_s!r}")
    buckets: dict[int, list[ModelSample]] = {}
    for s in samples:
        if s.rates is not None and since <= s.collected_at <= until:
            buckets.setdefault(int((s.collected_at - since) // bucket_s), []).append(s)
    out: list[tuple[float, ModelRates]] = []
    for k in sorted(buckets):
        merged = merge_over_time([s.rates for s in buckets[k] if s.rates is not None])
        if merged is not None:
            out.append((max(s.collected_at for s in buckets[k]), merged))
    return out


# --------------------------------------------------------------------------- gauges


def gauge_mean(values: Iterable[float | int | None]) -> float | None:
    """Plain mean of the readings of a gauge sampled once per tick (pending requests,
    GPU utilisation), skipping missing ones; ``None`` when none is there."""
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def gauge_max(values: Iterable[float | int | None]) -> float | None:
    """The highest reading, skipping missing ones; ``None`` when none is there."""
    return max((v for v in values if v is not None), default=None)


# --------------------------------------------------------------------------- quantiles


def request_p95_us(sample: ModelSample) -> float | None:
    """The 95th percentile of request time (µs) at ``sample``: Triton's request summary
    (``--metrics-config summary_latencies=true``), whose quantiles cover Triton's own
    sliding window; ``None`` when the server does not publish it."""
    summary = sample.metrics.summary_quantiles_us.get(REQUEST_SUMMARY)
    value = summary.get(0.95) if summary else None
    return value if value is not None and math.isfinite(value) else None
