"""Plain-text rendering of a status report for the terminal."""

from __future__ import annotations

from collections.abc import Sequence

from collector.analysis.status import StatusReport
from collector.records import Recommendation

__all__ = ["render_findings", "render_recommendation", "render_status"]

# (header, path): a status row's fields by their dotted path in the records it composes
# (``rates.requests_per_s`` is ``ModelRates.requests_per_s``); the headers are short for
# the terminal.
MODEL_COLUMNS = (
    ("target", "target"),
    ("model", "model"),
    ("version", "version"),
    ("qps", "rates.requests_per_s"),
    ("infer/s", "rates.inferences_per_s"),
    ("exec/s", "rates.executions_per_s"),
    ("batch", "rates.avg_batch_size"),
    ("queue_us", "rates.queue_us_per_request"),
    ("infer_us", "rates.compute_infer_us_per_request"),
    ("request_us", "rates.request_us_per_request"),
    ("queue_share", "rates.queue_share"),
    ("busy_share", "rates.busy_share"),
    ("pending", "pending_request_count"),
    ("fail/s", "rates.fail_per_s"),
    ("dyn_batching", "config.dynamic_batching"),
    ("max_delay_us", "config.max_queue_delay_us"),
    ("preferred", "config.preferred_batch_sizes"),
    ("max_batch", "config.max_batch_size"),
    ("instances", "config.instance_count"),
)
DEVICE_COLUMNS = (
    ("target", "target"),
    *(
        (c, f"sample.{c}")
        for c in (
            "source",
            "kind",
            "uuid",
            "name",
            "utilization_gpu_pct",
            "sm_active_pct",
            "memory_used_bytes",
            "memory_total_bytes",
            "power_w",
        )
    ),
)
PROCESS_COLUMNS = (
    ("target", "target"),
    *((c, f"sample.{c}") for c in ("pid", "role", "model", "instance_name")),
    ("cpu_pct", "cpu_pct_mean"),
    ("rss_bytes", "sample.rss_bytes"),
    ("sm_util_pct", "gpu.sm_util_pct"),
)


def _field(row: object, path: str) -> object:
    """The value at a dotted ``path`` of a status row (``rates.requests_per_s``);
    ``None`` when a record on the way is absent (a model without rates)."""
    value: object = row
    for name in path.split("."):
        if value is None:
            return None
        value = getattr(value, name)
    return value


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list | tuple):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def _table(rows: Sequence[object], columns: Sequence[tuple[str, str]]) -> str:
    cells = [[_cell(_field(r, path)) for _, path in columns] for r in rows]
    headers = [header for header, _ in columns]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    return "\n".join(lines)


def render_status(report: StatusReport) -> str:
    """Models, then devices and processes when there are any."""
    parts = [_table(report.models, MODEL_COLUMNS) if report.models else "no model samples yet"]
    if report.devices:
        parts.append(_table(report.devices, DEVICE_COLUMNS))
    if report.processes:
        parts.append(_table(report.processes, PROCESS_COLUMNS))
    return "\n\n".join(parts)


def render_findings(findings: Sequence[object]) -> str:
    """One line per finding: severity, kind, subject, summary."""
    if not findings:
        return "no active findings"
    lines = ["findings:"]
    for f in findings:
        lines.append(
            f"  [{getattr(f, 'severity', '?')}] {getattr(f, 'kind', '?')} "
            f"{getattr(f, 'target', '')}/{getattr(f, 'subject', '')}: "
            f"{getattr(f, 'summary', '')}"
        )
    return "\n".join(lines)


def render_recommendation(rec: Recommendation) -> str:
    """The change, the figures before and predicted, the reason and the fragment."""
    head = (
        f"recommendation for {rec.target}/{rec.model} ({rec.kind}, confidence {rec.confidence:.2f})"
    )
    lines = [head]
    if rec.changes:
        lines += [f"  {c}" for c in rec.changes]
    else:
        lines.append("  no change")
    lines.append(f"  current:   {rec.current.qps:8.1f} QPS  p95 {_cell(rec.current.p95_ms)} ms")
    lines.append(
        f"  predicted: {rec.predicted.qps:8.1f} QPS  p95 {_cell(rec.predicted.p95_ms)} ms"
        + (f"  (objective p95 ≤ {rec.slo_p95_ms:g} ms)" if rec.slo_p95_ms else "")
    )
    lines.append(f"  why: {rec.reason}")
    if rec.changes:
        lines.append("  config.pbtxt:")
        lines += [f"    {line}" for line in rec.config_pbtxt.splitlines()]
    return "\n".join(lines)
