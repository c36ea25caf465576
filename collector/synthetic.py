"""Synthetic Triton scrapes written through ``Store.write_triton``: a steady load per
model with known rates, batch mix and service time, so every number the dashboard
shows can be predicted. The dashboard's tests and benchmark fill their stores with
it; nothing in the collector's own path imports it."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from collector import records
from collector.analysis.configs import config_changes, render_pbtxt
from collector.analysis.rates import CounterTrack, rates_between
from collector.sources.triton_json import map_model_config
from collector.store import Store

__all__ = ["Load", "model_config", "scrape_ok", "steady_load", "store_recommendation"]


def model_config(
    name: str,
    *,
    batching: bool,
    preferred: tuple[int, ...] = (),
    delay_us: int = 0,
    max_batch_size: int = 32,
    instances: int = 1,
) -> records.ModelConfig:
    doc: dict[str, object] = {
        "name": name,
        "backend": "python",
        "max_batch_size": max_batch_size,
        "instance_group": [{"name": f"{name}_0", "kind": "KIND_CPU", "count": instances}],
    }
    if batching:
        doc["dynamic_batching"] = {
            "preferred_batch_size": list(preferred),
            "max_queue_delay_microseconds": delay_us,
        }
    # Mapped as the collector maps a scraped config, so the record matches the document.
    return map_model_config(doc, raw_json=json.dumps(doc))


@dataclass(frozen=True)
class Load:
    """A steady load on one model: ``qps`` requests a second of ``request_ms`` each,
    ``queue_share`` of it queued; ``batch_mix`` is the share of executions at each
    batch size, ``cost_ms(b)`` an execution's compute time. ``failure_reasons`` are
    the reasons the metrics page lists (Triton 2.52 lists each at zero; failures count
    under ``OTHER``); ``io_ms`` is the input and the output handling of an execution,
    each, recorded as Triton records them (``compute_input``, ``compute_output``)."""

    config: records.ModelConfig
    qps: float
    request_ms: float
    queue_share: float
    batch_mix: Mapping[int, float]
    cost_ms: Callable[[int], float]
    fail_per_s: float = 0.0
    pending: float | None = 2.0
    failure_reasons: tuple[str, ...] = ()
    io_ms: float = 0.0

    @property
    def mean_batch(self) -> float:
        return sum(b * w for b, w in self.batch_mix.items()) / sum(self.batch_mix.values())


def _snapshot_parts(load: Load, elapsed: float) -> tuple[records.ModelMetrics, records.ModelStats]:
    name = load.config.model
    n = load.qps * elapsed
    e = load.qps / load.mean_batch * elapsed
    io_ns = load.io_ms * 1e6

    def io(executions: int) -> records.Duration:
        return (
            records.Duration(executions, int(executions * io_ns)) if io_ns else records.Duration()
        )

    batches = tuple(
        records.BatchStat(
            batch_size=b,
            compute_input=io(int(e * w)),
            compute_infer=records.Duration(count=int(e * w), ns=int(e * w * load.cost_ms(b) * 1e6)),
            compute_output=io(int(e * w)),
        )
        for b, w in sorted(load.batch_mix.items())
    )
    request_us = n * load.request_ms * 1000
    io_us = n * load.io_ms * 1000  # the input's (and the output's) time, all requests
    failures = dict.fromkeys(load.failure_reasons, 0.0)
    if load.fail_per_s:
        failures["OTHER"] = load.fail_per_s * elapsed
    metrics = records.ModelMetrics(
        model=name,
        version="1",
        request_success=n,
        request_failure_by_reason=failures,
        inference_count=n,
        exec_count=e,
        request_duration_us=request_us,
        queue_duration_us=request_us * load.queue_share,
        # Per request, as Triton counts them: each request of a batch is charged the
        # batch's time.
        compute_input_duration_us=io_us,
        compute_infer_duration_us=request_us * (1 - load.queue_share) - 2 * io_us,
        compute_output_duration_us=io_us,
        pending_request_count=load.pending,
    )
    stats = records.ModelStats(
        model=name,
        version="1",
        inference_count=int(n),
        execution_count=int(e),
        compute_input=io(int(e)),
        compute_output=io(int(e)),
        batch_stats=batches,
    )
    return metrics, stats


def steady_load(
    store: Store,
    loads: list[Load],
    *,
    target: str,
    start: float,
    seconds: float,
    step: float = 1.0,
    skip: tuple[float, float] | None = None,
    server: records.ServerMetrics | None = None,
    stats_every: int = 1,
) -> None:
    """One scrape of every model in ``loads`` each ``step`` seconds from ``start`` for
    ``seconds`` (counters start at 0 at ``start``); no scrape inside ``skip``. Each
    sample after the first carries its per-scrape rates, as the collector stores them
    (rollups average those); ``server``, when given, is each scrape's server-wide
    reading. The statistics come with every ``stats_every``-th scrape from the first,
    as the collector reads them every ``statistics_interval_s``."""
    if stats_every < 1:
        raise ValueError(f"stats_every must be at least 1, got {stats_every!r}")
    ticks = int(seconds / step)
    previous: dict[str, records.ModelSample] = {}
    tracks: dict[str, CounterTrack] = {}  # as the collector keeps per series
    for i in range(ticks + 1):
        at = start + i * step
        if skip is not None and skip[0] <= at < skip[1]:
            continue
        parts: list[tuple[records.ModelMetrics, records.ModelStats | None]] = [
            _snapshot_parts(load, i * step) for load in loads
        ]
        if i % stats_every:
            parts = [(metrics, None) for metrics, _ in parts]
        rates: dict[tuple[str, str], records.ModelRates] = {}
        for load, (metrics, stats) in zip(loads, parts, strict=True):
            sample = records.ModelSample(
                target=target, collected_at=at, metrics=metrics, stats=stats
            )
            before = previous.get(metrics.model)
            if before is not None:
                rates[(metrics.model, metrics.version)] = rates_between(
                    before,
                    sample,
                    instance_count=load.config.instance_count,
                    track=tracks.setdefault(metrics.model, CounterTrack()),
                )
            previous[metrics.model] = sample
        store.write_triton(
            records.TritonSnapshot(
                target=target,
                collected_at=at,
                server_version="2.59.0",
                model_metrics=tuple(m for m, _ in parts),
                model_stats=tuple(s for _, s in parts if s is not None),
                model_configs=tuple(load.config for load in loads),
                server=server,
            ),
            rates,
        )


def scrape_ok(
    store: Store, target: str, at: float, *, ok: bool = True, error: str = "connection refused"
) -> None:
    store.record_scrape(
        target,
        "triton",
        kind="triton",
        started_at=at,
        duration_s=0.01,
        error_kind=None if ok else "connect",
        error=None if ok else error,
    )


def store_recommendation(
    store: Store,
    *,
    target: str,
    config: records.ModelConfig,
    qps: float,
    p95_ms: float,
    created_at: float,
) -> int:
    """A probe recommendation (dynamic batching on, no delay) stored the way
    ``batchscope recommend`` stores one; its id."""
    current = records.BatcherConfig.from_model_config(config)
    proposed = records.BatcherConfig(
        max_batch_size=current.max_batch_size,
        dynamic_batching=True,
        instance_count=current.instance_count,
    )
    rec = records.Recommendation(
        target=target,
        model=config.model,
        created_at=created_at,
        kind="probe",
        changes=config_changes(current, proposed),
        current_config=current,
        proposed_config=proposed,
        current=records.Prediction(qps=qps, p95_ms=p95_ms),
        predicted=records.Prediction(qps=qps * 2.5, p95_ms=p95_ms * 0.9),
        confidence=0.3,
        reason="requests wait in the queue one at a time; dynamic batching with no delay "
        "groups those already waiting",
        config_pbtxt=render_pbtxt(proposed, instance_kind=config.instance_kind),
    )
    return store.add_recommendation(rec)
