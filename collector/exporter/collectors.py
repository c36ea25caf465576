"""prometheus-client custom collectors: an ``ExporterSnapshot`` as metric families.

``SnapshotCollector.collect()`` takes one snapshot per scrape and yields every family
of ``collector.exporter.families.FAMILIES`` from it: names, types, help text and label
names come from there, values from the snapshot. Every family is yielded on every
scrape, also without samples, so its HELP and TYPE say what the exporter can export.

Conventions: base units (``_us`` and ``_ms`` figures become seconds, percentages
ratios), ``""`` for a label that does not apply (``model`` of a device finding,
``device`` of a model finding), no timestamps. A label set appears once per family.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from collector.analysis.capacity import idle_instance_equivalents
from collector.analysis.health import HealthState, scrape_decides
from collector.analysis.recommend import recommendation_figures
from collector.exporter.families import FAMILIES, Family, Kind, family
from collector.exporter.snapshot import ExporterSnapshot
from collector.store.buffer import BufferCounts

__all__ = ["SnapshotCollector", "snapshot_families"]

log = logging.getLogger("batchscope.exporter")

_Labels = tuple[str, ...]


class _Families:
    """The families of one scrape, filled by label values; a repeated label set is
    dropped (Prometheus rejects an exposition that holds one twice)."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {f.name: _empty(f) for f in FAMILIES}
        self._seen: dict[str, set[_Labels]] = {f.name: set() for f in FAMILIES}

    def add(self, name: str, labels: Sequence[object], value: float | None) -> None:
        """One sample of family ``name``; ``None`` (not known) adds nothing."""
        if value is None:
            return
        spec = family(name)
        values = tuple("" if v is None else str(v) for v in labels)
        if len(values) != len(spec.labels):
            raise ValueError(f"{name} takes labels {spec.labels}, got {values}")
        if values in self._seen[name]:
            return
        self._seen[name].add(values)
        metric = self._metrics[name]
        if isinstance(metric, InfoMetricFamily):
            metric.add_metric(list(values), {})
        else:
            assert isinstance(metric, GaugeMetricFamily | CounterMetricFamily)
            metric.add_metric(list(values), float(value))

    def metrics(self) -> Iterator[Metric]:
        yield from self._metrics.values()


def _empty(spec: Family) -> Metric:
    """The family with its name as prometheus-client spells it (without the
    ``_total`` or ``_info`` that it adds back in the exposition)."""
    labels = list(spec.labels)
    if spec.kind is Kind.COUNTER:
        return CounterMetricFamily(spec.name.removesuffix("_total"), spec.help, labels=labels)
    if spec.kind is Kind.INFO:
        return InfoMetricFamily(spec.name.removesuffix("_info"), spec.help, labels=labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=labels)


def _ratio(pct: float | None) -> float | None:
    return None if pct is None else pct / 100.0


def _seconds(value: float | None, per_second: float) -> float | None:
    return None if value is None else value / per_second


# --------------------------------------------------------------------------- groups


def _batch_stats(snap: ExporterSnapshot, out: _Families) -> None:
    for sample in snap.latest_stats:
        assert sample.stats is not None  # the snapshot keeps samples with statistics
        for b in sample.stats.batch_stats:
            labels = (sample.target, sample.model, sample.version, b.batch_size)
            out.add("batchscope_model_executions_total", labels, b.exec_count)
            out.add("batchscope_model_execution_compute_seconds_total", labels, b.compute_ns / 1e9)


def _analysis_window(snap: ExporterSnapshot, out: _Families) -> None:
    out.add("batchscope_analysis_window_seconds", (), snap.window_s)
    for m in snap.status.models:
        if m.rates is None:
            continue
        labels = (m.target, m.model, m.version)
        out.add("batchscope_model_average_batch_size", labels, m.rates.avg_batch_size)
        out.add("batchscope_model_queue_ratio", labels, m.rates.queue_share)
        out.add("batchscope_model_instance_busy_ratio", labels, m.rates.busy_share)
        if m.rates.busy_share is not None and m.config is not None:
            idle = idle_instance_equivalents(m.config.instance_count, m.rates.busy_share)
            out.add("batchscope_model_idle_instances", labels, idle)


def _configs(snap: ExporterSnapshot, out: _Families) -> None:
    for m in snap.status.models:
        c = m.config
        if c is None:
            continue
        model = (m.target, m.model)
        preferred = ",".join(str(size) for size in c.preferred_batch_sizes)
        batching = "true" if c.dynamic_batching else "false"
        out.add(
            "batchscope_model_config_info",
            (*model, batching, preferred, c.timeout_action),
            1.0,
        )
        out.add("batchscope_model_max_batch_size", model, c.max_batch_size)
        for position, size in enumerate(c.preferred_batch_sizes):
            out.add("batchscope_model_preferred_batch_size", (*model, position), size)
        out.add("batchscope_model_max_queue_delay_seconds", model, c.max_queue_delay_us / 1e6)
        out.add("batchscope_model_instances", model, c.instance_count)


def _findings(snap: ExporterSnapshot, out: _Families) -> None:
    for f in snap.findings:
        # Device findings (idle GPU or MIG instance) say so in their evidence; every
        # other finding is about a model.
        on_device = "device_kind" in f.evidence
        model, device = ("", f.subject) if on_device else (f.subject, "")
        out.add("batchscope_finding", (f.target, f.kind, f.severity, model, device), 1.0)


