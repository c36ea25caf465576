"""Detectors on synthetic windows written into a real (SQLite) store, and the
hysteresis that turns per-window candidates into findings that open, refresh and
resolve without flapping."""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from collector.analysis.detect import DetectorSettings, detectors, read_window, run_detectors
from collector.errors import ConfigError
from collector.records import (
    BatchStat,
    DeviceSample,
    Duration,
    Finding,
    ModelConfig,
    ModelMetrics,
    ModelStats,
    ProcessSample,
    TritonSnapshot,
)
from collector.store import Store, StoredFinding

T0 = 1_700_000_040.0
WINDOW = 60.0
STEP = 10.0
STEPS = int(WINDOW / STEP)
SETTINGS = DetectorSettings()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path / 'batchscope.db'}")
    yield s
    s.close()


# --------------------------------------------------------------------------- synthetic traffic


@dataclass(frozen=True)
class Load:
    """What one window of traffic looks like: executions per second at each batch size
    (one item per request, so requests/s = Σ size × rate), time per request, compute
    time per execution, the pending gauge and rejections."""

    batches_per_s: Mapping[int, float] = field(default_factory=lambda: {1: 100.0})
    queue_us: float = 100.0
    compute_us: float = 900.0
    exec_ns: float = 5_000_000.0  # 100 executions/s on one instance: 50 % busy
    pending: float = 0.0
    pending_growth_per_s: float = 0.0
    rejected_per_s: float = 0.0

    @property
    def rps(self) -> float:
        return sum(size * rate for size, rate in self.batches_per_s.items())


def config(
    model: str = "m",
    *,
    dynamic: bool = True,
    max_batch_size: int = 8,
    preferred: tuple[int, ...] = (),
    delay_us: int = 0,
    instances: int = 1,
    platform: str | None = None,
    extra: Mapping[str, object] | None = None,
) -> ModelConfig:
    raw = {"name": model, "max_batch_size": max_batch_size, **(extra or {})}
    return ModelConfig(
        model=model,
        max_batch_size=max_batch_size,
        dynamic_batching=dynamic,
        preferred_batch_sizes=preferred,
        max_queue_delay_us=delay_us,
        instance_count=instances,
        platform=platform,
        raw_json=json.dumps(raw),
    )


class Series:
    """Cumulative counters of one model on one target, written every ``STEP`` s from
    ``T0``; window ``k`` (1-based) is ``[T0 + 60 (k-1), T0 + 60 k]`` and the steps
    ending in it carry ``loads[k-1]``."""

    def __init__(
        self,
        store: Store,
        cfg: ModelConfig,
        *,
        target: str = "triton-a",
        gpus: Sequence[DeviceSample] = (),
        pending: float = 0.0,
    ) -> None:
        self.store, self.cfg, self.target, self.gpus = store, cfg, target, tuple(gpus)
        self.t = T0
        self.success = self.inferences = self.execs = 0.0
        self.request_us = self.queue_us = self.compute_us = self.rejected = 0.0
        self.batches: dict[int, list[float]] = {}
        self.pending = pending
        self._write()

    def run(self, loads: Sequence[Load]) -> None:
        for load in loads:
            start = self.t
            for _ in range(STEPS):
                self.t += STEP
                for size, rate in load.batches_per_s.items():
                    count = rate * STEP
                    entry = self.batches.setdefault(size, [0.0, 0.0])
                    entry[0] += count
                    entry[1] += count * load.exec_ns
                    self.execs += count
                    self.inferences += count * size
                requests = load.rps * STEP
                self.success += requests
                self.request_us += requests * (load.queue_us + load.compute_us)
                self.queue_us += requests * load.queue_us
                self.compute_us += requests * load.compute_us
                self.rejected += load.rejected_per_s * STEP
                self.pending = load.pending + load.pending_growth_per_s * (self.t - start)
                self._write()

    def _write(self) -> None:
        metrics = ModelMetrics(
            model=self.cfg.model,
            version="1",
            request_success=self.success,
            request_failure_by_reason={"REJECTED": self.rejected},
            inference_count=self.inferences,
            exec_count=self.execs,
            request_duration_us=self.request_us,
            queue_duration_us=self.queue_us,
            compute_infer_duration_us=self.compute_us,
            pending_request_count=self.pending,
        )
        stats = ModelStats(
            model=self.cfg.model,
            version="1",
            inference_count=round(self.inferences),
            execution_count=round(self.execs),
            batch_stats=tuple(
                BatchStat(size, compute_infer=Duration(round(n), round(ns)))
                for size, (n, ns) in sorted(self.batches.items())
            ),
        )
        self.store.write_triton(
            TritonSnapshot(
                target=self.target,
                collected_at=self.t,
                model_metrics=(metrics,),
                model_stats=(stats,),
                model_configs=(self.cfg,),
                gpus=self.gpus,
            )
        )


