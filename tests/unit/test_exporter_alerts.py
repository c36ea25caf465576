"""The exporter's alert families from a real store: ``batchscope_alert`` is 1 per alert
pending or firing (resolved ones are gone), with the subject as ``model`` or
``device``; ``batchscope_alert_notifications`` counts the outbox per receiver and
state, 0 where it holds none; and the exposition passes ``promtool check metrics``."""

from __future__ import annotations

import base64
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from alerts.engine import evaluate_alerts
from collector.config import AlertSettings, Settings
from collector.exporter.collectors import SnapshotCollector
from collector.exporter.snapshot import take_snapshot
from collector.store import Store
from collector.store.alerts import NewNotification

T0 = 1_800_000_000.0
TARGET = "triton-a"
SECRET = "whsec_" + base64.b64encode(b"batchscope-exporter-alerts-key!!").decode()
# Nothing listens there: the outbox only has to hold notifications, none is sent.
SETTINGS = Settings(
    alerts=AlertSettings(
        receivers=[
            {"name": "hook", "webhook": {"url": "http://127.0.0.1:9/hook", "secret": SECRET}},
            {"name": "am", "alertmanager": {"url": "http://127.0.0.1:9"}},
        ],
        routes=[{"match": {"rule": "idle_capacity"}, "receivers": ["am"]}, {"receivers": ["hook"]}],
        rules={"batching_off": {"for_s": 600}},
    )
)


def _finding(store: Store, kind: str, subject: str, at: float, **evidence: object) -> int:
    return store.add_finding(
        kind=kind,
        severity="warning",
        target=TARGET,
        subject=subject,
        summary=f"{subject}: {kind}",
        window_start=at - 30,
        window_end=at,
        evidence=dict(evidence),
        created_at=at,
    )


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    """Evaluated at T0: queue saturation on model ``m`` and an idle GPU fire (``for`` 0),
    batching off on ``m`` is pending (``for`` 600 s here); a queue saturation on ``old``
    fired and resolved. Nothing is delivered: every notification is pending."""
    s = Store(f"sqlite:///{tmp_path / 'alerts.db'}")
    old = _finding(s, "queue_saturation", "old", T0 - 60)
    evaluate_alerts(s, SETTINGS, now=T0 - 60)
    s.resolve_finding(old, T0 - 30)
    _finding(s, "queue_saturation", "m", T0)
    _finding(s, "batching_off", "m", T0)
    _finding(s, "idle_capacity", "GPU-1", T0, device_name="H200", device_kind="gpu")
    evaluate_alerts(s, SETTINGS, now=T0)
    try:
        yield s
    finally:
        s.close()


def _exposition(store: Store) -> str:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(
        SnapshotCollector(lambda: take_snapshot(store, window_s=60.0, now=T0, version="t"))
    )
    return generate_latest(registry).decode()


def _samples(text: str, name: str) -> list[dict[str, str]]:
    return [
        dict(s.labels, value=str(s.value))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name == name
    ]


def test_one_sample_per_pending_or_firing_alert(store: Store) -> None:
    alerts = _samples(_exposition(store), "batchscope_alert")
    by_rule = {(a["rule"], a["model"], a["device"]): a for a in alerts}
    assert set(by_rule) == {
        ("queue_saturation", "m", ""),
        ("batching_off", "m", ""),
        ("idle_capacity", "", "GPU-1"),
    }, "the resolved alert on 'old' is not exported"
    assert by_rule[("queue_saturation", "m", "")] == {
        "alertname": "BatchscopeQueueSaturation",
        "rule": "queue_saturation",
        "severity": "warning",
        "state": "firing",
        "target": TARGET,
        "model": "m",
        "device": "",
        "value": "1.0",
    }
    assert by_rule[("batching_off", "m", "")]["state"] == "pending"
    assert by_rule[("idle_capacity", "", "GPU-1")]["state"] == "firing"
    # The same alerts and states as the store holds.
    stored = {(s.rule, s.state) for s in store.alert_states() if s.state != "resolved"}
    assert {(a["rule"], a["state"]) for a in alerts} == stored


def test_the_outbox_per_receiver_and_state(store: Store) -> None:
    counts = {
        (n["receiver"], n["state"]): float(n["value"])
        for n in _samples(_exposition(store), "batchscope_alert_notifications")
    }
    stored = store.notification_counts()
    # hook (the catch-all route): 'old' firing and resolved, 'm' and the idle GPU
    # firing; am: the idle GPU firing.
    assert stored == {("hook", "pending"): 4, ("am", "pending"): 1}
    for receiver in ("hook", "am"):
        for state in ("pending", "delivered", "dead", "gone"):
            assert counts[(receiver, state)] == stored.get((receiver, state), 0)
    assert len(counts) == 8


def test_the_exposition_never_shows_a_secret_or_a_receiver_url(store: Store) -> None:
    # The store holds both, where a careless exporter could pick them up: a body, a
    # delivery's last error, a receiver's gone reason.
    leaky = f"{SECRET} http://127.0.0.1:9/hook"
    store.enqueue_notifications(
        [NewNotification("msg_leak", "hook", "fp-leak", "firing", leaky, T0)]
    )
    (queued,) = [n for n in store.notifications() if n.webhook_id == "msg_leak"]
    store.record_delivery_attempt(
        queued.id,
        state="dead",
        attempts=1,
        next_attempt_at=T0,
        last_status=None,
        last_error=leaky,
        finished_at=T0,
    )
    store.mark_receiver_gone("hook", T0, leaky)
    text = _exposition(store)
    assert SECRET.removeprefix("whsec_") not in text
    assert "127.0.0.1:9" not in text


def test_promtool_check_metrics_is_clean_with_alerts(store: Store) -> None:
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing (make system-deps installs Debian's prometheus)"
    text = _exposition(store)
    assert 'batchscope_alert{alertname="BatchscopeQueueSaturation"' in text
    checked = subprocess.run(
        [promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.strip() == "" and checked.stderr.strip() == ""