def _recommendations(snap: ExporterSnapshot, out: _Families) -> None:
    for stored in snap.recommendations:
        rec = stored.recommendation
        model = (rec.target, rec.model)
        change = ",".join(c.field for c in rec.changes)
        out.add("batchscope_recommendation_info", (*model, rec.kind, change), 1.0)
        figures = recommendation_figures(rec)  # one current figure and gain everywhere
        out.add("batchscope_recommendation_current_requests_per_second", model, figures.current_qps)
        out.add(
            "batchscope_recommendation_predicted_requests_per_second",
            model,
            figures.predicted_qps,
        )
        out.add(
            "batchscope_recommendation_current_p95_seconds",
            model,
            _seconds(rec.current.p95_ms, 1e3),
        )
        out.add(
            "batchscope_recommendation_predicted_p95_seconds",
            model,
            _seconds(rec.predicted.p95_ms, 1e3),
        )
        out.add("batchscope_recommendation_confidence_ratio", model, rec.confidence)


def _sources(snap: ExporterSnapshot, out: _Families) -> None:
    for t in snap.status.targets:
        fresh = t.health.state is HealthState.UP  # a stale or down target is 0
        deciding = [s for s in t.target.sources if scrape_decides(t.target.kind, s)]
        for source, ok in t.target.sources.items():
            out.add("batchscope_source_up", (source, t.name), 1.0 if ok and fresh else 0.0)
            # The store keeps the duration of a target's latest deciding scrape; it is
            # this source's only when no other source decides the target.
            if deciding == [source]:
                out.add(
                    "batchscope_source_scrape_duration_seconds",
                    (source, t.name),
                    t.target.last_duration_s,
                )


def _devices(snap: ExporterSnapshot, out: _Families) -> None:
    for d in snap.status.devices:
        s = d.sample
        where = (s.uuid, s.kind, s.parent_uuid, s.name)
        out.add(
            "batchscope_device_utilization_ratio",
            (d.target, s.source, *where),
            _ratio(s.utilization_gpu_pct),
        )
        out.add("batchscope_device_sm_active_ratio", (d.target, *where), _ratio(s.sm_active_pct))
        out.add(
            "batchscope_device_memory_used_bytes", (d.target, s.source, *where), s.memory_used_bytes
        )


def _processes(snap: ExporterSnapshot, out: _Families) -> None:
    for p in snap.status.processes:
        s = p.sample
        out.add(
            "batchscope_process_cpu_cores",
            (p.target, s.pid, s.role, s.model, s.instance_name),
            _ratio(p.cpu_pct_mean),
        )
        gpu = p.gpu if p.gpu is not None else (s if s.source == "nvml" else None)
        if gpu is None:
            continue
        labels = (p.target, s.pid, s.model, s.instance_name, gpu.gpu_uuid)
        out.add("batchscope_process_sm_utilization_ratio", labels, _ratio(gpu.sm_util_pct))
        out.add("batchscope_process_gpu_memory_bytes", labels, gpu.gpu_memory_bytes)


def _alerts(snap: ExporterSnapshot, out: _Families) -> None:
    for a in snap.alerts:
        labels = a.labels  # as notifications carry them: the subject as model or device
        out.add(
            "batchscope_alert",
            (
                labels.get("alertname"),
                a.rule,
                a.severity,
                a.state,
                a.target,
                labels.get("model"),
                labels.get("device"),
            ),
            1.0,
        )
    for c in snap.outbox:
        out.add("batchscope_alert_notifications", (c.receiver, c.state), c.count)


_GROUPS: tuple[Callable[[ExporterSnapshot, _Families], None], ...] = (
    _batch_stats,
    _analysis_window,
    _configs,
    _findings,
    _recommendations,
    _sources,
    _devices,
    _processes,
    _alerts,
)


def _store_writes(counts: BufferCounts, out: _Families) -> None:
    out.add("batchscope_store_up", (), 0.0 if counts.out_since is not None else 1.0)
    out.add("batchscope_store_writes_held", (), counts.held)
    out.add("batchscope_store_writes_held_bytes", (), counts.held_bytes)
    out.add("batchscope_store_writes_lost_total", ("dropped",), counts.dropped)
    out.add("batchscope_store_writes_lost_total", ("rejected",), counts.rejected)
    out.add("batchscope_store_outages_total", (), counts.outages)


def snapshot_families(
    snap: ExporterSnapshot | None,
    store_writes: BufferCounts | None = None,
    *,
    version: str = "",
) -> Iterator[Metric]:
    """Every family of ``FAMILIES`` with the samples ``snap`` holds (none of the store's
    when it is None) and what this process's write buffer did (``store_writes``)."""
    out = _Families()
    if snap is not None:
        for group in _GROUPS:
            group(snap, out)
        version = snap.version
    if store_writes is not None:
        _store_writes(store_writes, out)
    out.add("batchscope_build_info", (version,), 1.0)
    yield from out.metrics()


class SnapshotCollector(Collector):
    """A collector whose every scrape reads one snapshot from ``take`` (one read of the
    store, so all families of a scrape agree) and the write buffer's counts from
    ``store_writes``.

    While the buffer says the store is out, a snapshot that cannot be read is left out
    and the scrape still says so (``batchscope_store_up`` 0, the writes held): an
    outage is when Prometheus most needs those. Any other failure fails the scrape."""

    def __init__(
        self,
        take: Callable[[], ExporterSnapshot],
        *,
        store_writes: Callable[[], BufferCounts] | None = None,
        version: str = "",
    ) -> None:
        self._take = take
        self._store_writes = store_writes
        self._version = version
        self._told_outage = False  # said once per outage, not once per scrape

    def collect(self) -> Iterable[Metric]:
        counts = self._store_writes() if self._store_writes is not None else None
        try:
            snap: ExporterSnapshot | None = self._take()
        except Exception as exc:
            if counts is None or counts.out_since is None:
                raise
            if not self._told_outage:
                self._told_outage = True
                log.warning("store out: /metrics serves the store's own families only: %s", exc)
            snap = None
        else:
            self._told_outage = False
        return snapshot_families(snap, counts, version=self._version)