def gpu(util: float | None = None, sm: float | None = None, **changes: object) -> DeviceSample:
    base = DeviceSample(
        source="nvml", uuid="GPU-1", name="NVIDIA H200", utilization_gpu_pct=util, sm_active_pct=sm
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def write_devices(
    store: Store, readings: Sequence[Sequence[DeviceSample]], *, target: str = "host-1"
) -> None:
    """``readings[k-1]`` every ``STEP`` s through window k (and one reading at T0)."""
    store.write_devices(target, T0, readings[0])
    for k, devices in enumerate(readings):
        for i in range(1, STEPS + 1):
            store.write_devices(target, T0 + WINDOW * k + STEP * i, devices)


def now(k: int) -> float:
    """The end of window ``k``."""
    return T0 + WINDOW * k


def candidates(store: Store, k: int, settings: DetectorSettings = SETTINGS) -> list[Finding]:
    return detectors.detect(read_window(store, settings, now=now(k)), settings)


def only(findings: Sequence[Finding], kind: str, subject: str | None = None) -> Finding:
    [finding] = [f for f in findings if f.kind == kind and subject in (None, f.subject)]
    return finding


# --------------------------------------------------------------------------- settings


def test_defaults_are_documented_and_valid() -> None:
    s = DetectorSettings()
    assert (s.window_s, s.min_samples, s.sustain, s.clear_after) == (60.0, 3, 3, 3)
    assert (s.idle_util_pct, s.idle_busy_share, s.queue_share, s.concurrency_min) == (
        30.0,
        0.3,
        0.5,
        1.5,
    )
    doc = DetectorSettings.__doc__ or ""
    for name in DetectorSettings.__dataclass_fields__:
        assert f"``{name}``" in doc, name


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("window_s", 0),
        ("window_s", float("nan")),
        ("min_samples", 1),
        ("min_samples", 2.5),
        ("sustain", 0),
        ("sustain", True),
        ("clear_after", -1),
        ("idle_util_pct", 120.0),
        ("idle_busy_share", 0.0),
        ("queue_share", 1.5),
        ("queue_share_critical", 0.4),  # below queue_share
        ("reject_per_s", -0.1),
        ("traffic_rps", "fast"),
        ("concurrency_min", 0),
        ("below_preferred_ratio", 2.0),
        ("stale_after_s", float("inf")),
    ],
)
def test_bad_setting_names_its_field(name: str, value: object) -> None:
    with pytest.raises(ConfigError) as caught:
        DetectorSettings(**{name: value})  # type: ignore[arg-type]
    assert caught.value.field == f"analysis.{name}"


# --------------------------------------------------------------------------- idle capacity


def test_gpu_at_20_pct_sm_activity_is_idle_with_0_8_gpu_free(store: Store) -> None:
    # NVML's SM activity wins over "a kernel was running" (utilization_gpu_pct).
    write_devices(store, [[gpu(util=65.0, sm=20.0)]])
    finding = only(candidates(store, 1), detectors.IDLE_CAPACITY)
    assert (finding.target, finding.subject, finding.severity) == ("host-1", "GPU-1", "info")
    ev = finding.evidence
    assert ev["metric"] == "sm_active_pct"
    assert ev["utilization_pct"] == pytest.approx(20.0)
    assert ev["idle_devices"] == pytest.approx(0.8)
    assert ev["traffic_rps"] is None  # no process listing: unknown
    assert ev["samples"] == 7
    assert "0.80 GPU idle" in finding.summary


