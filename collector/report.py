"""Plain-text rendering of a status report for the terminal."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from collector.analysis.health import HealthState
from collector.analysis.recommend.figures import recommendation_figures
from collector.analysis.status import StatusReport, TargetStatus
from collector.records import Recommendation

__all__ = ["render_findings", "render_recommendation", "render_status"]

#: The width ``batchscope status`` fits its lines into (a common terminal).
TERMINAL_COLUMNS = 120
# Names are cut to fit, never shorter than this; figures are never cut.
_MIN_NAME = 8


@dataclass(frozen=True)
class Column:
    """One column of a status table: its ``header``, the dotted ``path`` of its value
    in a status row (``rates.requests_per_s`` is ``ModelRates.requests_per_s``), how a
    value is written, and whether it is a name that may be cut to fit the terminal."""

    header: str
    path: str
    show: Callable[[object], str] | None = None
    name: bool = False


def _num(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool):
        return _cell(value)
    v = float(value)
    if not math.isfinite(v):
        return "-"
    if v != 0 and abs(v) < 0.01:
        return "<0.01"
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def _pct(value: object) -> str:
    return f"{float(value) * 100:.0f}%" if isinstance(value, int | float) else _cell(value)


def _ms(value: object) -> str:
    return _num(float(value) / 1000.0) if isinstance(value, int | float) else _cell(value)


def _mib(value: object) -> str:
    return f"{float(value) / 2**20:.0f}" if isinstance(value, int | float) else _cell(value)


def _ago(now: float) -> Callable[[object], str]:
    def show(value: object) -> str:
        if not isinstance(value, int | float):
            return "never"
        seconds = max(now - float(value), 0.0)
        if seconds < 120:
            return f"{seconds:.0f} s ago"
        return f"{seconds / 60:.0f} min ago" if seconds < 7200 else f"{seconds / 3600:.0f} h ago"

    return show


def _target_note(row: object) -> str:
    """What a reader should know of a target: why it is not up, and that a host has
    no NVIDIA GPU (a fact, not a failure)."""
    assert isinstance(row, TargetStatus)
    notes = []
    if row.health.state is not HealthState.UP:
        error = f": {row.target.last_error}" if row.target.last_error else ""
        notes.append(f"{row.health.reason}{error}")
    if row.facts is not None and row.facts.nvml_absent:
        notes.append("no NVIDIA GPU on this host")
    return "; ".join(notes)


TARGET_COLUMNS = (
    Column("target", "target.name", name=True),
    Column("kind", "target.kind"),
    Column("state", "health.state"),
    Column("last_seen", "health.last_seen_at"),  # shown relative to the report's time
    Column("note", "", _target_note, name=True),
)
MODEL_COLUMNS = (
    Column("target", "target", name=True),
    Column("model", "model", name=True),
    Column("ver", "version"),
    Column("state", "state"),
    Column("qps", "rates.requests_per_s", _num),
    Column("batch", "rates.avg_batch_size", _num),
    Column("queue", "rates.queue_share", _pct),
    Column("busy", "rates.busy_share", _pct),
    Column("req_ms", "rates.request_us_per_request", _ms),
    Column("p95_ms", "request_p95_us", _ms),
    Column("pending", "pending_request_count", _num),
    Column("fail/s", "rates.fail_per_s", _num),
)
# The batcher config of each model, in a table of its own so both fit the terminal.
CONFIG_COLUMNS = (
    Column("target", "target", name=True),
    Column("model", "model", name=True),
    Column("ver", "version"),
    Column("dynamic_batching", "config.dynamic_batching"),
    Column("preferred", "config.preferred_batch_sizes"),
    Column("max_delay_us", "config.max_queue_delay_us"),
    Column("max_batch", "config.max_batch_size"),
    Column("instances", "config.instance_count"),
)
DEVICE_COLUMNS = (
    Column("target", "target", name=True),
    Column("source", "sample.source"),
    Column("kind", "sample.kind"),
    Column("uuid", "sample.uuid", name=True),
    Column("name", "sample.name", name=True),
    Column("util%", "sample.utilization_gpu_pct", _num),
    Column("sm%", "sample.sm_active_pct", _num),
    Column("mem_MiB", "sample.memory_used_bytes", _mib),
    Column("of_MiB", "sample.memory_total_bytes", _mib),
    Column("power_w", "sample.power_w", _num),
)
PROCESS_COLUMNS = (
    Column("target", "target", name=True),
    Column("pid", "sample.pid"),
    Column("role", "sample.role"),
    Column("model", "sample.model", name=True),
    Column("instance", "sample.instance_name", name=True),
    Column("cpu_pct", "cpu_pct_mean", _num),
    Column("rss_MiB", "sample.rss_bytes", _mib),
    Column("sm_util_pct", "gpu.sm_util_pct", _num),
)


def _field(row: object, path: str) -> object:
    """The value at a dotted ``path`` of a status row (``rates.requests_per_s``);
    ``None`` when a record on the way is absent (a model without rates); the row
    itself for an empty path."""
    value: object = row
    for name in filter(None, path.split(".")):
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


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _fit(widths: list[int], names: Sequence[bool], limit: int) -> list[int]:
    """Column widths whose line fits ``limit``: the widest name column is narrowed
    one character at a time (never below ``_MIN_NAME``); figures keep their width."""
    widths = list(widths)
    while sum(widths) + 2 * (len(widths) - 1) > limit:
        cuttable = [i for i, n in enumerate(names) if n and widths[i] > _MIN_NAME]
        if not cuttable:
            break
        widest = max(cuttable, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def _table(
    rows: Sequence[object],
    columns: Sequence[Column],
    *,
    limit: int = TERMINAL_COLUMNS,
    shown: Mapping[str, Callable[[object], str]] | None = None,
) -> str:
    writers = [(shown or {}).get(c.header) or c.show or _cell for c in columns]
    cells = [[w(_field(r, c.path)) for c, w in zip(columns, writers, strict=True)] for r in rows]
    headers = [c.header for c in columns]
    widths = [max([len(h)] + [len(row[i]) for row in cells]) for i, h in enumerate(headers)]
    widths = _fit(widths, [c.name for c in columns], limit)

    def line(values: Sequence[str]) -> str:
        return "  ".join(_cut(v, w).ljust(w) for v, w in zip(values, widths, strict=True)).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def render_status(report: StatusReport, *, limit: int = TERMINAL_COLUMNS) -> str:
    """Targets (judged at the report's time), models, then devices and processes when
    there are any; every line at most ``limit`` characters (names are cut to fit)."""
    parts = []
    if report.targets:
        ago = {"last_seen": _ago(report.generated_at)}
        parts.append(_table(report.targets, TARGET_COLUMNS, limit=limit, shown=ago))
    if report.models:
        parts.append(_table(report.models, MODEL_COLUMNS, limit=limit))
        configured = [m for m in report.models if m.config is not None]
        if configured:
            parts.append(_table(configured, CONFIG_COLUMNS, limit=limit))
    else:
        parts.append("no model samples yet")
    if report.devices:
        parts.append(_table(report.devices, DEVICE_COLUMNS, limit=limit))
    if report.processes:
        parts.append(_table(report.processes, PROCESS_COLUMNS, limit=limit))
    if report.store_outages:
        parts.append("\n".join(line[:limit] for line in _store_outages(report)))
    return "\n\n".join(parts)


def _store_outages(report: StatusReport) -> list[str]:
    """Two lines: the store's outages of the last day and what became of the writes
    held meanwhile (dropped ones are lost samples); the last one's length and error."""
    outages = report.store_outages
    last = outages[-1]
    return [
        f"store: {len(outages)} outage(s) in the last day: "
        f"{sum(o.held for o in outages)} write(s) held in memory, "
        f"{sum(o.written for o in outages)} written later, "
        f"{sum(o.dropped for o in outages)} dropped over the bound",
        f"  last ended {report.generated_at - last.ended_at:.0f} s ago after "
        f"{last.ended_at - last.started_at:.1f} s: {last.reason}",
    ]


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
    figures = recommendation_figures(rec)  # the one current figure and gain
    lines.append(f"  current:   {figures.current_qps:8.1f} QPS  p95 {_cell(rec.current.p95_ms)} ms")
    lines.append(
        f"  predicted: {figures.predicted_qps:8.1f} QPS  p95 {_cell(rec.predicted.p95_ms)} ms"
        + f"  ({figures.text()})"
        + (f"  (objective p95 ≤ {rec.slo_p95_ms:g} ms)" if rec.slo_p95_ms else "")
    )
    lines.append(f"  why: {rec.reason}")
    if rec.changes:
        lines.append("  config.pbtxt:")
        lines += [f"    {line}" for line in rec.config_pbtxt.splitlines()]
    return "\n".join(lines)
