"""A real Alertmanager (Debian's ``prometheus-alertmanager``), started on a free port
with a config this test writes: batchscope posts its alert to ``/api/v2/alerts``, and
Alertmanager forwards it through its own webhook config to a test receiver, firing,
then resolved once the condition clears. Bounded: each wait is a readiness poll with
a deadline, and Alertmanager is stopped also on failure."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from alerts.delivery import deliver_due
from alerts.engine import evaluate_alerts
from collector.config import AlertSettings, Settings
from collector.store import Store
from tests.alert_support import Alertmanager, Receiver
from tests.support import wait_until


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with Receiver() as r:
        yield r


@pytest.fixture
def alertmanager(tmp_path: Path, receiver: Receiver) -> Iterator[str]:
    """Alertmanager on a free port, routing everything to ``receiver`` at once (no
    group wait), resolved alerts included; yields its base URL."""
    with Alertmanager(
        tmp_path, receiver.url, group_by=("alertname", "target"), send_resolved=True
    ) as am:
        yield am.url


def _forwarded(receiver: Receiver, status: str) -> list[dict[str, object]]:
    return [
        doc
        for doc in (json.loads(r.body) for r in receiver.received if r.path == "/from-alertmanager")
        if doc["status"] == status
    ]


def test_alertmanager_forwards_our_alert_and_its_resolution(
    tmp_path: Path, alertmanager: str, receiver: Receiver
) -> None:
    alerts = AlertSettings(
        receivers=[{"name": "am", "alertmanager": {"url": alertmanager}}],
        dashboard_url="http://batchscope:8050",
    )
    settings = Settings(alerts=alerts)
    with Store(f"sqlite:///{tmp_path / 'am.db'}") as store:
        now = time.time()
        finding = store.add_finding(
            kind="batching_off",
            severity="warning",
            target="triton-a",
            subject="resnet",
            summary="resnet runs without dynamic batching while requests wait",
            window_start=now - 60,
            window_end=now,
            evidence={"requests_per_s": 120.0, "pending_mean": 3.5},
            created_at=now,
        )
        assert len(evaluate_alerts(store, settings, now=now).notifications) == 1
        assert deliver_due(store, alerts).delivered == 1

        # Alertmanager holds it, with our labels, and forwards it to its webhook.
        held = requests.get(f"{alertmanager}/api/v2/alerts", timeout=5).json()
        assert [a["labels"]["alertname"] for a in held] == ["BatchscopeBatchingOff"]
        assert held[0]["annotations"]["link"].endswith("/model?target=triton-a&model=resnet")
        wait_until(lambda: bool(_forwarded(receiver, "firing")), 20, "the firing alert forwarded")
        [firing] = _forwarded(receiver, "firing")
        [alert] = firing["alerts"]  # type: ignore[index]
        assert alert["labels"]["model"] == "resnet" and alert["labels"]["severity"] == "warning"
        assert "requests: 120 req/s" in alert["annotations"]["evidence"]

        # The condition clears: the resolution goes to Alertmanager, and on through it.
        store.resolve_finding(finding, time.time())
        report = evaluate_alerts(store, settings, now=time.time())
        assert [n.alert_status for n in report.notifications] == ["resolved"]
        assert deliver_due(store, alerts).delivered == 1
        wait_until(
            lambda: bool(_forwarded(receiver, "resolved")), 20, "the resolved alert forwarded"
        )
        [resolved] = _forwarded(receiver, "resolved")
        assert resolved["alerts"][0]["labels"]["alertname"] == "BatchscopeBatchingOff"  # type: ignore[index]
