"""The statistics API read less often than the metrics (``statistics_interval_s``):
samples between two readings have no statistics, and every analysis pairs a reading
with the last one before it (``rates.stats_pair``). Over a window, the batch stats, the
batch compute time and the busy share are then those of the same series read at every
scrape, across restarts and reloads too; the metrics' rates are untouched. The lean
window path (``detect.increases``) is held to the full one in
``test_detect_lean_window``."""

from __future__ import annotations

import math
from dataclasses import replace

from hypothesis import assume, given, settings
from hypothesis import strategies as st

from collector.analysis.rates import (
    CounterIncrease,
    CounterTrack,
    counter_increase,
    metrics_reset,
    rates_between,
    window_batch_stats,
    window_rates,
)
from collector.records import (
    MODEL_COUNTERS,
    BatchStat,
    Duration,
    ModelMetrics,
    ModelSample,
    ModelStats,
)

T0 = 1_700_000_000.0


def _series(steps: list[tuple[int, int, bool, bool]]) -> list[ModelSample]:
    """A series read every second: each step runs ``small`` batches of size 1 and
    ``large`` of size 4; ``restart`` starts every counter again (Triton restarted),
    ``reload`` the statistics' alone (the model reloaded). Before the first step the
    server has run 500 batches of each size."""
    metrics = dict.fromkeys(MODEL_COUNTERS, 1000.0)
    batches = {size: [500, 450_000 * size, 500, 20_000_000 * size, 500, 150_000] for size in (1, 4)}
    executions, inferences = 1000, 2500
    out = []
    for i, (small, large, restart, reload) in enumerate(steps):
        if restart:
            metrics = dict.fromkeys(MODEL_COUNTERS, 0.0)
        if restart or reload:
            batches, executions, inferences = {}, 0, 0
        for size, runs in ((1, small), (4, large)):
            if runs:
                c = batches.setdefault(size, [0] * 6)
                for at, per_run in enumerate((1, 900 * size, 1, 40_000 * size, 1, 300)):
                    c[at] += runs * per_run
        executions += small + large
        inferences += small + 4 * large
        for name in MODEL_COUNTERS:
            metrics[name] += float(small + large)
        out.append(
            ModelSample(
                target="t",
                collected_at=T0 + i,
                metrics=replace(ModelMetrics(model="m", version="1"), **metrics),  # type: ignore[arg-type]
                stats=ModelStats(
                    model="m",
                    version="1",
                    inference_count=inferences,
                    execution_count=executions,
                    batch_stats=tuple(
                        BatchStat(s, Duration(*c[0:2]), Duration(*c[2:4]), Duration(*c[4:6]))
                        for s, c in sorted(batches.items())
                    ),
                ),
            )
        )
    return out


def _read_every(
    samples: list[ModelSample], every: int, steps: list[tuple[int, int, bool, bool]]
) -> list[ModelSample]:
    """``samples`` with the statistics kept on every ``every``-th, on the last, and on
    the one before each restart or reload of ``steps``: what ran between the last
    reading and a restart is in no reading, so it is lost to the batch stats (the
    metrics, read every scrape, keep it)."""
    last = len(samples) - 1
    kept = {i for i in range(len(samples)) if i % every == 0 or i == last}
    kept |= {i - 1 for i, (_, _, restart, reload) in enumerate(steps) if restart or reload}
    return [s if i in kept else replace(s, stats=None) for i, s in enumerate(samples)]


def _no_restart_first(
    steps: list[tuple[int, int, bool, bool]],
) -> list[tuple[int, int, bool, bool]]:
    small, large, _, _ = steps[0]
    return [(small, large, False, False), *steps[1:]]


# Steps with restarts: the metrics are read every scrape, so a restart between two
# readings of the statistics is always seen. A reload restarts the statistics alone:
# one between two readings is seen only when its counters are lower at the second
# (below); one whose counters have grown past the first reading's by then is not.
_steps = st.lists(
    st.tuples(
        st.integers(0, 5),
        st.integers(0, 5),
        st.sampled_from([False] * 12 + [True]),
        st.just(False),
    ),
    min_size=3,
    max_size=40,
).map(_no_restart_first)


@settings(max_examples=200, deadline=None)
@given(_steps, st.integers(2, 7), st.integers(1, 3))
def test_a_window_read_sparsely_has_the_batch_figures_of_one_read_every_scrape(
    steps: list[tuple[int, int, bool, bool]], every: int, instances: int
) -> None:
    dense = _series(steps)
    # A restart whose counters are back at or above the last reading's by the next
    # scrape is seen by neither reading (as with Prometheus's counters).
    assume(all(metrics_reset(dense[i - 1], dense[i]) for i, step in enumerate(steps) if step[2]))
    sparse = _read_every(dense, every, steps)
    assert window_batch_stats(sparse) == window_batch_stats(dense)
    d, s = (
        window_rates(dense, instance_count=instances),
        window_rates(sparse, instance_count=instances),
    )
    assert d is not None and s is not None
    # The metrics' rates do not depend on the statistics.
    assert replace(s, busy_share=None, resets=0) == replace(d, busy_share=None, resets=0)
    # The same compute time over the same span (first to last sample: both have
    # statistics), summed in other steps.
    assert (s.busy_share is None) == (d.busy_share is None)
    if d.busy_share is not None:
        assert s.busy_share is not None and math.isclose(s.busy_share, d.busy_share, rel_tol=1e-9)


def test_each_reading_covers_the_seconds_since_the_one_before() -> None:
    """Per scrape (as ``collect`` stores rates): a scrape without statistics has no busy
    share; one with them has the busy share of the seconds since the last reading."""
    steps = [(2, 1, False, False)] * 11
    dense = _series(steps)
    sparse = _read_every(dense, 5, steps)
    track = CounterTrack()
    busy = [
        rates_between(prev, cur, instance_count=1, track=track).busy_share
        for prev, cur in zip(sparse, sparse[1:], strict=False)
    ]
    assert [b is not None for b in busy] == [False] * 4 + [True] + [False] * 4 + [True]
    steady = rates_between(dense[0], dense[1], instance_count=1).busy_share
    assert steady is not None
    assert all(math.isclose(b, steady) for b in busy if b is not None)
    # Without the series' track, a pair alone knows no earlier reading: no time counted.
    alone = counter_increase(sparse[4], sparse[5])
    assert alone.batch_compute_ns == 0.0 and alone.batch_seconds == 0.0
    assert CounterIncrease.total([alone]).batch_seconds == 0.0


def test_a_reload_between_two_readings_counts_from_zero() -> None:
    """A reload whose statistics are lower at the next reading than at the one before:
    that reading's batch stats count from zero, as when read every scrape (what ran
    between the reading before and the reload is in no reading: ``_read_every`` reads
    the statistics just before it, as the property above does)."""
    steps = [(5, 5, False, False)] * 4 + [(0, 1, False, True)] + [(1, 0, False, False)] * 5
    dense = _series(steps)
    for every in (2, 3, 5):
        sparse = _read_every(dense, every, steps)
        assert window_batch_stats(sparse) == window_batch_stats(dense)
        rates = window_rates(sparse, instance_count=1)
        assert rates is not None and rates.resets == 1
