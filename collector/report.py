"""Plain-text rendering of a status report for the terminal."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict

from collector.analysis.status import StatusReport
from collector.records import Recommendation

__all__ = ["render_findings", "render_recommendation", "render_status"]

MODEL_COLUMNS = ("target", "model", "version", "qps", "infer_per_s", "exec_per_s",
                 "avg_batch_size", "queue_us", "compute_infer_us", "request_us", "queue_share",
                 "busy_share", "pending", "fail_per_s", "dynamic_batching",
                 "max_queue_delay_us", "preferred_batch_sizes", "max_batch_size",
                 "instance_count")
DEVICE_COLUMNS = ("target", "source", "kind", "uuid", "name", "utilization_gpu_pct",
                  "sm_active_pct", "memory_used_bytes", "memory_total_bytes", "power_w")
PROCESS_COLUMNS = ("target", "pid", "role", "model", "instance_name", "cpu_pct", "rss_bytes",
                   "sm_util_pct")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or "-"
    return str(value)


def _table(rows: Sequence[dict[str, object]], columns: Sequence[str]) -> str:
    cells = [[_cell(r.get(c)) for c in columns] for r in rows]
    widths = [max([len(c)] + [len(row[i]) for row in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip()]
    lines += ["  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip()
              for row in cells]
    return "\n".join(lines)


def render_status(report: StatusReport) -> str:
    """Models, then devices and processes when there are any."""
    parts = [_table([asdict(m) for m in report.models], MODEL_COLUMNS)
             if report.models else "no model samples yet"]
    if report.devices:
        parts.append(_table([asdict(d) for d in report.devices], DEVICE_COLUMNS))
    if report.processes:
        parts.append(_table([asdict(p) for p in report.processes], PROCESS_COLUMNS))
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