def test_busy_gpu_and_sparse_readings_open_nothing(store: Store) -> None:
    write_devices(store, [[gpu(sm=45.0), gpu(sm=5.0, uuid="GPU-2")]])
    found = candidates(store, 1)
    assert [f.subject for f in found] == ["GPU-2"]
    # Fewer readings than min_samples: not evaluated at all (neither idle nor clear).
    window = read_window(store, DetectorSettings(min_samples=20), now=now(1))
    assert window.devices == ()
    assert (detectors.IDLE_CAPACITY, "host-1", "GPU-1") in detectors.evaluated_keys(
        read_window(store, SETTINGS, now=now(1))
    )


def test_idle_gpu_with_traffic_joins_processes_to_the_triton_target(store: Store) -> None:
    series = Series(store, config(dynamic=False, max_batch_size=1))
    series.run([Load(batches_per_s={1: 50.0})])
    for t in [T0 + STEP * i for i in range(STEPS + 1)]:
        store.write_devices("host-1", t, [gpu(sm=25.0, kind="mig", uuid="MIG-1")])
        store.write_processes(
            "host-1", t, [ProcessSample(source="nvml", pid=77, role="gpu", gpu_uuid="MIG-1")]
        )
        store.write_processes("triton-a", t, [ProcessSample(source="host", pid=77, role="server")])
    finding = only(candidates(store, 1), detectors.IDLE_CAPACITY, "MIG-1")
    assert (finding.target, finding.severity) == ("host-1", "warning")
    assert finding.evidence["idle_devices"] == pytest.approx(0.75)
    assert finding.evidence["traffic_rps"] == pytest.approx(50.0)
    assert finding.evidence["traffic_targets"] == "triton-a"
    assert "0.75 MIG instance idle" in finding.summary


def test_triton_gpu_utilisation_is_the_fallback(store: Store) -> None:
    triton_gpu = gpu(util=10.0, source="triton")
    Series(store, config(), gpus=[triton_gpu]).run([Load(exec_ns=8e6)])
    finding = only(candidates(store, 1), detectors.IDLE_CAPACITY)
    ev = finding.evidence
    assert (finding.target, ev["source"], ev["metric"]) == (
        "triton-a",
        "triton",
        "utilization_gpu_pct",
    )
    assert ev["idle_devices"] == pytest.approx(0.9)
    assert ev["traffic_rps"] == pytest.approx(100.0)  # the target that reports the GPU
    # With NVML readings of the same GPU, NVML is used instead.
    for i in range(STEPS + 1):
        store.write_devices("host-1", T0 + STEP * i, [gpu(sm=80.0)])
    assert [f for f in candidates(store, 1) if f.subject == "GPU-1"] == []


def test_model_instances_at_20_pct_busy_are_1_6_idle_instances(store: Store) -> None:
    # 2 instances; 100 executions/s × 4 ms = 0.4 s of compute per second = 20 % each.
    Series(store, config(instances=2)).run([Load(exec_ns=4e6)])
    finding = only(candidates(store, 1), detectors.IDLE_CAPACITY)
    ev = finding.evidence
    assert (finding.target, finding.subject, finding.severity) == ("triton-a", "m", "warning")
    assert ev["busy_share"] == pytest.approx(0.2)
    assert ev["instance_count"] == 2
    assert ev["idle_instances"] == pytest.approx(1.6)
    assert "1.60 idle instance-equivalents" in finding.summary


def test_busy_instances_and_idle_without_traffic(store: Store) -> None:
    busy = Series(store, config("busy", instances=1))
    quiet = Series(store, config("quiet", instances=3))
    busy.run([Load(exec_ns=6e6)])  # 60 % busy
    quiet.run([Load(batches_per_s={})])
    finding = only(candidates(store, 1), detectors.IDLE_CAPACITY)
    assert (finding.subject, finding.severity) == ("quiet", "info")
    assert finding.evidence["idle_instances"] == pytest.approx(3.0)
    assert "could be unloaded or consolidated" in finding.summary


# --------------------------------------------------------------------------- queue saturation


