"""Formatting, links and the small pieces every page shares: numbers and times as
text, page hrefs, banners, finding badges and an evidence list."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from dash import html

from collector.evidence import evidence_items
from dashboard.queries import DEFAULT_RANGE, StoredFinding
from dashboard.theme import severity_class


def fmt_num(value: float | None, digits: int = 1, unit: str = "") -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}{unit}"


def fmt_share(value: float | None) -> str:
    return "—" if value is None else f"{value:.0%}"


def fmt_time(at: float | None) -> str:
    if at is None:
        return "—"
    return datetime.fromtimestamp(at, tz=UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def fmt_ago(at: float | None, now: float) -> str:
    if at is None:
        return "never"
    seconds = max(now - at, 0.0)
    if seconds < 90:
        return f"{seconds:.0f} s ago"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min ago"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h ago"
    return f"{seconds / 86400:.1f} days ago"


def model_href(target: str, model: str, range_name: str = DEFAULT_RANGE) -> str:
    return "/model?" + urlencode({"target": target, "model": model, "range": range_name})


def findings_href(target: str, model: str) -> str:
    """The findings page filtered to the model, open and resolved alike."""
    return "/findings?" + urlencode({"target": target, "model": model, "state": "all"})


def recs_href(target: str, model: str) -> str:
    return "/recommendations?" + urlencode({"target": target, "model": model})


def silence_href(rule: str | None, target: str | None, subject: str | None) -> str:
    """The alerts page with its silence form filled in for these matchers."""
    chosen = {"rule": rule, "target": target, "model": subject}
    return "/alerts?" + urlencode({k: v for k, v in chosen.items() if v})


def banner(messages: Sequence[str]) -> list[Any]:
    """An alert line per message; nothing when there is none."""
    return [html.Div(m, className="banner", role="alert") for m in messages]


def finding_badges(findings: Sequence[StoredFinding]) -> list[Any]:
    return [
        html.Span(f.kind.replace("_", " "), className=severity_class(f.severity), title=f.summary)
        for f in findings
    ]


def evidence_facts(evidence: dict[str, Any]) -> Any:
    """A finding's evidence as a definition list: each key's label, each value a
    figure with its unit (``collector.evidence``)."""
    return html.Dl(
        [
            item
            for label, value in evidence_items(evidence)
            for item in (html.Dt(label), html.Dd(value))
        ],
        className="facts evidence",
    )
