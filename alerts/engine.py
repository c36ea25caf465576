"""Rules → states → the outbox: one evaluation of every alert rule at ``now``.

Per alert (rule, target, subject; its fingerprint is the key in the store):

* the condition holds — no alert, or a resolved one: it becomes ``pending`` (its
  ``active_since`` now); a pending one turns ``firing`` once it has held the rule's
  ``for``; a firing one is notified to each receiver its labels route to when that
  receiver has not heard of it in this episode, or again after the repeat interval
  (Alertmanager receivers: their ``resend_s``), unless a silence matches;
* the condition is clear — a pending alert is forgotten; a firing one turns
  ``resolved`` and every receiver told it was firing is told it resolved (a silence
  does not hold that back: it would leave the receiver with an alert that never ends);
* no data (target stale, no fresh samples) — nothing changes, until the condition has
  not held for ``alerts.no_data_resolve_s``: then it counts as clear.

The new states and the notifications they cause are written in one transaction
(``Store.save_alert_evaluation``), so a restarted process neither fires an alert
again nor forgets one, and never loses a notification it decided to send.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from alerts.annotate import alert_annotations, alert_labels, fingerprint
from alerts.payloads import alertmanager_body, slack_body, webhook_body
from alerts.rules import (
    RULES,
    Condition,
    Key,
    Rule,
    RuleOutcome,
    finding_conditions,
    model_conditions,
    target_conditions,
)
from collector.analysis.status import build_status
from collector.config import AlertSettings, ReceiverSettings, Settings
from collector.store import Store, StoredRecommendation
from collector.store.alerts import AlertState, NewNotification, Silence

__all__ = [
    "STATUS_WINDOW_S",
    "AlertReport",
    "alert_job",
    "evaluate_alerts",
    "evaluate_rules",
    "evaluator_lease_s",
    "new_evaluator_id",
    "new_webhook_id",
    "render_body",
]

#: The window the model rules' rates and p95 are read over (as ``status`` reads them).
STATUS_WINDOW_S = 60.0


@dataclass(frozen=True)
class AlertReport:
    """What one evaluation did: the alerts by state afterwards and the notifications
    it put in the outbox."""

    at: float
    states: tuple[AlertState, ...] = ()
    notifications: tuple[NewNotification, ...] = ()
    evaluated: bool = True  # False: another process holds the evaluator lease

    def count(self, state: str) -> int:
        return sum(1 for s in self.states if s.state == state)


def effective_rules(settings: AlertSettings) -> dict[str, Rule]:
    """The enabled rules with the settings' ``for_s`` overrides."""
    rules: dict[str, Rule] = {}
    for name, rule in RULES.items():
        override = settings.rules.get(name)
        if override is not None and not override.enabled:
            continue
        if override is not None and override.for_s is not None:
            rule = replace(rule, for_s=override.for_s)
        rules[name] = rule
    return rules


def evaluate_rules(store: Store, settings: Settings, now: float) -> RuleOutcome:
    """Every rule's conditions at ``now``, from the open findings and the status."""
    outcome = RuleOutcome()
    finding_conditions(store.active_findings(), outcome)
    status = build_status(store, window_s=STATUS_WINDOW_S, now=now)
    target_conditions(status.targets, outcome)
    model_conditions(status.models, settings.alerts, settings.slo_p95_ms, outcome)
    return outcome


def new_webhook_id() -> str:
    """A notification's idempotency key (``webhook-id``), drawn once and stored."""
    return "msg_" + uuid.uuid4().hex


def render_body(
    alert: AlertState, status: str, receiver: ReceiverSettings, settings: AlertSettings, now: float
) -> str:
    """The body ``receiver`` is sent for ``alert`` in ``status``."""
    if receiver.webhook is not None:
        return webhook_body(
            alert, status, receiver=receiver.name, external_url=settings.dashboard_url or ""
        )
    if receiver.slack is not None:
        return slack_body(alert, status)
    assert receiver.alertmanager is not None
    return alertmanager_body(alert, status, now=now, resend_s=receiver.alertmanager.resend_s)


