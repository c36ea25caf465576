"""The dashboard's query module on seeded SQLite stores: what the overview and a model
page read, bounded and typed, and a banner instead of an exception when the store
fails. Also the app factory served through its WSGI entry, and the CLI's defaults."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.exc import OperationalError

from bench.load import callback_body
from collector.cli import build_parser
from collector.records import (
    BatcherConfig,
    DeviceSample,
    Prediction,
    Recommendation,
    TritonSnapshot,
)
from collector.store import Store, TargetState
from collector.synthetic import Load, model_config, scrape_ok, steady_load, store_recommendation
from dashboard.queries import (
    RANGES,
    DashboardQueries,
    ModelDetail,
    OverviewData,
    from_json,
    is_open,
    parse_range,
    to_json,
)

T0 = 1_000_000.0
BATCHED = model_config("batched", batching=True, preferred=(8, 16), delay_us=2000)
UNBATCHED = model_config("unbatched", batching=False)


def batched_load(**overrides: object) -> Load:
    values: dict[str, object] = dict(
        config=BATCHED,
        qps=100.0,
        request_ms=20.0,
        queue_share=0.25,
        batch_mix={4: 0.5, 8: 0.5},
        cost_ms=lambda b: 4.0 + 0.5 * b,
        pending=3.0,
    )
    values.update(overrides)
    return Load(**values)  # type: ignore[arg-type]


def unbatched_load() -> Load:
    return Load(
        config=UNBATCHED,
        qps=50.0,
        request_ms=40.0,
        queue_share=0.8,
        batch_mix={1: 1.0},
        cost_ms=lambda b: 4.5,
        fail_per_s=0.5,
        pending=None,
    )


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/dash.db"


@pytest.fixture
def store(db_url: str) -> Store:
    s = Store(db_url)
    yield s
    s.close()


@pytest.fixture
def seeded(store: Store) -> Store:
    """Two models on target t, one scrape every 5 s for 10 minutes, t up."""
    steady_load(
        store, [batched_load(), unbatched_load()], target="t", start=T0, seconds=600, step=5
    )
    scrape_ok(store, "t", T0 + 600)
    return store


def queries(store: Store) -> DashboardQueries:
    return DashboardQueries(store, clock=lambda: T0 + 600)


# --------------------------------------------------------------------------- overview


def test_overview_lists_every_model_with_its_rates_and_config(seeded: Store) -> None:
    data = queries(seeded).overview(window_s=60)
    assert data.error is None and not data.empty
    rows = {r.status.model: r.status for r in data.models}
    assert sorted(rows) == ["batched", "unbatched"]
    b, u = rows["batched"], rows["unbatched"]
    assert b.rates is not None and u.rates is not None
    assert b.config is not None and u.config is not None
    assert b.rates.requests_per_s == pytest.approx(100.0, rel=1e-6)
    assert b.rates.avg_batch_size == pytest.approx(6.0, rel=1e-6)
    assert b.config.preferred_batch_sizes == (8, 16) and b.config.dynamic_batching is True
    assert b.rates.queue_share == pytest.approx(0.25, rel=1e-6)
    assert b.pending_request_count == 3.0 and b.up is True
    assert u.rates.requests_per_s == pytest.approx(50.0, rel=1e-6)
    assert u.rates.avg_batch_size == pytest.approx(1.0)
    assert u.config.dynamic_batching is False and u.config.preferred_batch_sizes == ()
    assert u.rates.fail_per_s == pytest.approx(0.5, rel=1e-6)
    # Busy share from batch_stats: 50 executions/s × 4.5 ms = 0.225 of one instance.
    assert u.rates.busy_share == pytest.approx(0.225, rel=0.02)
    assert [t.state.name for t in data.targets] == ["t"] and data.targets[0].state.up is True
    assert data.targets[0].models == 2
    # No GPU readings: no idle-GPU total, but idle model instances are totalled.
    assert data.idle_gpus is None and data.devices == []
    assert data.instances_total == 2
    assert b.rates.busy_share is not None
    assert data.instances_idle == pytest.approx(2 - b.rates.busy_share - u.rates.busy_share)


def test_overview_attaches_active_findings_to_their_rows(seeded: Store, store: Store) -> None:
    common = dict(target="t", window_start=T0, window_end=T0 + 600, created_at=T0 + 600)
    store.add_finding(
        kind="batching_off",
        severity="warning",
        subject="unbatched",
        summary="requests wait but run one at a time",
        **common,
    )
    resolved = store.add_finding(
        kind="queue_saturation", severity="critical", subject="unbatched", summary="old", **common
    )
    store.resolve_finding(resolved, T0 + 600)
    data = queries(seeded).overview()
    rows = {r.status.model: r for r in data.models}
    assert [f.kind for f in rows["unbatched"].findings] == ["batching_off"]
    assert rows["batched"].findings == []


def test_device_tiles_total_idle_gpus_counting_mig_slices(store: Store) -> None:
    at = T0 + 10
    store.write_devices(
        "host",
        at,
        [
            DeviceSample(source="nvml", uuid="GPU-a", index=0, name="A100", sm_active_pct=20.0),
            DeviceSample(source="nvml", uuid="GPU-b", index=1, utilization_gpu_pct=80.0),
            DeviceSample(source="nvml", uuid="GPU-m", index=2, memory_total_bytes=80 * 2**30),
            DeviceSample(
                source="nvml",
                uuid="MIG-1",
                kind="mig",
                parent_uuid="GPU-m",
                memory_total_bytes=40 * 2**30,
                sm_active_pct=0.0,
            ),
            DeviceSample(
                source="nvml",
                uuid="MIG-2",
                kind="mig",
                parent_uuid="GPU-m",
                memory_total_bytes=40 * 2**30,
                sm_active_pct=50.0,
            ),
        ],
    )
    # Triton's own reading of GPU-a: NVML's is preferred, one tile per device.
    store.write_triton(
        TritonSnapshot(
            target="t",
            collected_at=at,
            gpus=(DeviceSample(source="triton", uuid="GPU-a", utilization_gpu_pct=99.0),),
        )
    )
    store.add_finding(
        kind="idle_capacity",
        severity="info",
        target="host",
        subject="GPU-a",
        summary="idle",
        window_start=T0,
        window_end=at,
        created_at=at,
    )
    data = DashboardQueries(store, clock=lambda: at).overview()
    tiles = {d.sample.uuid: d for d in data.devices}
    assert sorted(tiles) == ["GPU-a", "GPU-b", "GPU-m", "MIG-1", "MIG-2"]
    assert tiles["GPU-a"].sample.source == "nvml" and tiles["GPU-a"].utilisation_pct == 20.0
    assert tiles["GPU-a"].metric == "sm_active_pct"
    assert tiles["GPU-b"].metric == "utilization_gpu_pct"
    assert tiles["GPU-m"].weight == 0.0  # its capacity is its MIG instances'
    assert tiles["MIG-1"].weight == pytest.approx(0.5)
    # 0.8 + 0.2 + 0.5 × 1.0 + 0.5 × 0.5
    assert data.idle_gpus == pytest.approx(1.75)
    assert [f.subject for f in data.device_findings] == ["GPU-a"]


def test_empty_store_is_empty_not_an_error(store: Store) -> None:
    data = DashboardQueries(store).overview()
    assert data.error is None and data.empty
    assert data.models == [] and data.targets == [] and data.last_sample_at is None


def test_a_down_target_is_reported_with_its_error(seeded: Store, store: Store) -> None:
    scrape_ok(store, "t", T0 + 601, ok=False, error="connection refused")
    data = queries(seeded).overview()
    (down,) = data.down_targets
    assert down.name == "t" and down.last_error == "connection refused"
    assert down.consecutive_failures == 1
    assert all(r.status.up is False for r in data.models)


def test_an_unreachable_store_gives_an_error_line_not_an_exception(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/missing-dir/x.db")  # opened on the first read
    q = DashboardQueries(store)
    data = q.overview()
    assert data.error is not None and data.error.startswith("the store cannot be opened")
    assert "Traceback" not in data.error and "\n" not in data.error
    detail = q.model_detail("t", "m")
    assert detail.error is not None and not detail.known


def test_the_next_read_recovers_after_a_failure(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = [OperationalError("SELECT", {}, Exception("connection refused"))]
    targets = store.targets

    def flaky() -> list[TargetState]:
        if failures:
            raise failures.pop()
        return targets()

    monkeypatch.setattr(store, "targets", flaky)
    q = DashboardQueries(store)
    failed = q.overview().error
    assert failed is not None and failed.startswith("the store is unreachable")
    assert "connection refused" in failed and not failures
    assert q.overview().error is None


# --------------------------------------------------------------------------- model page


def test_model_detail_reads_series_distribution_fit_config(seeded: Store) -> None:
    detail = queries(seeded).model_detail("t", "batched", range_name="15m")
    assert detail.error is None and detail.known and detail.up is True
    assert detail.range_name == "15m" and detail.until - detail.since == 900
    s = detail.series
    assert s.source == "raw" and 0 < len(s.t) <= 240
    assert s.bucket_s == 5.0  # never shorter than the scrape interval: no empty buckets
    assert (
        len(s.t)
        == len(s.requests_per_s)
        == len(s.avg_batch_size)
        == len(s.queue_ms)
        == len(s.pending_request_count)
    )
    assert all(v == pytest.approx(100.0, rel=1e-6) for v in s.requests_per_s)
    assert all(v == pytest.approx(6.0, rel=1e-6) for v in s.avg_batch_size)
    assert all(v == pytest.approx(20.0 * 0.25, rel=1e-6) for v in s.queue_ms)
    assert all(v == pytest.approx(20.0 * 0.75, rel=1e-6) for v in s.compute_ms)
    assert set(s.pending_request_count) == {3.0} and set(s.fail_per_s) == {0.0}
    assert s.t == sorted(s.t) and s.t[0] > T0 and s.t[-1] == T0 + 600

    d = detail.distribution
    assert d.sizes == [4, 8]
    assert d.executions[0] == pytest.approx(d.executions[1], rel=0.01)
    assert sum(d.executions) == pytest.approx(100 / 6 * 600, rel=0.01)
    assert d.mean_ms == pytest.approx([6.0, 8.0], rel=0.01)
    fit = detail.service_time
    assert fit is not None and fit.sizes == [4, 8]
    assert fit.intercept_ms == pytest.approx(4.0, rel=0.05)
    assert fit.per_sample_ms == pytest.approx(0.5, rel=0.05)
    assert fit.max_batch_size == 32

    assert detail.config is not None
    c = detail.config.config
    assert c.preferred_batch_sizes == (8, 16) and c.max_queue_delay_us == 2000
    assert json.loads(c.raw_json)["dynamic_batching"]["preferred_batch_size"] == [8, 16]


def test_each_part_of_the_model_page_can_be_read_on_its_own(seeded: Store) -> None:
    q = queries(seeded)
    whole = q.model_detail("t", "batched", range_name="15m")
    since, until = whole.since, whole.until
    assert q.model_series("t", "batched", since=since, until=until) == whole.series
    assert q.batch_distribution("t", "batched", since=since, until=until) == whole.distribution
    assert q.service_time("t", "batched", since=since, until=until) == whole.service_time
    assert q.findings("t", "batched", since=since) == whole.findings
    assert q.latest_recommendation("t", "batched") == whole.recommendation


def test_series_points_are_bounded(seeded: Store) -> None:
    detail = queries(seeded).model_detail("t", "batched", range_name="15m", max_points=30)
    assert 0 < len(detail.series.t) <= 31
    assert all(v == pytest.approx(100.0, rel=1e-6) for v in detail.series.requests_per_s)


def test_a_gap_in_scrapes_breaks_the_series(store: Store) -> None:
    steady_load(
        store,
        [batched_load()],
        target="t",
        start=T0,
        seconds=600,
        step=5,
        skip=(T0 + 200, T0 + 400),
    )
    s = queries(store).model_detail("t", "batched", range_name="15m", max_points=60).series
    gaps = [i for i, v in enumerate(s.requests_per_s) if v is None]
    assert len(gaps) == 1
    # The pair across the gap still reports the true average rate, not a spike.
    assert all(v == pytest.approx(100.0, rel=1e-6) for v in s.requests_per_s if v is not None)


def test_a_counter_reset_gives_no_negative_rate(store: Store) -> None:
    steady_load(store, [batched_load()], target="t", start=T0, seconds=300, step=5)
    steady_load(
        store,
        [batched_load()],
        target="t",
        start=T0 + 301,
        seconds=295,  # restart
        step=5,
    )
    s = queries(store).model_detail("t", "batched", range_name="15m").series
    assert all(v is not None and v >= 0 for v in s.requests_per_s)
    assert max(v for v in s.requests_per_s if v is not None) < 150.0


def test_findings_of_the_model_only_open_first(seeded: Store, store: Store) -> None:
    common = dict(target="t", window_start=T0, window_end=T0 + 600)
    old = store.add_finding(
        kind="queue_saturation",
        severity="critical",
        subject="unbatched",
        summary="was saturated",
        created_at=T0 + 100,
        **common,
    )
    store.resolve_finding(old, T0 + 200)
    store.add_finding(
        kind="batching_off",
        severity="warning",
        subject="unbatched",
        summary="batching is off",
        evidence={"concurrency": 2.0},
        created_at=T0 + 300,
        **common,
    )
    store.add_finding(
        kind="batch_below_preferred",
        severity="info",
        subject="batched",
        summary="other model",
        created_at=T0 + 300,
        **common,
    )
    before = store.add_finding(
        kind="batching_off",
        severity="warning",
        subject="unbatched",
        summary="before the range",
        created_at=T0 - 5000,
        **common,
    )
    store.resolve_finding(before, T0 - 4000)
    found = queries(seeded).model_detail("t", "unbatched").findings
    assert [(f.kind, is_open(f)) for f in found] == [
        ("batching_off", True),
        ("queue_saturation", False),
    ]
    assert found[0].evidence == {"concurrency": 2.0}


def test_latest_recommendation_with_its_pbtxt(seeded: Store, store: Store) -> None:
    store_recommendation(
        store, target="t", config=UNBATCHED, qps=50, p95_ms=80, created_at=T0 + 100
    )
    store_recommendation(
        store, target="t", config=UNBATCHED, qps=55, p95_ms=70, created_at=T0 + 500
    )
    view = queries(seeded).model_detail("t", "unbatched").recommendation
    assert view is not None
    rec = view.stored.recommendation
    # The kind and the outcome are apart: a fresh recommendation is open.
    assert rec.kind == "probe" and view.stored.status == "open"
    assert rec.current.qps == 55 and rec.predicted.qps == pytest.approx(55 * 2.5)
    assert view.changes == [["dynamic_batching", "False", "True"]]
    assert "dynamic_batching {" in rec.config_pbtxt
    assert queries(seeded).model_detail("t", "batched").recommendation is None


def test_recommendations_start_with_the_model_of_the_most_severe_finding(
    seeded: Store, store: Store
) -> None:
    for config in (BATCHED, UNBATCHED):
        store_recommendation(store, target="t", config=config, qps=50, p95_ms=80, created_at=T0)
    assert [r.stored.model for r in queries(seeded).recommendations()[0]] == [
        "batched",
        "unbatched",
    ]
    common = dict(target="t", window_start=T0, window_end=T0 + 60, evidence={}, summary="s")
    store.add_finding(kind="idle_capacity", severity="info", subject="batched", **common)
    critical = store.add_finding(
        kind="queue_saturation", severity="critical", subject="unbatched", **common
    )
    recs, _error = queries(seeded).recommendations()
    assert [(r.stored.model, r.severity) for r in recs] == [
        ("unbatched", "critical"),
        ("batched", "info"),
    ]
    # A resolved finding no longer counts.
    store.resolve_finding(critical, T0 + 600)
    recs, _error = queries(seeded).recommendations()
    assert [(r.stored.model, r.severity) for r in recs] == [
        ("batched", "info"),
        ("unbatched", None),
    ]


def test_a_recommendation_has_one_current_figure_and_its_gain_from_it(
    seeded: Store, store: Store
) -> None:
    current = BatcherConfig.from_model_config(BATCHED)
    store.add_recommendation(
        Recommendation(
            target="t",
            model="batched",
            created_at=T0,
            kind="tune",
            changes=(),
            current_config=current,
            proposed_config=current,
            current=Prediction(qps=200.0, p95_ms=30.0),
            predicted=Prediction(qps=236.0, p95_ms=31.0),
            confidence=0.7,
            reason="r",
            config_pbtxt="",
        )
    )
    view = queries(seeded).latest_recommendation("t", "batched")
    assert view is not None and view.current is not None and view.predicted is not None
    assert (view.current.qps, view.current.p95_ms) == (200.0, 30.0)
    assert view.predicted.qps == 236.0 and view.gain == pytest.approx(1.18)
    assert from_json(type(view), to_json(view)) == view
    # A probe claims no gain: its predicted figure is the current one.
    store_recommendation(store, target="t", config=UNBATCHED, qps=200, p95_ms=80, created_at=T0)
    probe = queries(seeded).latest_recommendation("t", "unbatched")
    assert probe is not None and probe.gain is None
    assert probe.predicted is not None and probe.predicted.qps == 200.0


def test_a_recommendation_without_changes_or_configs_still_shows(
    seeded: Store, store: Store
) -> None:
    """What a hand-written row of an older store reads as after its upgrade: the reason,
    the prediction and the fragment, no changes and unknown configs."""
    unknown = BatcherConfig(max_batch_size=0)
    store.add_recommendation(
        Recommendation(
            target="t",
            model="batched",
            created_at=T0,
            kind="tune",
            changes=(),
            current_config=unknown,
            proposed_config=unknown,
            current=Prediction(0.0, None),
            predicted=Prediction(qps=120.0, p95_ms=12.0),
            confidence=0.5,
            reason="hand-written",
            config_pbtxt="max_batch_size: 32\n",
        )
    )
    view = queries(seeded).latest_recommendation("t", "batched")
    assert view is not None
    rec = view.stored.recommendation
    assert rec.reason == "hand-written" and rec.predicted.qps == 120.0
    assert rec.config_pbtxt == "max_batch_size: 32\n" and view.changes == []


def test_long_ranges_read_rollups_and_the_raw_tail(store: Store) -> None:
    steady_load(store, [batched_load()], target="t", start=T0, seconds=2400, step=10)
    store.rollup(T0 + 2100, bucket_s=300)  # the last 400 s are not rolled up yet
    q = DashboardQueries(store, clock=lambda: T0 + 2400)
    detail = q.model_detail("t", "batched", range_name="6h")
    s = detail.series
    assert s.source == "rollup" and s.bucket_s >= 300 and 0 < len(s.t) <= 240
    assert all(v == pytest.approx(100.0, rel=1e-6) for v in s.requests_per_s if v is not None)
    assert s.t[-1] > T0 + 2100  # the tail after the last rollup is there
    assert detail.distribution.sizes == [4, 8]
    assert sum(detail.distribution.executions) == pytest.approx(100 / 6 * 2400, rel=0.02)


def test_long_ranges_without_rollups_read_a_bounded_raw_part(store: Store) -> None:
    steady_load(store, [batched_load()], target="t", start=T0, seconds=1200, step=10)
    s = (
        DashboardQueries(store, clock=lambda: T0 + 1200)
        .model_detail("t", "batched", range_name="24h")
        .series
    )
    assert s.source == "raw" and s.truncated_to_s == 6 * 3600
    assert all(v == pytest.approx(100.0, rel=1e-6) for v in s.requests_per_s if v is not None)


def test_an_unknown_model_is_not_known(seeded: Store) -> None:
    detail = queries(seeded).model_detail("t", "nope")
    assert detail.error is None and not detail.known
    assert detail.series.empty and detail.distribution.empty and detail.service_time is None


def test_ranges_parse_with_a_default() -> None:
    assert parse_range("1h") == ("1h", 3600.0)
    assert parse_range(None) == ("15m", 900.0)
    assert parse_range("forever") == ("15m", 900.0)
    assert list(RANGES) == ["5m", "15m", "1h", "6h", "24h", "7d"]


def test_answers_round_trip_through_json(seeded: Store, store: Store) -> None:
    store.add_finding(
        kind="batching_off",
        severity="warning",
        target="t",
        subject="unbatched",
        summary="s",
        window_start=T0,
        window_end=T0 + 1,
        evidence={"x": 1.5},
        created_at=T0 + 590,
    )
    store_recommendation(
        store, target="t", config=UNBATCHED, qps=50, p95_ms=80, created_at=T0 + 100
    )
    q = queries(seeded)
    overview = q.overview()
    assert from_json(OverviewData, json.loads(json.dumps(to_json(overview)))) == overview
    detail = q.model_detail("t", "unbatched")
    assert from_json(ModelDetail, json.loads(json.dumps(to_json(detail)))) == detail


# --------------------------------------------------------------------------- app and CLI


def _callback(client, output: str, inputs: list[dict], state: list[dict] | None = None):  # type: ignore[no-untyped-def]
    changed = [f"{i['id']}.{i['property']}" for i in inputs]
    return client.post(
        "/_dash-update-component", json=callback_body(output, inputs, state or [], changed)
    )


def test_the_app_serves_its_pages_and_the_tick_reads_the_store(seeded: Store) -> None:
    from dashboard import ids
    from dashboard.app import create_app

    app = create_app(seeded, refresh_s=2.5, queries=queries(seeded))
    assert not app.config.suppress_callback_exceptions
    client = app.server.test_client()
    page = client.get("/")
    assert page.status_code == 200 and b"batchscope" in page.data
    assert client.get("/model?target=t&model=batched").status_code == 200
    layout = client.get("/_dash-layout")
    assert layout.status_code == 200

    tick = _callback(
        client,
        f"{ids.Overview.DATA}.data",
        [{"id": ids.Overview.INTERVAL, "property": "n_intervals", "value": 0}],
    )
    assert tick.status_code == 200
    data = tick.get_json()["response"][ids.Overview.DATA]["data"]
    assert sorted(m["status"]["model"] for m in data["models"]) == ["batched", "unbatched"]

    detail = _callback(
        client,
        f"{ids.Model.DATA}.data",
        [{"id": ids.Model.INTERVAL, "property": "n_intervals", "value": 0}],
        [
            {
                "id": ids.Model.QUERY,
                "property": "data",
                "value": {"target": "t", "model": "batched", "range": "1h"},
            }
        ],
    )
    assert detail.status_code == 200
    assert detail.get_json()["response"][ids.Model.DATA]["data"]["range_name"] == "1h"


def test_the_page_interval_follows_refresh_s(seeded: Store) -> None:
    from dashboard.app import create_app
    from dashboard.pages import overview  # loaded by create_app

    app = create_app(seeded, refresh_s=2.5)
    with app.server.test_request_context("/"):
        interval = overview.layout().children[0]
    assert interval.interval == 2500
    with pytest.raises(ValueError):
        create_app(seeded, refresh_s=0)


def test_the_dashboard_command_binds_to_localhost_by_default() -> None:
    args = build_parser().parse_args(["dashboard", "--db", "sqlite:///x.db"])
    assert (args.host, args.port, args.refresh, args.db_url) == (
        "127.0.0.1",
        8050,
        5.0,
        "sqlite:///x.db",
    )


# --------------------------------------------------------------------------- recommendations


def test_recommendations_and_what_if_from_the_batcher_model(seeded: Store, store: Store) -> None:
    from collector.analysis.recommend import recommender_job

    ids_ = recommender_job(window_s=60.0)(store, T0 + 600)
    assert len(ids_) == 2
    q = DashboardQueries(seeded, clock=lambda: T0 + 600, slo_p95_ms={"batched": 40.0})
    recs, error = q.recommendations()
    assert error is None
    assert {(r.stored.target, r.stored.model) for r in recs} == {
        ("t", "batched"),
        ("t", "unbatched"),
    }
    unbatched = next(r for r in recs if r.stored.model == "unbatched")
    # Only batch size 1 was seen: a probe, shown as a diff of the pbtxt fragments.
    assert unbatched.stored.kind == "probe"
    assert "dynamic_batching {" in unbatched.stored.recommendation.config_pbtxt
    assert "dynamic_batching" not in unbatched.current_pbtxt

    curve = q.what_if("t", "batched", preferred=[8, 16], instances=1)
    assert curve.error is None and curve.objective == "SLO p95 ≤ 40 ms"
    assert len(curve.predicted) == len(curve.delays_us) > 3
    assert all(p.qps > 0 for p in curve.predicted)
    two = q.what_if("t", "batched", preferred=[8, 16], instances=2)
    assert two.instances == 2
    assert [p.qps for p in two.predicted] != [p.qps for p in curve.predicted]
    # Without two batch sizes there is no curve yet, and it says so.
    assert "not enough traffic" in (
        q.what_if("t", "unbatched", preferred=[], instances=1).error or ""
    )
    # JSON round trip for the page's Store.
    assert from_json(type(curve), json.loads(json.dumps(to_json(curve)))) == curve


def test_recommendation_outcome_is_kept(store: Store) -> None:
    rid = store_recommendation(
        store, target="t", config=UNBATCHED, qps=50.0, p95_ms=90.0, created_at=T0
    )
    done = store.record_recommendation_outcome(
        rid, outcome="applied", at=T0 + 5, verification={"verdict": "kept"}
    )
    assert done.status == "applied" and done.verification == {"verdict": "kept"}
    assert done.applied_at == T0 + 5
    with pytest.raises(KeyError):
        store.record_recommendation_outcome(rid + 99, outcome="applied", at=T0, verification={})


# --------------------------------------------------------------------------- events, devices


def test_events_filter_by_target_model_kind_severity_and_state(store: Store) -> None:
    common = dict(window_start=T0, window_end=T0 + 60, evidence={"x": 1})
    a = store.add_finding(
        kind="batching_off",
        severity="warning",
        target="t",
        subject="m1",
        summary="a",
        created_at=T0 + 60,
        **common,
    )
    store.add_finding(
        kind="idle_capacity",
        severity="critical",
        target="u",
        subject="gpu0",
        summary="b",
        created_at=T0 + 70,
        **common,
    )
    store.add_finding(
        kind="queue_saturation",
        severity="info",
        target="t",
        subject="m2",
        summary="c",
        created_at=T0 + 80,
        **common,
    )
    store.resolve_finding(a, T0 + 100)
    q = DashboardQueries(store, clock=lambda: T0 + 200)
    active = q.events()
    assert [e.summary for e in active.events] == ["b", "c"]  # critical first
    assert active.kinds == ["batching_off", "idle_capacity", "queue_saturation"]
    assert active.severities == ["critical", "warning", "info"]
    assert [e.summary for e in q.events(state="past").events] == ["a"]
    assert [e.summary for e in q.events(state="all", target="t").events] == ["c", "a"]
    assert [e.summary for e in q.events(state="all", kind="idle_capacity").events] == ["b"]
    assert [e.summary for e in q.events(state="all", severity="info").events] == ["c"]
    assert [e.summary for e in q.events(state="all", subject="m1").events] == ["a"]


def test_devices_heatmap_rows_per_gpu_and_stub_process(store: Store) -> None:
    from collector.records import ProcessSample

    for i in range(60):
        at = T0 + i * 5
        store.write_devices(
            "t",
            at,
            [
                DeviceSample(
                    source="nvml",
                    uuid="GPU-aaaaaaaa-0001",
                    index=0,
                    name="H200",
                    utilization_gpu_pct=20.0 + i % 3,
                    memory_used_bytes=10**10,
                    power_w=150.0,
                ),
                DeviceSample(
                    source="nvml",
                    uuid="GPU-aaaaaaaa-0002",
                    index=1,
                    name="H200",
                    utilization_gpu_pct=90.0,
                    sm_active_pct=70.0,
                ),
            ],
        )
        store.write_processes(
            "t",
            at,
            [
                ProcessSample(
                    source="host",
                    pid=41,
                    role="stub",
                    model="m",
                    instance_name="m_0_0",
                    cpu_pct=35.0,
                ),
                ProcessSample(source="host", pid=40, role="server", cpu_pct=5.0),
            ],
        )
    view = DashboardQueries(store, clock=lambda: T0 + 300).devices(range_name="5m", max_points=30)
    assert view.error is None and len(view.t) == 30
    assert [r.label.split("(")[-1] for r in view.devices] == ["aaa-0001)", "aaa-0002)"]
    second = view.devices[1].values
    assert {round(v) for v in second if v is not None} == {70}  # SM activity wins
    assert [r.label for r in view.processes] == ["t · m_0_0 (pid 41)"]
    assert view.process_metric.startswith("CPU")
    assert len(view.memory_used_gb) == 1 and len(view.power_w) == 1


def test_devices_over_a_long_range_read_rollups_and_the_raw_tail(store: Store) -> None:
    """Two days of one GPU every minute: the 7-day heatmap covers both days from the
    rollups (up to the last closed bucket) and the raw samples after them, processes
    only the last 6 h."""
    from collector.records import ProcessSample

    start, step, ticks = T0, 60.0, 2 * 24 * 60
    for i in range(ticks):
        at = start + i * step
        # The first day at 10 %, the second at 60 %.
        store.write_devices(
            "t",
            at,
            [
                DeviceSample(
                    source="nvml",
                    uuid="GPU-bbbbbbbb-0001",
                    index=0,
                    name="H200",
                    utilization_gpu_pct=10.0 if i < ticks // 2 else 60.0,
                    power_w=100.0,
                )
            ],
        )
        store.write_processes(
            "t",
            at,
            [
                ProcessSample(
                    source="host",
                    pid=7,
                    role="stub",
                    model="m",
                    instance_name="m_0_0",
                    cpu_pct=50.0,
                )
            ],
        )
    end = start + (ticks - 1) * step
    q = DashboardQueries(store, clock=lambda: end + 1)

    # Without rollups only the last 6 h are read, and the view says so.
    raw_only = q.devices(range_name="7d", max_points=168)
    assert raw_only.devices_truncated_to_s == 6 * 3600.0
    assert {round(v) for v in raw_only.devices[0].values if v is not None} == {60}

    store.rollup(end - 1800, bucket_s=300.0)  # the last half hour stays raw
    view = q.devices(range_name="7d", max_points=168)  # one-hour buckets
    assert view.error is None and view.devices_truncated_to_s is None
    [gpu] = view.devices
    assert gpu.label == "t · H200 0 (bbb-0001)"  # named from the raw tail
    filled = [v for v in gpu.values if v is not None]
    assert len(filled) == 48  # every hour of both days, the raw tail included
    assert round(filled[0]) == 10 and round(filled[-1]) == 60
    assert sum(round(v) not in (10, 60) for v in filled) <= 1  # the hour the day turns
    assert gpu.values[-1] is not None and round(gpu.values[-1]) == 60
    assert view.process_window_s == 6 * 3600.0
    assert sum(v is not None for v in view.processes[0].values) == 6
