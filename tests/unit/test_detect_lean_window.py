"""The detectors read model windows through lean readings (``Store.counter_series``,
``detect.increases``): the windows, and so the findings, are exactly those of the full
path (``Store.model_samples`` and ``collector.analysis.rates``), across counter
resets, statistics reloads, samples without statistics, several versions, new batch
sizes, failure reasons and stale targets, on SQLite and PostgreSQL (the ``store``
fixture of ``tests/unit/conftest.py``)."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.analysis.detect import DetectorSettings, read_window, run_detectors
from collector.analysis.detect.increases import series_increase
from collector.analysis.detect.windows import ModelWindow
from collector.analysis.health import is_fresh, scrape_interval_s
from collector.analysis.rates import (
    CORE_COUNTERS,
    CounterIncrease,
    gauge_mean,
    merge_over_series,
    metrics_reset,
    rates_from_increase,
    request_p95_us,
    sum_batch_stats,
    window_batch_stats,
    window_rates,
)
from collector.analysis.status import build_status
from collector.records import (
    MODEL_COUNTERS,
    BatchStat,
    Duration,
    ModelMetrics,
    ModelSample,
    ModelStats,
    TritonSnapshot,
)
from collector.store import Store
from collector.store.sample_rows import batch_stats_values
from collector.store.windows import CounterReading
from collector.synthetic import model_config

T0 = 1_700_000_000.0
SCRAPES = 70
SETTINGS = DetectorSettings(window_s=60.0, sustain=1)


# --------------------------------------------------------------------------- the full path


def _reference_models(
    store: Store, settings: DetectorSettings, now: float
) -> tuple[ModelWindow, ...]:
    """The model windows as read from full ``ModelSample`` records, by the functions of
    ``collector.analysis.rates``."""
    configs = {key: c.config for key, c in store.latest_model_configs().items()}
    targets = {t.name: t for t in store.targets()}
    series: dict[tuple[str, str], dict[str, list[ModelSample]]] = defaultdict(
        lambda: defaultdict(list)
    )
    for s in store.model_samples(since=now - settings.window_s, until=now):
        series[(s.target, s.model)][s.version].append(s)
    out = []
    for (target, model), versions in sorted(series.items()):
        interval = scrape_interval_s(targets.get(target))
        used = {
            v: s
            for v, s in sorted(versions.items())
            if len(s) >= settings.min_samples and is_fresh(s[-1].collected_at, now, interval)
        }
        if not used:
            continue
        config = configs.get((target, model))
        count = max(config.instance_count, 1) if config else None
        rates = merge_over_series(
            [r for s in used.values() if (r := window_rates(s, instance_count=count))]
        )
        assert rates is not None
        executions: dict[int, int] = defaultdict(int)
        for b in sum_batch_stats(window_batch_stats(s) for s in used.values()):
            executions[b.batch_size] += b.exec_count
        pending = [_reference_pending(s) for s in used.values()]
        out.append(
            ModelWindow(
                target=target,
                model=model,
                versions=tuple(used),
                window_start=min(s[0].collected_at for s in used.values()),
                window_end=max(s[-1].collected_at for s in used.values()),
                samples=sum(len(s) for s in used.values()),
                rates=rates,
                config=config,
                instances=count * len(used) if count is not None else None,
                pending_mean=_known_sum(p[0] for p in pending),
                pending_last=_known_sum(p[1] for p in pending),
                pending_slope_per_s=_known_sum(p[2] for p in pending),
                batch_executions=dict(sorted(executions.items())),
            )
        )
    return tuple(out)


def _reference_pending(samples: Sequence[ModelSample]) -> tuple[float | None, ...]:
    points = [
        (s.collected_at, p) for s in samples if (p := s.metrics.pending_request_count) is not None
    ]
    mean = gauge_mean(p for _, p in points)
    if mean is None:
        return None, None, None
    slope = None
    if len(points) >= 2:
        t_mean = sum(t for t, _ in points) / len(points)
        spread = sum((t - t_mean) ** 2 for t, _ in points)
        if spread > 0:
            slope = sum((t - t_mean) * (p - mean) for t, p in points) / spread
    return mean, points[-1][1], slope


def _known_sum(values: Iterator[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


# --------------------------------------------------------------------------- a generated store


class _Series:
    """The cumulative counters of one (target, model, version) as a scrape sees them."""

    def __init__(self, rng: random.Random, model: str, version: str) -> None:
        self.rng, self.model, self.version = rng, model, version
        self.counters = dict.fromkeys(MODEL_COUNTERS, 0.0)
        self.failures: dict[str, float] = {}
        self.exec_count = self.inference_count = 0
        self.batches: dict[int, list[int]] = {}  # size -> BATCH layout counts and ns

    def restart(self) -> None:
        """Triton restarted: every counter starts again."""
        self.counters = dict.fromkeys(MODEL_COUNTERS, 0.0)
        self.failures = {}
        self.reload()

    def reload(self) -> None:
        """The model was reloaded: the statistics start again, the metrics do not."""
        self.exec_count = self.inference_count = 0
        self.batches = {}

    def step(self, sizes: Sequence[int]) -> None:
        rng = self.rng
        for name in MODEL_COUNTERS:
            self.counters[name] += rng.choice((0.0, 1.0, 2.5, rng.randint(1, 400) * 0.25))
        if rng.random() < 0.3:
            reason = rng.choice(("REJECTED", "BACKEND", "CANCELED"))
            self.failures[reason] = self.failures.get(reason, 0.0) + rng.choice((1.0, 0.5))
        for size in sizes:
            runs = rng.choice((0, 0, 1, 3))
            counts = self.batches.setdefault(size, [0, 0, 0, 0, 0, 0])
            counts[0] += runs
            counts[1] += runs * rng.randint(1, 10_000)
            counts[2] += runs
            counts[3] += runs * rng.randint(1, 10**7)
            counts[4] += runs
            counts[5] += runs * rng.randint(0, 10_000)
            self.exec_count += runs
            self.inference_count += runs * size

    def metrics(self, pending: float | None) -> ModelMetrics:
        metrics = ModelMetrics(
            model=self.model,
            version=self.version,
            request_failure_by_reason=dict(self.failures),
            pending_request_count=pending,
            summary_quantiles_us={"nv_inference_request_summary_us": {0.5: 10.0}},
        )
        counters: dict[str, Any] = self.counters
        return replace(metrics, **counters)

    def stats(self) -> ModelStats:
        return ModelStats(
            model=self.model,
            version=self.version,
            inference_count=self.inference_count,
            execution_count=self.exec_count,
            batch_stats=tuple(
                BatchStat(size, Duration(*c[0:2]), Duration(*c[2:4]), Duration(*c[4:6]))
                for size, c in sorted(self.batches.items())
            ),
        )


def _fill(store: Store, seed: int) -> float:
    """Scrapes of three targets: "a" restarts mid-window and its model "m1" has two
    versions, one reloaded; "b" has samples without statistics and a model that has
    none; "gone" stops early. Returns the time of the last scrape."""
    rng = random.Random(seed)
    series = {
        ("a", "m1", "1"): _Series(rng, "m1", "1"),
        ("a", "m1", "2"): _Series(rng, "m1", "2"),
        ("a", "m2", "1"): _Series(rng, "m2", "1"),
        ("b", "m1", "1"): _Series(rng, "m1", "1"),
        ("b", "nostats", "1"): _Series(rng, "nostats", "1"),
        ("gone", "m1", "1"): _Series(rng, "m1", "1"),
    }
    configs = {
        "a": (model_config("m1", batching=True, preferred=(4, 8), delay_us=100, instances=2),),
        "b": (model_config("m1", batching=False),),
        "gone": (),
    }
    at = T0
    for i in range(SCRAPES):
        at = T0 + i + rng.uniform(-0.2, 0.2)
        for target in ("a", "b", "gone"):
            if target == "gone" and i > 40:
                continue
            metrics, stats = [], []
            for (t, model, version), s in series.items():
                if t != target:
                    continue
                if target == "a" and i == 35:
                    s.restart()
                if (t, model, version) == ("a", "m1", "2") and i == 50:
                    s.reload()
                s.step((1, 2, 4, 8) if i > 20 else (1, 4))
                pending = None if rng.random() < 0.2 else float(rng.randint(0, 9))
                metrics.append(s.metrics(pending))
                if model != "nostats" and not (target == "b" and rng.random() < 0.25):
                    stats.append(s.stats())
            store.write_triton(
                TritonSnapshot(
                    target=target,
                    collected_at=at,
                    model_metrics=tuple(metrics),
                    model_stats=tuple(stats),
                    model_configs=configs[target],
                )
            )
            store.record_scrape(
                target, "triton", kind="triton", started_at=at, duration_s=0.01,
                error_kind=None, error=None, interval_s=1.0,
            )  # fmt: skip
    return at


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_lean_windows_are_those_of_the_full_samples(store: Store, seed: int) -> None:
    last = _fill(store, seed)
    for now in (last + 0.5, T0 + 38.0, T0 + 52.0):
        window = read_window(store, SETTINGS, now=now)
        assert window.models == _reference_models(store, SETTINGS, now)
    # The store exercises what it is meant to: resets, versions, sizes, a stale target.
    final = read_window(store, SETTINGS, now=last + 0.5)
    by_key = {(m.target, m.model): m for m in final.models}
    assert ("gone", "m1") not in by_key
    assert by_key[("a", "m1")].versions == ("1", "2") and by_key[("a", "m1")].rates.resets >= 2
    assert set(by_key[("a", "m1")].batch_executions) == {1, 2, 4, 8}
    assert by_key[("b", "nostats")].batch_executions == {}
    assert by_key[("a", "m1")].rates.busy_share is not None
    assert by_key[("a", "m1")].rates.fail_per_s > 0


def test_findings_are_those_of_the_full_samples(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path / 'f.db'}")
    try:
        last = _fill(store, 4)
        # Thresholds that the generated traffic crosses, so that findings are made.
        loose = replace(SETTINGS, queue_share=0.01, queue_share_critical=0.3, concurrency_min=0.01)
        findings = run_detectors(store, loose, now=last + 0.5)
        window = read_window(store, loose, now=last + 0.5)
        assert window.models == _reference_models(store, loose, last + 0.5)
        assert findings
    finally:
        store.close()


def test_counter_series_holds_the_samples_of_model_samples(store: Store) -> None:
    last = _fill(store, 5)
    since, until = T0 + 10.0, last
    full: dict[tuple[str, str, str], list[ModelSample]] = defaultdict(list)
    for s in store.model_samples(since=since, until=until):
        full[(s.target, s.model, s.version)].append(s)
    lean = store.counter_series(since=since, until=until)
    assert [(c.target, c.model, c.version) for c in lean] == sorted(full)
    for series in lean:
        samples = full[(series.target, series.model, series.version)]
        assert len(series.readings) == len(samples)
        for reading, sample in zip(series.readings, samples, strict=True):
            # The document's text is the store's own; what it holds is compared below.
            assert replace(reading, batch_stats_doc=None) == replace(
                _reading(sample), batch_stats_doc=None
            )
            expected = batch_stats_values(sample.stats.batch_stats) if sample.stats else []
            assert [tuple(e) for e in reading.batch_stats()] == expected


# --------------------------------------------------------------------------- one series


def _reading(sample: ModelSample) -> CounterReading:
    """The lean reading of ``sample``, as the store holds it."""
    m, stats = sample.metrics, sample.stats
    return CounterReading(
        collected_at=sample.collected_at,
        counters=tuple(getattr(m, name) for name in MODEL_COUNTERS),
        failure_by_reason=m.request_failure_by_reason,
        pending_request_count=m.pending_request_count,
        stats_counts=(stats.execution_count, stats.inference_count) if stats else None,
        batch_stats_doc=json.dumps(batch_stats_values(stats.batch_stats)) if stats else None,
    )


_durations = st.builds(Duration, st.integers(0, 20), st.integers(0, 10**6))
_stats = st.builds(
    ModelStats,
    model=st.just("m"),
    version=st.just("1"),
    inference_count=st.integers(0, 30),
    execution_count=st.integers(0, 30),
    batch_stats=st.lists(
        st.builds(BatchStat, st.integers(1, 5), _durations, _durations, _durations), max_size=5
    ).map(tuple),
)
_counter = st.sampled_from([0.0, 1.0, 2.5, 7.0, 10.0, 1e6 + 0.25])
_metrics = st.builds(
    ModelMetrics,
    model=st.just("m"),
    version=st.just("1"),
    **{name: _counter for name in MODEL_COUNTERS},
    request_failure_by_reason=st.dictionaries(
        st.sampled_from(["REJECTED", "BACKEND", "OTHER"]), _counter, max_size=3
    ),
)
_samples = st.lists(
    st.tuples(st.floats(0.0, 5.0), _metrics, st.none() | _stats), min_size=2, max_size=10
).map(
    lambda parts: [
        ModelSample(
            target="t", collected_at=T0 + sum(p[0] for p in parts[: i + 1]), metrics=m, stats=s
        )
        for i, (_, m, s) in enumerate(parts)
    ]
)


@settings(max_examples=300, deadline=None)
@given(_samples, st.none() | st.integers(1, 4))
def test_series_increase_gives_the_rates_of_window_rates(
    samples: list[ModelSample], instances: int | None
) -> None:
    readings = [_reading(s) for s in samples]
    increase = series_increase(readings).increase
    assert rates_from_increase(increase, instance_count=instances) == window_rates(
        samples, instance_count=instances
    )
    expected: Mapping[int, int] = {b.batch_size: b.exec_count for b in window_batch_stats(samples)}
    assert series_increase(readings).batch_executions == expected


def test_fewer_than_two_readings_have_no_increase() -> None:
    sample = ModelSample(target="t", collected_at=T0, metrics=ModelMetrics(model="m", version="1"))
    for readings in ([_reading(sample)], []):
        assert series_increase(readings).increase == CounterIncrease()
        assert series_increase(readings).batch_executions == {}


@pytest.mark.parametrize("name", MODEL_COUNTERS)
def test_a_counter_going_down_alone_is_a_restart_as_in_rates(name: str) -> None:
    """The lean path and ``rates.metrics_reset`` take the same counters for a restart:
    those of ``rates.CORE_COUNTERS``."""
    high: dict[str, Any] = {name: 10.0}
    low: dict[str, Any] = {name: 4.0}
    before = replace(ModelMetrics(model="m", version="1"), **high)
    after = replace(before, **low)
    pair = [
        ModelSample(target="t", collected_at=T0 + i, metrics=m)
        for i, m in enumerate((before, after))
    ]
    restarted = metrics_reset(*pair)
    assert restarted == (name in CORE_COUNTERS)
    assert series_increase([_reading(s) for s in pair]).increase.resets == int(restarted)


def _reference_status_models(
    store: Store, window_s: float, now: float
) -> dict[tuple[str, str, str], tuple[Any, ...]]:
    """Each series' newest time, rates, pending gauge and p95 as ``build_status`` read
    them from full ``ModelSample`` records: the 300 s before the window read whole, the
    window's samples (or the last pair, when it holds fewer than two) through
    ``window_rates``."""
    configs = store.latest_model_configs()
    targets = {t.name: t for t in store.targets()}
    series: dict[tuple[str, str, str], list[ModelSample]] = defaultdict(list)
    for s in store.model_samples(since=now - window_s - 300.0, until=now):
        series[(s.target, s.model, s.version)].append(s)
    out: dict[tuple[str, str, str], tuple[Any, ...]] = {}
    for (target, model, version), rows in series.items():
        newest = rows[-1]
        fresh = is_fresh(newest.collected_at, now, scrape_interval_s(targets.get(target)))
        rates = None
        if fresh:
            in_window = [s for s in rows if s.collected_at >= now - window_s]
            if len(in_window) < 2:
                in_window = rows[-2:]
            stored = configs.get((target, model))
            rates = window_rates(
                in_window, instance_count=stored.config.instance_count if stored else None
            )
        out[(target, model, version)] = (
            newest.collected_at,
            rates,
            newest.metrics.pending_request_count if fresh else None,
            request_p95_us(newest) if fresh else None,
        )
    return out


@pytest.mark.parametrize("seed", [6, 7])
def test_status_rates_are_those_of_the_full_samples(store: Store, seed: int) -> None:
    """``build_status`` reads a window's lean readings and each series' newest sample:
    the same rates, gauges and times as from every sample read whole, with windows
    that hold many samples, and with windows too short for a pair (the last pair)."""
    last = _fill(store, seed)
    sparse_seen = 0
    for window_s in (60.0, 1.2):
        for now in (last + 0.5, T0 + 38.0, T0 + 52.0, T0 + 41.5):
            report = build_status(store, window_s=window_s, now=now)
            got = {
                (m.target, m.model, m.version): (
                    m.last_sample_at,
                    m.rates,
                    m.pending_request_count,
                    m.request_p95_us,
                )
                for m in report.models
            }
            assert got == _reference_status_models(store, window_s, now)
            sparse_seen += sum(
                1
                for m in report.models
                if m.rates is not None
                and len(store.model_samples(
                    target=m.target, model=m.model, version=m.version,
                    since=now - window_s, until=now,
                )) < 2
            )  # fmt: skip
    # The last-pair path ran, and the gone target's series is listed without rates.
    assert sparse_seen > 0
    final = {(m.target, m.model): m for m in build_status(store, now=last + 0.5).models}
    assert final[("gone", "m1")].rates is None
    assert final[("a", "m1")].rates is not None
