"""The alert rules and what holds now: each rule, evaluated at ``now``, says for which
(target, subject) its condition holds and for which it was evaluated and is clear.

Nothing here computes a figure the analysis already has: the finding rules read the
detectors' open findings (their hysteresis already decided them), ``target_down``
reads each target's health (``collector.analysis.health`` via ``judge_targets``), and
``failure_rate`` and ``p95_above_objective`` read the model rows of
``collector.analysis.status.build_status`` (its rates and Triton's p95).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from collector.analysis.detect.detectors import (
    BATCH_BELOW_PREFERRED,
    BATCHING_OFF,
    DETECTOR_KINDS,
    IDLE_CAPACITY,
    QUEUE_SATURATION,
)
from collector.analysis.health import HealthState
from collector.analysis.status import ModelStatus, TargetStatus
from collector.config import AlertSettings
from collector.store import StoredFinding

__all__ = [
    "FAILURE_RATE",
    "P95_ABOVE_OBJECTIVE",
    "RULES",
    "RULE_NAMES",
    "TARGET_DOWN",
    "Condition",
    "Key",
    "Rule",
    "RuleOutcome",
    "finding_conditions",
    "model_conditions",
    "target_conditions",
]

TARGET_DOWN = "target_down"
FAILURE_RATE = "failure_rate"
P95_ABOVE_OBJECTIVE = "p95_above_objective"

Key = tuple[str, str, str]  # (rule, target, subject)
Evidence = dict[str, float | int | str | bool | None]


@dataclass(frozen=True)
class Rule:
    """One alert rule: its ``alertname`` label, default ``severity`` (a finding rule
    takes the finding's own unless the settings override it), how long its condition
    must hold before it fires (``for_s``), and what clears it (``resolves``)."""

    name: str
    alertname: str
    severity: str
    for_s: float
    resolves: str
    subject_label: str = "model"  # the label the subject goes under ("" for none)


def _finding_rule(kind: str, alertname: str, severity: str) -> Rule:
    # The detectors open a finding only after it held ``sustain`` evaluations, and
    # resolve it after ``clear_after`` clear ones: the alert needs no wait of its own.
    return Rule(kind, alertname, severity, 0.0, "the detector resolves its finding")


#: Every rule, by name.
RULES: Mapping[str, Rule] = {
    rule.name: rule
    for rule in (
        _finding_rule(IDLE_CAPACITY, "BatchscopeIdleCapacity", "warning"),
        _finding_rule(QUEUE_SATURATION, "BatchscopeQueueSaturation", "warning"),
        _finding_rule(BATCHING_OFF, "BatchscopeBatchingOff", "warning"),
        _finding_rule(BATCH_BELOW_PREFERRED, "BatchscopeBatchBelowPreferred", "info"),
        Rule(
            TARGET_DOWN,
            "BatchscopeTargetDown",
            "critical",
            60.0,
            "a scrape succeeds again",
            subject_label="",
        ),
        Rule(
            FAILURE_RATE,
            "BatchscopeFailureRate",
            "critical",
            120.0,
            "the failed share of requests drops below alerts.failure_share",
        ),
        Rule(
            P95_ABOVE_OBJECTIVE,
            "BatchscopeP95AboveObjective",
            "warning",
            300.0,
            "Triton's p95 is back within the model's slo_p95_ms",
        ),
    )
}
RULE_NAMES: tuple[str, ...] = tuple(RULES)
assert set(DETECTOR_KINDS) <= set(RULE_NAMES), "every finding kind is a rule"


@dataclass(frozen=True)
class Condition:
    """A rule holding for one (target, subject) now: the alert's severity, a one-line
    summary and the figures behind it (keys as ``collector.evidence`` labels them)."""

    rule: str
    target: str
    subject: str
    severity: str
    summary: str
    evidence: Evidence = field(default_factory=dict)
    subject_label: str = "model"

    @property
    def key(self) -> Key:
        return (self.rule, self.target, self.subject)


@dataclass
class RuleOutcome:
    """One evaluation of every rule: the conditions that hold, the keys evaluated and
    found clear (``clear``), and the rules for which anything not holding is clear
    (``complete``: the finding rules, whose findings are resolved by the detectors)."""

    holding: dict[Key, Condition] = field(default_factory=dict)
    clear: set[Key] = field(default_factory=set)
    complete: set[str] = field(default_factory=set)

    def add(self, condition: Condition) -> None:
        self.holding.setdefault(condition.key, condition)
        self.clear.discard(condition.key)

    def add_clear(self, key: Key) -> None:
        if key not in self.holding:
            self.clear.add(key)

    def is_clear(self, key: Key) -> bool:
        return key not in self.holding and (key in self.clear or key[0] in self.complete)


def finding_conditions(findings: Sequence[StoredFinding], outcome: RuleOutcome) -> None:
    """One condition per open finding of a detector kind."""
    outcome.complete.update(DETECTOR_KINDS)
    for f in findings:
        if f.kind not in DETECTOR_KINDS:
            continue
        # An idle GPU or MIG instance is named by its uuid; an idle model by its name.
        label = "device" if f.kind == IDLE_CAPACITY and "device_name" in f.evidence else "model"
        outcome.add(
            Condition(f.kind, f.target, f.subject, f.severity, f.summary, dict(f.evidence), label)
        )


def target_conditions(targets: Sequence[TargetStatus], outcome: RuleOutcome) -> None:
    """``target_down`` for each target judged down now; clear for each judged up.
    Stale (no collector ran lately) and unknown are no data: nothing is known now."""
    for t in targets:
        key = (TARGET_DOWN, t.name, "")
        if t.health.state is HealthState.DOWN:
            evidence: Evidence = {
                "reason": t.health.reason,
                "consecutive_failures": t.target.consecutive_failures,
                "last_error": t.target.last_error_kind,
            }
            outcome.add(
                Condition(
                    TARGET_DOWN,
                    t.name,
                    "",
                    RULES[TARGET_DOWN].severity,
                    f"{t.name} is down: {t.health.reason}",
                    evidence,
                    "",
                )
            )
        elif t.health.state is HealthState.UP:
            outcome.add_clear(key)


def model_conditions(
    models: Sequence[ModelStatus],
    settings: AlertSettings,
    slo_p95_ms: Mapping[str, float],
    outcome: RuleOutcome,
) -> None:
    """``failure_rate`` and ``p95_above_objective`` for each model with fresh rates
    (any of its versions holding makes the model's alert hold)."""
    for m in models:
        if not m.up or m.rates is None:
            continue
        share = m.rates.failed_share
        if share is not None:
            key = (FAILURE_RATE, m.target, m.model)
            if share >= settings.failure_share:
                outcome.add(
                    Condition(
                        FAILURE_RATE,
                        m.target,
                        m.model,
                        RULES[FAILURE_RATE].severity,
                        f"{m.model} on {m.target}: {share:.0%} of requests fail",
                        {
                            "failed_share": share,
                            "fail_per_s": m.rates.fail_per_s,
                            "requests_per_s": m.rates.requests_per_s,
                            "window_s": m.rates.window_s,
                        },
                    )
                )
            else:
                outcome.add_clear(key)
        objective = slo_p95_ms.get(m.model)
        if objective is None or m.request_p95_us is None:
            continue
        p95_ms = m.request_p95_us / 1e3
        key = (P95_ABOVE_OBJECTIVE, m.target, m.model)
        if p95_ms > objective:
            outcome.add(
                Condition(
                    P95_ABOVE_OBJECTIVE,
                    m.target,
                    m.model,
                    RULES[P95_ABOVE_OBJECTIVE].severity,
                    f"{m.model} on {m.target}: p95 {p95_ms:.1f} ms is above its "
                    f"objective of {objective:g} ms",
                    {"p95_ms": p95_ms, "p95_limit_ms": objective},
                )
            )
        else:
            outcome.add_clear(key)
