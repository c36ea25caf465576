"""Plain-text rendering of a status report for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from collector.analysis.status import StatusReport
from collector.records import Recommendation

__all__ = ["render_findings", "render_recommendation", "render_status"]

# (header, field): a status row's fields under the names of the records it composes
# (``ModelRates``, ``BatcherConfig``, ``DeviceSample``, ``ProcessSample``); the headers
# are short for the terminal.
MODEL_COLUMNS = (
    ("target", "target"), ("model", "model"), ("version", "version"),
    ("qps", "requests_per_s"), ("infer/s", "inferences_per_s"), ("exec/s", "executions_per_s"),
    ("batch", "avg_batch_size"), ("queue_us", "queue_us_per_request"),
    ("infer_us", "compute_infer_us_per_request"), ("request_us", "request_us_per_request"),
    ("queue_share", "queue_share"), ("busy_share", "busy_share"),
    ("pending", "pending_request_count"), ("fail/s", "fail_per_s"),
    ("dyn_batching", "dynamic_batching"), ("max_delay_us", "max_queue_delay_us"),
    ("preferred", "preferred_batch_sizes"), ("max_batch", "max_batch_size"),
    ("instances", "instance_count"))
DEVICE_COLUMNS = tuple((c, c) for c in (
    "target", "source", "kind", "uuid", "name", "utilization_gpu_pct", "sm_active_pct",
    "memory_used_bytes", "memory_total_bytes", "power_w"))
PROCESS_COLUMNS = tuple((c, c) for c in (
    "target", "pid", "role", "model", "instance_name", "cpu_pct", "rss_bytes", "sm_util_pct"))


def _flat(row: Any) -> dict[str, object]:
    """A status row's fields with those of the records it holds lifted beside them
    (``rates.requests_per_s`` is ``requests_per_s``)."""
    flat: dict[str, object] = {}
    for key, value in asdict(row).items():
        if isinstance(value, dict) and key not in ("fail_per_s_by_reason",):
            flat.update({k: v for k, v in value.items() if k not in flat})
        else:
            flat[key] = value
    return flat


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
    flat = [_flat(r) for r in rows]
    cells = [[_cell(r.get(name)) for _, name in columns] for r in flat]
    headers = [header for header, _ in columns]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]
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
        lines.append(f"  [{getattr(f, 'severity', '?')}] {getattr(f, 'kind', '?')} "
                     f"{getattr(f, 'target', '')}/{getattr(f, 'subject', '')}: "
                     f"{getattr(f, 'summary', '')}")
    return "\n".join(lines)


def render_recommendation(rec: Recommendation) -> str:
    """The change, the figures before and predicted, the reason and the fragment."""
    head = f"recommendation for {rec.target}/{rec.model} ({rec.kind}, confidence " \
           f"{rec.confidence:.2f})"
    lines = [head]
    if rec.changes:
        lines += [f"  {c}" for c in rec.changes]
    else:
        lines.append("  no change")
    lines.append(f"  current:   {rec.current.qps:8.1f} QPS  p95 {_cell(rec.current.p95_ms)} ms")
    lines.append(f"  predicted: {rec.predicted.qps:8.1f} QPS  p95 {_cell(rec.predicted.p95_ms)} ms"
                 + (f"  (objective p95 ≤ {rec.slo_p95_ms:g} ms)" if rec.slo_p95_ms else ""))
    lines.append(f"  why: {rec.reason}")
    if rec.changes:
        lines.append("  config.pbtxt:")
        lines += [f"    {line}" for line in rec.config_pbtxt.splitlines()]
    return "\n".join(lines)
