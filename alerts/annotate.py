"""What an alert says: its fingerprint, labels and annotations (a summary, the
evidence with units, the recommended ``config.pbtxt`` change when the store holds one
for the model, and a link to the model's page).

Annotations are strings, as Alertmanager's are: the same text goes to every receiver.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from urllib.parse import urlencode

from alerts.rules import Condition, Rule
from collector.analysis.configs import render_pbtxt
from collector.evidence import evidence_items
from collector.store import StoredRecommendation

__all__ = [
    "alert_annotations",
    "alert_labels",
    "config_diff",
    "fingerprint",
    "model_link",
]

# Recommendations that change nothing carry no diff.
_NO_CHANGE = "no_change"


def fingerprint(rule: str, target: str, subject: str) -> str:
    """The alert's stable identity: 16 hex digits of SHA-256 over rule, target and
    subject (the length of Alertmanager's own fingerprints)."""
    return hashlib.sha256("\0".join((rule, target, subject)).encode()).hexdigest()[:16]


def alert_labels(condition: Condition, rule: Rule, severity: str) -> dict[str, str]:
    """``alertname``, ``rule``, ``severity``, ``target`` and the subject under its label
    (``model`` or ``device``)."""
    labels = {
        "alertname": rule.alertname,
        "rule": rule.name,
        "severity": severity,
        "target": condition.target,
    }
    if condition.subject and condition.subject_label:
        labels[condition.subject_label] = condition.subject
    return labels


def model_link(dashboard_url: str | None, target: str, model: str) -> str:
    """The model's page in the UI (the dashboard's ``/model`` route), or its overview
    for a target alert; "" without ``alerts.dashboard_url``."""
    if not dashboard_url:
        return ""
    base = dashboard_url.rstrip("/")
    if not model:
        return base + "/"
    return f"{base}/model?" + urlencode({"target": target, "model": model})


def config_diff(stored: StoredRecommendation) -> str:
    """The recommended change as a unified diff of the model's ``config.pbtxt``
    batching lines, current → proposed; "" when it changes nothing."""
    rec = stored.recommendation
    if rec.kind == _NO_CHANGE or not rec.changes:
        return ""
    kind = re.search(r"kind:\s*(KIND_\w+)", rec.config_pbtxt)
    instance_kind = kind.group(1) if kind else "KIND_AUTO"
    current = render_pbtxt(rec.current_config, instance_kind=instance_kind)
    proposed = render_pbtxt(rec.proposed_config, instance_kind=instance_kind)
    lines = difflib.unified_diff(
        current.splitlines(keepends=True),
        proposed.splitlines(keepends=True),
        fromfile=f"{rec.model}/config.pbtxt (current)",
        tofile=f"{rec.model}/config.pbtxt (recommended)",
    )
    return "".join(lines)


def _recommendation_text(stored: StoredRecommendation) -> str:
    rec = stored.recommendation
    gain = ""
    if rec.current.qps > 0 and rec.predicted.qps > 0:
        gain = f" (predicted {rec.current.qps:.0f} → {rec.predicted.qps:.0f} QPS"
        if rec.predicted.p95_ms is not None:
            gain += f", p95 {rec.predicted.p95_ms:.1f} ms"
        gain += f", confidence {rec.confidence:.0%})"
    changes = "; ".join(str(c) for c in rec.changes)
    return f"{changes}{gain}: {rec.reason}"


def alert_annotations(
    condition: Condition,
    rule: Rule,
    *,
    recommendation: StoredRecommendation | None,
    dashboard_url: str | None,
) -> dict[str, str]:
    """``summary``, ``description`` (what clears it), ``evidence`` (one line per
    figure, with units), ``recommendation`` and ``config_diff`` when the store holds a
    recommendation that changes the model's config, and ``link``."""
    annotations = {
        "summary": condition.summary,
        "description": f"{rule.name} on {condition.target}"
        + (f" / {condition.subject}" if condition.subject else "")
        + f"; resolves when {rule.resolves}.",
        "evidence": "\n".join(f"{k}: {v}" for k, v in evidence_items(condition.evidence)),
    }
    diff = config_diff(recommendation) if recommendation is not None else ""
    if recommendation is not None and diff:
        annotations["recommendation"] = _recommendation_text(recommendation)
        annotations["config_diff"] = diff
    model = condition.subject if condition.subject_label == "model" else ""
    link = model_link(dashboard_url, condition.target, model)
    if link:
        annotations["link"] = link
    return annotations
