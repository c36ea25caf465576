"""The recommender on stored synthetic windows: probe when only batch size 1 is known,
tune from a fitted curve, keep a config that is already right, honour an SLO."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from collector.analysis.recommend import (
    observe_model,
    recommend_model,
    recommendation_from_dict,
    recommendation_to_dict,
)
from collector.records import (
    BatchStat,
    Duration,
    HostFacts,
    ModelConfig,
    ModelMetrics,
    ModelStats,
    ProcessSample,
    ServerMetrics,
    TritonSnapshot,
)
from collector.store import Store

T0 = 1_000_000.0


def config(*, batching: bool, instances: int = 1) -> ModelConfig:
    doc = {
        "name": "m",
        "backend": "python",
        "max_batch_size": 32,
        "instance_group": [{"name": "m_0", "kind": "KIND_CPU", "count": instances}],
    }
    if batching:
        doc["dynamic_batching"] = {"preferred_batch_size": [], "max_queue_delay_microseconds": 0}
    return ModelConfig(
        model="m",
        max_batch_size=32,
        dynamic_batching=batching,
        instance_count=instances,
        instance_kind="KIND_CPU",
        raw_json=json.dumps(doc),
    )


def fill(
    store: Store,
    *,
    cfg: ModelConfig,
    qps: float,
    request_ms: float,
    queue_share: float,
    batch_mix: dict[int, float],
    cost_ms,
    seconds: int = 30,
) -> None:  # type: ignore[no-untyped-def]
    """One scrape a second of a steady load: ``batch_mix`` is the share of executions at
    each batch size, ``cost_ms(b)`` the execution time."""
    mean_batch = sum(b * w for b, w in batch_mix.items()) / sum(batch_mix.values())
    execs_per_s = qps / mean_batch
    for i in range(seconds + 1):
        t = T0 + i
        n = qps * i
        e = execs_per_s * i
        batches = tuple(
            BatchStat(
                batch_size=b,
                compute_infer=Duration(count=int(e * w), ns=int(e * w * cost_ms(b) * 1e6)),
            )
            for b, w in sorted(batch_mix.items())
        )
        metrics = ModelMetrics(
            model="m",
            version="1",
            request_success=n,
            inference_count=n,
            exec_count=e,
            request_duration_us=n * request_ms * 1000,
            queue_duration_us=n * request_ms * 1000 * queue_share,
            compute_infer_duration_us=n * request_ms * 1000 * (1 - queue_share),
            pending_request_count=qps * request_ms / 1000 * queue_share,
        )
        stats = ModelStats(
            model="m",
            version="1",
            inference_count=int(n),
            execution_count=int(e),
            batch_stats=batches,
        )
        store.write_triton(
            TritonSnapshot(
                target="t",
                collected_at=t,
                model_metrics=(metrics,),
                model_stats=(stats,),
                model_configs=(cfg,),
            ),
            {},
        )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(f"sqlite:///{tmp_path}/r.db")
    yield s
    s.close()


def test_unbatched_concurrent_traffic_gets_a_probe(store: Store) -> None:
    # 15 requests in the server at once, run one at a time: 10 ms each.
    fill(
        store,
        cfg=config(batching=False),
        qps=100,
        request_ms=150,
        queue_share=0.93,
        batch_mix={1: 1.0},
        cost_ms=lambda b: 10.0,
    )
    rec = recommend_model(store, "t", "m", now=T0 + 31)
    assert rec is not None
    assert rec.kind == "probe"
    assert [(c.field, c.before, c.after) for c in rec.changes] == [
        ("dynamic_batching", False, True)
    ]
    assert rec.proposed_config.max_queue_delay_us == 0
    assert rec.evidence["population"] == 15
    assert "dynamic_batching" in json.loads(rec.config_json)
    assert "dynamic_batching {" in rec.config_pbtxt
    assert rec.confidence <= 0.5
    # The worst case it predicts is no gain, not a loss.
    assert rec.predicted.qps >= rec.current.qps * 0.9


@pytest.mark.parametrize("kind", ["ensemble", "sequence"])
def test_a_model_whose_batching_triton_decides_elsewhere_is_left_alone(
    store: Store, kind: str
) -> None:
    """The same queued, one-at-a-time traffic as above, but an ensemble (its steps
    batch) or a sequence-batched model: Triton would refuse dynamic_batching."""
    base = config(batching=False)
    doc = json.loads(base.raw_json)
    if kind == "ensemble":
        doc = {**doc, "platform": "ensemble", "instance_group": []}
        cfg = replace(base, platform="ensemble", instance_count=0, raw_json=json.dumps(doc))
    else:
        cfg = replace(base, raw_json=json.dumps({**doc, "sequence_batching": {}}))
    fill(
        store,
        cfg=cfg,
        qps=100,
        request_ms=150,
        queue_share=0.93,
        batch_mix={1: 1.0},
        cost_ms=lambda b: 10.0,
    )
    rec = recommend_model(store, "t", "m", now=T0 + 31)
    assert rec is not None
    assert rec.kind == "no_change" and rec.changes == ()
    assert kind in rec.reason
    assert "dynamic_batching" not in json.loads(rec.config_json)


def test_fixed_cost_model_is_tuned_and_prediction_matches_the_current_point(store: Store) -> None:
    # Batching with no delay, saturated by 16 clients: batches of 4..16 observed,
    # cost 8 ms + 0.3 ms per sample.
    fill(
        store,
        cfg=config(batching=True),
        qps=900,
        request_ms=15.0,
        queue_share=0.4,
        batch_mix={4: 0.1, 8: 0.3, 12: 0.3, 16: 0.3},
        cost_ms=lambda b: 8.0 + 0.3 * b,
    )
    rec = recommend_model(store, "t", "m", now=T0 + 31)
    assert rec is not None and rec.kind == "tune"
    # Calibrated at the operating point: the model reproduces today's throughput.
    assert rec.evidence["current_predicted_qps"] == pytest.approx(900, rel=0.10)
    # A large fixed cost: bigger batches pay, and the change is predicted to gain.
    assert rec.predicted.qps >= rec.evidence["current_predicted_qps"] * 1.15
    assert rec.predicted.avg_batch_size >= 6
    assert rec.confidence >= 0.5
    assert "8.00 ms fixed plus 0.30 ms per sample" in rec.reason


def test_linear_cost_model_gains_little(store: Store) -> None:
    # Each sample costs 2 ms, the fixed part 0.2 ms: batching saves almost nothing.
    fill(
        store,
        cfg=config(batching=True),
        qps=450,
        request_ms=35.0,
        queue_share=0.6,
        batch_mix={1: 0.2, 2: 0.3, 4: 0.3, 8: 0.2},
        cost_ms=lambda b: 0.2 + 2.0 * b,
    )
    rec = recommend_model(store, "t", "m", now=T0 + 31)
    assert rec is not None
    # Whatever it proposes, each instance serves about what one serves today:
    # batching itself adds little when every sample costs the same.
    per_instance = rec.predicted.qps / rec.proposed_config.instance_count
    assert per_instance <= rec.evidence["current_predicted_qps"] * 1.15
    assert "2.00 ms per sample" in rec.reason


def test_slo_is_honoured(store: Store) -> None:
    fill(
        store,
        cfg=config(batching=False),
        qps=60,
        request_ms=14.0,
        queue_share=0.3,
        batch_mix={1: 0.5, 2: 0.5},
        cost_ms=lambda b: 8.0 + 0.3 * b,
    )
    rec = recommend_model(store, "t", "m", now=T0 + 31, slo_p95_ms=25.0)
    assert rec is not None and rec.kind in ("tune", "no_change")
    assert "no candidate meets" not in rec.reason
    assert rec.predicted.p95_ms <= 25.0
    assert rec.slo_p95_ms == 25.0
    # An SLO the current config breaks (p95 ≈ 29 ms here) is not kept.
    assert rec.proposed_config != rec.current_config


def test_too_little_traffic_gives_nothing(store: Store) -> None:
    fill(
        store,
        cfg=config(batching=False),
        qps=10,
        request_ms=5,
        queue_share=0.0,
        batch_mix={1: 1.0},
        cost_ms=lambda b: 5.0,
        seconds=1,
    )
    assert recommend_model(store, "t", "m", now=T0 + 2) is None


def test_round_trip_through_json(store: Store) -> None:
    fill(
        store,
        cfg=config(batching=False),
        qps=100,
        request_ms=150,
        queue_share=0.93,
        batch_mix={1: 1.0},
        cost_ms=lambda b: 10.0,
    )
    rec = recommend_model(store, "t", "m", now=T0 + 31)
    assert rec is not None
    back = recommendation_from_dict(json.loads(json.dumps(recommendation_to_dict(rec))))
    assert back == rec


def test_population_is_the_busiest_operating_point() -> None:
    from collector.analysis.recommend.observe import _population

    # 16 clients whose own time per request grows with load (1 ms at 330/s, 2.7 ms
    # at 425/s): a line through (λ, L) would read 18 clients; the bound ⌈L⌉ is right.
    points = [(332.0, 15.67), (330.0, 15.60), (422.5, 14.83), (425.6, 14.89)]
    assert _population(points) == 16
    assert _population([(230.0, 6.85)]) == 7


def test_cpu_contention_counts_the_triton_hosts_cores(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CPU instances contend for the Triton host's cores, which the host source stores
    (``HostFacts``), not for those of the machine running the analysis."""
    import os

    monkeypatch.setattr(os, "cpu_count", lambda: 1000)  # must not be read
    fill(
        store,
        cfg=config(batching=True),
        qps=900,
        request_ms=15.0,
        queue_share=0.4,
        batch_mix={4: 0.1, 8: 0.3, 12: 0.3, 16: 0.3},
        cost_ms=lambda b: 8.0 + 0.3 * b,
    )
    for i in range(31):
        # The model's instance keeps 0.9 of a core busy; the server uses half the host.
        store.write_processes(
            "t",
            T0 + i,
            [
                ProcessSample(
                    source="host",
                    pid=41,
                    role="stub",
                    model="m",
                    instance_name="m_0_0",
                    cpu_pct=90.0,
                )
            ],
        )
        store.write_triton(
            TritonSnapshot(
                target="t", collected_at=T0 + i + 0.5, server=ServerMetrics(cpu_utilization=0.5)
            ),
            {},
        )

    unknown = observe_model(store, "t", "m", now=T0 + 31)
    assert unknown is not None and unknown.cpu_fraction > 0
    # Without the host's count, contention is not modelled, and the evidence says why.
    assert unknown.cores_available is None
    assert unknown.evidence["host_cpu_count"] is None
    assert "CPU count is unknown" in str(unknown.evidence["cpu_contention"])

    store.write_host_facts("t", HostFacts(target="t", collected_at=T0 + 30, cpu_count=8))
    known = observe_model(store, "t", "m", now=T0 + 31)
    assert known is not None and known.cpu_fraction == unknown.cpu_fraction
    # 8 cores; the rest of the server uses 0.5 × 8 − 0.9 = 3.1 of them.
    assert known.cores_available == pytest.approx(8 - 3.1)
    assert known.evidence["host_cpu_count"] == 8
    assert "cpu_contention" not in known.evidence