@dataclass
class _Evaluation:
    """One evaluation's inputs and what it decided so far."""

    settings: AlertSettings
    now: float
    silences: Sequence[Silence]
    last_notified: Mapping[tuple[str, str], float]
    store: Store
    # The latest recommendation per (target, model), read once when first needed.
    latest_recommendations: dict[tuple[str, str], StoredRecommendation] | None = None
    changed: list[AlertState] = field(default_factory=list)
    forget: list[str] = field(default_factory=list)
    notifications: list[NewNotification] = field(default_factory=list)

    def holds(self, state: AlertState | None, condition: Condition, rule: Rule) -> None:
        override = self.settings.rules.get(rule.name)
        severity = (override.severity if override else None) or condition.severity
        labels = alert_labels(condition, rule, severity)
        annotations = alert_annotations(
            condition,
            rule,
            recommendation=self.recommendation(condition),
            dashboard_url=self.settings.dashboard_url,
        )
        if state is None or state.state == "resolved":
            state = AlertState(
                fingerprint=fingerprint(*condition.key),
                rule=rule.name,
                target=condition.target,
                subject=condition.subject,
                state="pending",
                severity=severity,
                active_since=self.now,
                evaluated_at=self.now,
                held_at=self.now,
            )
        state = replace(
            state,
            severity=severity,
            labels=labels,
            annotations=annotations,
            evaluated_at=self.now,
            held_at=self.now,
        )
        if state.state == "pending" and self.now - state.active_since >= rule.for_s:
            state = replace(state, state="firing", fired_at=self.now)
        self.changed.append(state)
        if state.state == "firing":
            self.notify_firing(state)

    def recommendation(self, condition: Condition) -> StoredRecommendation | None:
        """The model's latest recommendation while it is open (not applied since)."""
        if condition.subject_label != "model" or not condition.subject:
            return None
        if self.latest_recommendations is None:
            self.latest_recommendations = {
                (r.target, r.model): r for r in self.store.latest_recommendations()
            }
        latest = self.latest_recommendations.get((condition.target, condition.subject))
        return latest if latest is not None and latest.status == "open" else None

    def clear(self, state: AlertState) -> None:
        if state.state == "pending":
            self.forget.append(state.fingerprint)
        elif state.state == "firing":
            resolved = replace(state, state="resolved", resolved_at=self.now, evaluated_at=self.now)
            self.changed.append(resolved)
            for name in self._told_this_episode(state):
                self._enqueue(resolved, "resolved", name)

    def no_data(self, state: AlertState) -> None:
        if state.state == "resolved":
            return
        if self.now - state.held_at >= self.settings.no_data_resolve_s:
            self.clear(state)
            return
        if state.state == "firing":
            self.notify_firing(state)

    def notify_firing(self, state: AlertState) -> None:
        if any(s.matches(state, self.now) for s in self.silences):
            return
        for name in self.settings.receivers_for(state.labels):
            last = self.last_notified.get((state.fingerprint, name))
            first_in_episode = last is None or last < state.active_since
            if first_in_episode or self.now - (last or 0.0) >= self._repeat_s(name):
                self._enqueue(state, "firing", name)

    def _repeat_s(self, name: str) -> float:
        receiver = self.settings.receiver(name)
        if receiver.alertmanager is not None:
            return receiver.alertmanager.resend_s
        return self.settings.repeat_interval_s

    def _told_this_episode(self, state: AlertState) -> list[str]:
        return [
            name
            for (fp, name), at in self.last_notified.items()
            if fp == state.fingerprint and at >= state.active_since
        ]

    def _enqueue(self, state: AlertState, status: str, name: str) -> None:
        try:
            receiver = self.settings.receiver(name)
        except KeyError:
            return  # told once, since removed from the settings
        body = render_body(state, status, receiver, self.settings, self.now)
        self.notifications.append(
            NewNotification(new_webhook_id(), name, state.fingerprint, status, body, self.now)
        )


def evaluate_alerts(
    store: Store, settings: Settings, *, now: float | None = None, holder: str | None = None
) -> AlertReport:
    """Evaluate every enabled rule at ``now`` and move each alert on (see the module
    docstring); returns the alerts afterwards and the notifications put in the outbox.

    With ``holder`` (a process's evaluator id), nothing is evaluated unless it holds
    the store's evaluator lease (``Store.hold_alert_evaluation``): one process per
    store decides, so receivers never hear of an alert twice."""
    now = time.time() if now is None else now
    if holder is not None and not store.hold_alert_evaluation(
        holder, now, evaluator_lease_s(settings)
    ):
        return AlertReport(at=now, states=tuple(store.alert_states()), evaluated=False)
    rules = effective_rules(settings.alerts)
    outcome = evaluate_rules(store, settings, now)
    existing = {(s.rule, s.target, s.subject): s for s in store.alert_states()}
    evaluation = _Evaluation(
        settings=settings.alerts,
        now=now,
        silences=store.silences(active_at=now),
        last_notified=store.last_notified([s.fingerprint for s in existing.values()]),
        store=store,
    )
    keys: set[Key] = set(existing) | {k for k in outcome.holding if k[0] in rules}
    for key in sorted(keys):
        state = existing.get(key)
        condition = outcome.holding.get(key)
        rule = rules.get(key[0])
        if rule is not None and condition is not None:
            evaluation.holds(state, condition, rule)
        elif state is None:
            continue
        elif rule is None or outcome.is_clear(key):  # a disabled rule's alerts clear
            evaluation.clear(state)
        else:
            evaluation.no_data(state)
    store.save_alert_evaluation(
        evaluation.changed, forget=evaluation.forget, notifications=evaluation.notifications
    )
    return AlertReport(
        at=now,
        states=tuple(store.alert_states()),
        notifications=tuple(evaluation.notifications),
    )


def evaluator_lease_s(settings: Settings) -> float:
    """How long an evaluator's hold on a store lasts without a renewal: three analysis
    passes (at least 30 s), so one slow pass does not hand it to another process."""
    return max(3 * settings.analysis_every_s, 30.0)


def new_evaluator_id() -> str:
    """This evaluator's id for the store's evaluator lease."""
    return f"evaluator-{uuid.uuid4().hex}"


def alert_job(
    settings: Settings, *, holder: str | None = None
) -> Callable[[Store, float], AlertReport]:
    """The alert rules as a scheduler analysis (``CollectorService(analyses=[...])``),
    run after the detectors so that it reads this pass's findings; it evaluates only
    while ``holder`` (default: a new evaluator id) holds the store's evaluator lease."""
    holder = holder or new_evaluator_id()

    def evaluate_alerts_job(store: Store, now: float) -> AlertReport:
        return evaluate_alerts(store, settings, now=now, holder=holder)

    return evaluate_alerts_job
