"""The alerts inside the processes that analyse: ``batchscope collect`` (a real
subprocess) and the exporter evaluate the rules after each analysis pass and deliver
to the receivers of their settings — a real HTTP receiver on 127.0.0.1 that verifies
every signature with the ``standardwebhooks`` package; two processes on one store
notify once (the evaluator lease); without receivers the states are still kept and
no delivery thread runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from alerts.runtime import AlertsInProcess
from collector.config import AlertSettings, Settings
from collector.exporter.service import Exporter
from collector.store import Store
from tests.alert_support import SECRET, Receiver
from tests.support import wait_until

TARGET = "triton-a"


def _saturated(store: Store, model: str = "m") -> None:
    """An open queue-saturation finding, as the detectors would have opened it now."""
    now = time.time()
    store.add_finding(
        kind="queue_saturation",
        severity="warning",
        target=TARGET,
        subject=model,
        summary=f"{model}: queue-delay saturation",
        window_start=now - 20,
        window_end=now,
        evidence={"queue_share": 0.9},
        created_at=now,
    )


def _alerts_section(url: str) -> dict[str, object]:
    hook = {"url": url + "/hook", "secret": SECRET}
    return {"receivers": [{"name": "hook", "webhook": hook}]}


def _firing(receiver: Receiver) -> list[dict[str, object]]:
    bodies = [json.loads(body) for body in receiver.delivered().values()]
    return [b for b in bodies if b["status"] == "firing"]


def test_collect_evaluates_and_delivers_after_each_analysis_pass(tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path / 'collect.db'}"
    with Store(db) as store:
        _saturated(store)
    with Receiver(secret=SECRET) as receiver:
        config = tmp_path / "batchscope.yml"
        settings = {"analysis_every_s": 1, "alerts": _alerts_section(receiver.url)}
        config.write_text(yaml.safe_dump(settings))
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
        # A GPU-only collector needs no Triton; its analyses read the store as ever.
        command = [sys.executable, "-m", "collector.cli", "collect", "--sources", "nvml"]
        command += ["--interval", "1", "--db", db, "--config", str(config)]
        for run in (1, 2):
            started = time.time()
            done = subprocess.run(
                [*command, "--duration", "3"], env=env, capture_output=True, text=True, timeout=60
            )
            assert done.returncode == 0, done.stderr[-3000:]
            (firing,) = _firing(receiver)  # run 2 continues the stored state: no repeat
            assert all(r.verified for r in receiver.received), run
            with Store(db) as store:
                (state,) = store.alert_states()
            # Run 1 handed the evaluator lease back on stopping: run 2 evaluated at once.
            assert state.evaluated_at > started, run
    assert firing["receiver"] == "hook"
    (alert,) = firing["alerts"]
    assert alert["labels"]["alertname"] == "BatchscopeQueueSaturation"
    assert alert["labels"]["model"] == "m"
    with Store(db) as store:
        (state,) = store.alert_states()
        assert state.state == "firing"
        assert store.notification_counts() == {("hook", "delivered"): 1}


def _metrics(url: str) -> str:
    with urllib.request.urlopen(url + "metrics", timeout=10) as response:
        text: str = response.read().decode()
        return text


def test_the_exporter_delivers_and_exposes_the_alert(tmp_path: Path) -> None:
    with Receiver(secret=SECRET) as receiver:
        settings = Settings(
            db_url=f"sqlite:///{tmp_path / 'exporter.db'}",
            sources=("host",),
            interval_s=1.0,
            analysis_every_s=1.0,
            alerts=AlertSettings(**_alerts_section(receiver.url)),
        )
        exporter = Exporter(settings, host="127.0.0.1", port=0)
        try:
            exporter.start()
            _saturated(exporter.store)
            wait_until(lambda: bool(_firing(receiver)), 30, "the firing notification")
            wait_until(
                lambda: exporter.store.notification_counts() == {("hook", "delivered"): 1},
                30,
                "the outbox to show it delivered",
            )
            text = _metrics(exporter.url)
        finally:
            exporter.close()
        assert exporter.alerts.delivery is not None
        assert exporter.alerts.delivery._thread is None, "delivery stops with the exporter"
    assert all(r.verified for r in receiver.received)
    assert (
        'batchscope_alert{alertname="BatchscopeQueueSaturation",device="",model="m",'
        'rule="queue_saturation",severity="warning",state="firing",target="triton-a"} 1.0'
    ) in text
    assert 'batchscope_alert_notifications{receiver="hook",state="delivered"} 1.0' in text
    assert 'batchscope_alert_notifications{receiver="hook",state="dead"} 0.0' in text
    assert SECRET.removeprefix("whsec_") not in text


def test_two_processes_on_one_store_notify_once(tmp_path: Path) -> None:
    """serve (or collect, or an exporter) and an ``alerts run`` on one store: each
    evaluates after its analysis pass, only the holder of the lease decides."""
    settings = Settings(alerts=AlertSettings(**_alerts_section("http://127.0.0.1:9")))
    with Store(f"sqlite:///{tmp_path / 'shared.db'}") as store:
        _saturated(store)
        first, second = AlertsInProcess(store, settings), AlertsInProcess(store, settings)
        now = time.time()
        for at in (now, now + 1, now + 2):
            for process in (second, first):
                for job in process.jobs:
                    job(store, at)
        assert store.notification_counts() == {("hook", "pending"): 1}
        (state,) = store.alert_states()
        assert state.state == "firing"
        # The first to evaluate (``second``) stops: the other takes over at its next pass.
        assert not first.jobs[0](store, now + 3).evaluated
        second.stop()
        assert first.jobs[0](store, now + 4).evaluated
        assert store.notification_counts() == {("hook", "pending"): 1}


def test_without_receivers_states_are_kept_and_nothing_is_delivered(tmp_path: Path) -> None:
    with Store(f"sqlite:///{tmp_path / 'quiet.db'}") as store:
        _saturated(store)
        alerting = AlertsInProcess(store, Settings())
        assert alerting.delivery is None
        with alerting:
            for job in alerting.jobs:
                job(store, time.time())
        (state,) = store.alert_states()
        assert (state.rule, state.subject, state.state) == ("queue_saturation", "m", "firing")
        assert store.notification_counts() == {}


@pytest.mark.parametrize(
    "backend", ["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)]
)
def test_a_released_lease_goes_to_the_next_evaluator_at_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    url = (
        f"sqlite:///{tmp_path / 'lease.db'}"
        if backend == "sqlite"
        else str(request.getfixturevalue("pg_url"))
    )
    with Store(url) as store:
        assert store.hold_alert_evaluation("a", 100.0, 30)
        assert not store.release_alert_evaluation("b"), "only the holder hands it back"
        assert not store.hold_alert_evaluation("b", 101.0, 30)
        assert store.release_alert_evaluation("a")
        assert store.hold_alert_evaluation("b", 102.0, 30)  # not waiting until 130
        assert not store.hold_alert_evaluation("a", 103.0, 30)