def test_queue_share_above_threshold(store: Store) -> None:
    Series(store, config()).run([Load(queue_us=600.0, compute_us=400.0)])
    finding = only(candidates(store, 1), detectors.QUEUE_SATURATION)
    ev = finding.evidence
    assert (finding.severity, ev["reasons"]) == ("warning", "queue_share")
    assert ev["queue_share"] == pytest.approx(0.6)
    assert ev["queue_us_per_request"] == pytest.approx(600.0)
    assert "queue 60% of request time" in finding.summary


def test_queue_share_above_critical_and_rejects_are_critical(store: Store) -> None:
    Series(store, config("q")).run([Load(queue_us=900.0, compute_us=100.0)])
    Series(store, config("r")).run([Load(rejected_per_s=2.0)])
    found = {f.subject: f for f in candidates(store, 1) if f.kind == detectors.QUEUE_SATURATION}
    assert found["q"].severity == "critical"
    assert found["q"].evidence["queue_share"] == pytest.approx(0.9)
    assert (found["r"].severity, found["r"].evidence["reasons"]) == ("critical", "rejects")
    assert found["r"].evidence["rejected_per_s"] == pytest.approx(2.0)


def test_pending_growth(store: Store) -> None:
    Series(store, config(), pending=2.0).run([Load(pending=2.0, pending_growth_per_s=0.25)])
    finding = only(candidates(store, 1), detectors.QUEUE_SATURATION)
    assert finding.evidence["reasons"] == "pending_growth"
    assert finding.evidence["pending_slope_per_s"] == pytest.approx(0.25)
    assert finding.evidence["pending_last"] == pytest.approx(17.0)


def test_batches_at_the_delay_limit_below_preferred(store: Store) -> None:
    cfg = config(preferred=(8,), delay_us=1000, max_batch_size=16)
    # 80 % of executions at batch 2, queue time 0.6 × the delay; queue share only 0.4.
    Series(store, cfg).run([Load(batches_per_s={2: 40.0, 8: 10.0}, queue_us=600.0)])
    finding = only(candidates(store, 1), detectors.QUEUE_SATURATION)
    ev = finding.evidence
    assert ev["reasons"] == "delay_limit"
    assert ev["below_preferred_exec_share"] == pytest.approx(0.8)
    assert ev["smallest_preferred_batch_size"] == 8
    assert ev["queue_to_delay_ratio"] == pytest.approx(0.6)
    assert "1000 µs delay limit" in finding.summary


def test_healthy_queue_opens_nothing(store: Store) -> None:
    cfg = config(preferred=(8,), delay_us=1000, max_batch_size=16)
    # Batches form at the preferred size, well before the delay runs out.
    Series(store, cfg).run([Load(batches_per_s={8: 20.0}, queue_us=150.0, pending=3.0)])
    assert [f for f in candidates(store, 1) if f.kind == detectors.QUEUE_SATURATION] == []
    assert detectors.queue_saturation(read_window(store, SETTINGS, now=now(1)), SETTINGS) == []


# --------------------------------------------------------------------------- batching


def test_unbatched_model_at_concurrency_opens_batching_off(store: Store) -> None:
    # 200 req/s × 10 ms in the server = 2 requests in flight on average.
    Series(store, config(dynamic=False)).run([Load(batches_per_s={1: 200.0}, compute_us=9900.0)])
    finding = only(candidates(store, 1), detectors.BATCHING_OFF)
    ev = finding.evidence
    assert finding.severity == "warning"
    assert ev["in_server_requests"] == pytest.approx(2.0)
    assert ev["max_batch_size"] == 8
    assert ev["requests_per_s"] == pytest.approx(200.0)


@pytest.mark.parametrize(
    "cfg",
    [
        config(dynamic=False, max_batch_size=1),  # cannot batch at all
        config(dynamic=True),  # batching is on
        config(dynamic=False, platform="ensemble"),
        config(dynamic=False, extra={"sequence_batching": {}}),
    ],
)
def test_batching_off_needs_a_model_that_could_batch(store: Store, cfg: ModelConfig) -> None:
    Series(store, cfg).run([Load(batches_per_s={1: 200.0}, compute_us=9900.0)])
    assert detectors.batching_off(read_window(store, SETTINGS, now=now(1)), SETTINGS) == []


