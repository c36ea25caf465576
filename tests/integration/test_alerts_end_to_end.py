"""Alerts end to end on the CPU testbed: a model without dynamic batching, driven by
more closed-loop clients than its one instance serves, saturates its queue;
``batchscope serve`` (a subprocess) watching it opens the queue-saturation finding,
fires its alert within the rule's ``for`` plus one analysis interval, and posts it —
signed, in Alertmanager's webhook shape, carrying the recommended ``config.pbtxt``
change — to a real receiver on 127.0.0.1 that verifies every signature with the
``standardwebhooks`` package; when the load stops the finding clears and the
receiver is told the alert resolved.

The analysis runs at a pace a test sees: detectors every 5 s over an 8 s window, a
finding opening after two evaluations and clearing after two, the recommender on
every pass (the defaults — a minute's window, three evaluations — take minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from alerts.rules import RULES
from collector.store import Store
from collector.testbed.load import load_in_background
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer
from tests.alert_support import SECRET, Receiver
from tests.integration.conftest import TritonFactory
from tests.integration.prometheus_server import answers_200
from tests.support import free_port, start_process, stop_process, wait_until

pytestmark = pytest.mark.integration

# One instance, no dynamic batching: each request waits for every one ahead of it.
MODEL = ModelSpec("solo", fixed_ms=4.0, per_sample_ms=0.5, max_batch_size=32)
CLIENTS = 8  # about 8 ms of compute per request each: the queue holds ~7/8 of the time
ANALYSIS_EVERY_S = 5.0
SETTINGS = {
    "analysis_every_s": ANALYSIS_EVERY_S,
    "recommend_every_s": ANALYSIS_EVERY_S,
    # A pass 5 s after the last counts toward a streak (half the window apart).
    "analysis": {"window_s": 8, "sustain": 2, "clear_after": 2},
}
# Long enough for the finding to open (two counting passes) and the alert to fire,
# with room for a slow machine; the test waits for the firing alert, not this long.
LOAD_S = 30.0
DELIVERY_SLACK_S = 2.0  # the outbox is looked at every second
RULE = "queue_saturation"


@dataclass
class Watched:
    """The testbed, ``batchscope serve`` watching it into ``db_url``, and the receiver."""

    server: TritonServer
    db_url: str
    receiver: Receiver
    ui_url: str


@pytest.fixture(scope="module")
def watched(
    module_triton_factory: TritonFactory, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Watched]:
    server = module_triton_factory([MODEL])
    workdir = tmp_path_factory.mktemp("serve")
    db_url = f"sqlite:///{workdir / 'bs.db'}"
    port = free_port()
    ui_url = f"http://127.0.0.1:{port}"
    with Receiver(secret=SECRET) as receiver:
        hook = {"url": receiver.url + "/hook", "secret": SECRET}
        alerts = {"receivers": [{"name": "hook", "webhook": hook}], "dashboard_url": ui_url}
        config = workdir / "batchscope.yml"
        config.write_text(yaml.safe_dump({**SETTINGS, "alerts": alerts}))
        env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
        command = [sys.executable, "-m", "collector.cli", "serve"]
        command += ["--triton", server.http_url, "--metrics-url", server.metrics_url]
        command += ["--db", db_url, "--interval", "1", "--sources", "triton"]
        command += ["--port", str(port), "--config", str(config)]
        log = workdir / "serve.log"
        with log.open("wb") as out:
            proc = start_process(command, stdout=out, stderr=subprocess.STDOUT, env=env)
        try:
            wait_until(
                lambda: proc.poll() is not None or answers_200(ui_url + "/"), 60, "serve's UI"
            )
            assert proc.poll() is None, log.read_text()[-3000:]
            yield Watched(server, db_url, receiver, ui_url)
        finally:
            stop_process(proc)
            print(log.read_text()[-2000:])


def _bodies(receiver: Receiver, status: str) -> list[tuple[float, dict[str, Any]]]:
    """(arrival time, body) of each queue-saturation notification in ``status`` the
    receiver took, after dedupe by webhook-id, oldest first. (The model's batching-off
    alert fires too: its concurrent requests could be batched.)"""
    kept = receiver.delivered()
    firsts: dict[str, float] = {}
    for r in receiver.received:
        if r.headers["webhook-id"] in kept:
            firsts.setdefault(r.headers["webhook-id"], r.at)
    out = [(firsts[i], json.loads(body)) for i, body in kept.items()]
    return sorted(
        ((at, b) for at, b in out if b["status"] == status and b["commonLabels"]["rule"] == RULE),
        key=lambda pair: pair[0],
    )


def test_queue_saturation_fires_with_the_fix_and_resolves(watched: Watched) -> None:
    receiver = watched.receiver
    started = time.time()
    # Stopped once the alert fired (the block's end): the alert is what the load was
    # for, and the rest of LOAD_S would only delay the resolution.
    with load_in_background(
        watched.server.grpc_url, MODEL.name, concurrency=CLIENTS, duration_s=LOAD_S
    ) as result:
        wait_until(lambda: bool(_bodies(receiver, "firing")), LOAD_S, "the firing alert")
        fired_seen = time.time()
    load_ended = time.time()
    (res,) = result
    assert res.errors == 0, res.error_samples
    assert load_ended - fired_seen < 3.0, "the load went on after it was told to stop"
    wait_until(lambda: bool(_bodies(receiver, "resolved")), 45, "the resolved notification")
    resolved_seen = time.time()

    store = Store(watched.db_url)
    try:
        (finding,) = store.findings(kind=RULE)
        (state,) = [s for s in store.alert_states() if s.rule == RULE]
        recommendations = store.recommendations(model=MODEL.name)
    finally:
        store.close()
    print(
        f"load started at 0 s; finding opened at {finding.created_at - started:.1f} s; "
        f"alert fired at {(state.fired_at or 0) - started:.1f} s, its notification "
        f"arrived at {fired_seen - started:.1f} s; load ended at {load_ended - started:.1f} s; "
        f"finding resolved at {(finding.resolved_at or 0) - started:.1f} s; alert resolved "
        f"at {(state.resolved_at or 0) - started:.1f} s, its notification arrived at "
        f"{resolved_seen - started:.1f} s; {res.requests} requests"
    )

    # Fired within its for + one analysis interval of the finding opening.
    rule = RULES[RULE]
    assert state.fired_at is not None
    assert 0 <= state.fired_at - finding.created_at <= rule.for_s + ANALYSIS_EVERY_S
    (firing_at, firing), *_ = _bodies(receiver, "firing")
    assert firing_at - finding.created_at <= rule.for_s + ANALYSIS_EVERY_S + DELIVERY_SLACK_S
    assert all(r.verified for r in receiver.received), "every post verifies"

    # Alertmanager's webhook payload, version 4, one alert.
    assert firing["version"] == "4"
    assert firing["receiver"] == "hook"
    assert firing["externalURL"] == watched.ui_url
    (alert,) = firing["alerts"]
    assert alert["status"] == "firing"
    assert alert["labels"]["alertname"] == "BatchscopeQueueSaturation"
    assert alert["labels"]["model"] == MODEL.name
    assert alert["labels"]["target"] == finding.target
    notes = alert["annotations"]
    assert "queue" in notes["summary"]
    assert notes["link"].startswith(watched.ui_url + "/model?")

    # The fix: the recommendation stored by the firing pass, as a config.pbtxt diff.
    offered = [r for r in recommendations if r.created_at <= (state.fired_at or 0)]
    assert offered, "the recommender ran before the alert rules in the firing pass"
    assert notes["config_diff"], notes
    assert f"{MODEL.name}/config.pbtxt (recommended)" in notes["config_diff"]
    assert "+dynamic_batching" in notes["config_diff"]
    print(notes["config_diff"])

    # Resolved after the load stopped, to the same alert.
    assert finding.resolved_at is not None and finding.resolved_at >= load_ended
    assert state.state == "resolved"
    (_, resolved), *_ = _bodies(receiver, "resolved")
    (gone,) = resolved["alerts"]
    assert gone["fingerprint"] == alert["fingerprint"]
    assert gone["endsAt"] != "0001-01-01T00:00:00Z"