def test_sequential_traffic_is_not_concurrent(store: Store) -> None:
    Series(store, config(dynamic=False)).run([Load(batches_per_s={1: 50.0})])  # L = 0.05
    assert detectors.batching_off(read_window(store, SETTINGS, now=now(1)), SETTINGS) == []
    # ... unless requests wait: a pending queue means they overlap.
    waiting = Series(store, config("waiting", dynamic=False), pending=2.0)
    waiting.run([Load(batches_per_s={1: 50.0}, pending=2.0)])
    [finding] = detectors.batching_off(read_window(store, SETTINGS, now=now(1)), SETTINGS)
    assert (finding.subject, finding.evidence["pending_mean"]) == ("waiting", 2.0)


def test_batch_far_below_preferred_or_max(store: Store) -> None:
    # L = 400 req/s × 10 ms = 4 in flight, yet batches of 2.
    load = Load(batches_per_s={2: 200.0}, compute_us=9900.0)
    Series(store, config("pref", preferred=(16,), max_batch_size=32)).run([load])
    Series(store, config("max", max_batch_size=32, delay_us=100)).run([load])
    Series(store, config("fine", max_batch_size=4)).run([load])  # 2 >= 0.25 × 4
    found = {
        f.subject: f
        for f in detectors.batch_below_preferred(read_window(store, SETTINGS, now=now(1)), SETTINGS)
    }
    assert set(found) == {"pref", "max"}
    assert {f.kind for f in found.values()} == {detectors.BATCH_BELOW_PREFERRED}
    pref, mx = found["pref"].evidence, found["max"].evidence
    assert (pref["reference"], pref["reference_batch_size"]) == ("preferred_batch_size", 16)
    assert (mx["reference"], mx["reference_batch_size"]) == ("max_batch_size", 32)
    assert pref["avg_batch_size"] == pytest.approx(2.0)
    assert pref["in_server_requests"] == pytest.approx(4.0)
    assert found["pref"].severity == "info"


def test_idle_detector_is_pure_over_window_data(store: Store) -> None:
    write_devices(store, [[gpu(sm=10.0)]])
    window = read_window(store, SETTINGS, now=now(1))
    assert detectors.idle_capacity(window, SETTINGS) == detectors.idle_capacity(window, SETTINGS)
    assert detectors.idle_capacity(window, DetectorSettings(idle_util_pct=5.0)) == []


# --------------------------------------------------------------------------- hysteresis


SATURATED = Load(queue_us=900.0, compute_us=100.0)
HEALTHY = Load()


def evaluate(store: Store, loads: Sequence[Load], **settings: object) -> list[list[StoredFinding]]:
    """Write one window per load, running the detectors at the end of each; the active
    queue-saturation findings after each evaluation."""
    s = DetectorSettings(**settings)  # type: ignore[arg-type]
    series = Series(store, config())
    out = []
    for k, load in enumerate(loads, start=1):
        series.run([load])
        out.append(
            [f for f in run_detectors(store, s, now=now(k)) if f.kind == detectors.QUEUE_SATURATION]
        )
    return out


def test_one_window_blip_opens_nothing(store: Store) -> None:
    after = evaluate(store, [SATURATED, HEALTHY, HEALTHY, HEALTHY])
    assert after == [[], [], [], []]
    assert store.findings() == []
    assert store.detector_streaks() == []  # nothing left to remember


def test_sustained_condition_opens_one_finding_and_refreshes_it(store: Store) -> None:
    after = evaluate(store, [SATURATED] * 5)
    assert [len(a) for a in after] == [0, 0, 1, 1, 1]
    assert len(store.findings(kind=detectors.QUEUE_SATURATION)) == 1
    opened, latest = after[2][0], after[4][0]
    assert opened.id == latest.id
    assert (opened.window_start, opened.created_at) == (T0, now(3))  # from the first window
    assert (latest.window_start, latest.window_end) == (T0, now(5))
    assert latest.severity == "critical"
    assert latest.evidence["queue_share"] == pytest.approx(0.9)


def test_resolves_after_clear_windows(store: Store) -> None:
    after = evaluate(store, [SATURATED] * 3 + [HEALTHY] * 3)
    assert [len(a) for a in after] == [0, 0, 1, 1, 1, 0]
    [finding] = store.findings(kind=detectors.QUEUE_SATURATION)
    assert finding.resolved_at == now(6)
    assert store.active_findings() == []


def test_alternating_windows_do_not_flap(store: Store) -> None:
    after = evaluate(store, [SATURATED, HEALTHY] * 4)
    assert all(a == [] for a in after)
    assert store.findings() == []


def test_open_finding_survives_alternating_windows(store: Store) -> None:
    after = evaluate(store, [SATURATED] * 3 + [HEALTHY, SATURATED] * 3)
    assert [len(a) for a in after] == [0, 0, 1, 1, 1, 1, 1, 1, 1]
    assert len(store.findings(kind=detectors.QUEUE_SATURATION)) == 1


def test_returning_condition_needs_to_sustain_again(store: Store) -> None:
    after = evaluate(store, [SATURATED] * 3 + [HEALTHY] * 3 + [SATURATED] * 3, clear_after=3)
    assert [len(a) for a in after] == [0, 0, 1, 1, 1, 0, 0, 0, 1]
    first, second = store.findings(kind=detectors.QUEUE_SATURATION)
    assert first.resolved_at == now(6) and second.resolved_at is None
    assert second.window_start == now(6)


def test_repeat_evaluation_of_one_moment_counts_once(store: Store) -> None:
    Series(store, config()).run([SATURATED])
    for _ in range(5):
        assert run_detectors(store, SETTINGS, now=now(1)) == []
    [streak] = [s for s in store.detector_streaks() if s.kind == detectors.QUEUE_SATURATION]
    assert (streak.holding, streak.since, streak.evaluated_at) == (1, T0, now(1))


def test_missing_data_neither_holds_nor_clears_until_stale(store: Store) -> None:
    evaluate(store, [SATURATED] * 3)
    s = DetectorSettings(stale_after_s=600)
    # The target goes silent: nothing in the window, the finding stays open ...
    for k in range(4, 13):
        active = run_detectors(store, s, now=now(k))
        assert [f.kind for f in active] == [detectors.QUEUE_SATURATION], k
    # ... until its last evidence is older than stale_after_s.
    assert run_detectors(store, s, now=now(14)) == []
    [finding] = store.findings(kind=detectors.QUEUE_SATURATION)
    assert finding.resolved_at == now(14)


def test_streak_of_a_vanished_subject_is_forgotten(store: Store) -> None:
    evaluate(store, [SATURATED])
    assert [
        s.holding for s in store.detector_streaks() if s.kind == detectors.QUEUE_SATURATION
    ] == [1]
    s = DetectorSettings(stale_after_s=300)
    run_detectors(store, s, now=now(5))  # no data for 4 windows: kept
    assert len(store.detector_streaks()) == 1
    run_detectors(store, s, now=now(7))
    assert store.detector_streaks() == []


def test_findings_of_other_kinds_are_left_alone(store: Store) -> None:
    fid = store.add_finding(
        kind="config_applied",
        severity="info",
        target="triton-a",
        subject="m",
        summary="dynamic_batching on",
        window_start=T0,
        window_end=T0,
        created_at=T0,
    )
    evaluate(store, [HEALTHY] * 4)
    assert [f.id for f in store.active_findings()] == [fid]


def test_several_kinds_on_one_model_are_separate_findings(store: Store) -> None:
    # Unbatched at concurrency 2 with a queue that dominates: both conditions hold.
    load = Load(batches_per_s={1: 200.0}, queue_us=9000.0, compute_us=1000.0)
    series = Series(store, config(dynamic=False))
    for k in range(1, 4):
        series.run([load])
        active = run_detectors(store, SETTINGS, now=now(k))
    assert sorted((f.kind, f.severity) for f in active) == [
        (detectors.BATCHING_OFF, "critical"),
        (detectors.QUEUE_SATURATION, "critical"),
    ]
    assert {f.subject for f in active} == {"m"}
