"""Alert delivery under receiver faults: receivers down (connection refused), slow
(answering after the delivery timeout), answering 4xx and 5xx, and a real
Alertmanager restarted while alerts are being sent. Every alert is delivered exactly
once after dedupe by webhook-id, or ends dead (or gone) in the store with its reason,
shown by ``batchscope alerts``; never silently dropped: the outbox's counts of sent,
delivered, dead and gone add up, and match what the receivers got."""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import requests
from plotly.utils import PlotlyJSONEncoder

from alerts.delivery import DeliveryWorker, deliver_due
from alerts.engine import evaluate_alerts
from collector.config import AlertSettings, Settings
from collector.store import Store
from dashboard.components.alerts import outbox_panel
from dashboard.queries.alerts import read_alerts
from tests.alert_support import Alertmanager, Receiver, add_saturation_findings
from tests.reliability.alerts_support import PlannedReceiver, outbox_counts
from tests.reliability.conftest import FaultLedger
from tests.support import free_port, wait_until

POLL_S = 0.05


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'alerts.db'}") as s:
        yield s


def settings(receivers: dict[str, str], routes: dict[str, Sequence[str]], **extra: Any) -> Settings:
    """Webhook receivers by name -> base URL, and which models go to which receivers."""
    alerts = AlertSettings.model_validate(
        {
            "receivers": [
                {"name": n, "webhook": {"url": url + "/hook"}} for n, url in receivers.items()
            ],
            "routes": [
                {"match": {"model": model}, "receivers": [name]}
                for name, models in routes.items()
                for model in models
            ],
            **extra,
        }
    )
    return Settings.model_validate({"alerts": alerts})


def fire(store: Store, config: Settings, models: Sequence[str]) -> list[str]:
    """A firing alert per model; returns the webhook-ids put in the outbox."""
    now = time.time()
    add_saturation_findings(store, models, now)
    report = evaluate_alerts(store, config, now=now)
    assert len(report.notifications) == len(models)
    return [n.webhook_id for n in report.notifications]


def settle(store: Store, timeout_s: float) -> None:
    """Wait until nothing is pending in the outbox."""
    wait_until(lambda: outbox_counts(store)["pending"] == 0, timeout_s, "an empty outbox")


def ids_of(store: Store, receiver: str, state: str) -> set[str]:
    return {n.webhook_id for n in store.notifications(state=state) if n.receiver == receiver}


def cli_failed(db: str) -> list[dict[str, Any]]:
    """The dead and gone notifications as ``batchscope alerts --json`` lists them."""
    out = subprocess.run(
        [sys.executable, "-m", "collector.cli", "alerts", "--db", db, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    failed: list[dict[str, Any]] = json.loads(out.stdout)["failed"]
    return failed


def test_receiver_down_is_retried_then_dead_or_delivered_once_back(
    store: Store, fault_ledger: FaultLedger
) -> None:
    down_url = f"http://127.0.0.1:{free_port()}"
    back_port = free_port()
    down_models = [f"down{i}" for i in range(5)]
    back_models = [f"back{i}" for i in range(5)]
    config = settings(
        {"down": down_url, "back": f"http://127.0.0.1:{back_port}"},
        {"down": down_models, "back": back_models},
        max_attempts=4,
        backoff_s=0.1,
        backoff_max_s=0.4,
    )
    down_ids = fire(store, config, down_models)
    back_ids = fire(store, config, back_models)
    started = time.monotonic()
    with DeliveryWorker(store, config.alerts, poll_s=POLL_S):
        # "back" is down for each notification's first try, then comes up on its port.
        wait_until(
            lambda: all(n.attempts >= 1 for n in store.notifications() if n.receiver == "back"),
            10,
            "a refused first try of every notification",
        )
        with PlannedReceiver(lambda _id, _n: (200, 0.0), port=back_port) as back:
            settle(store, 15)
        took = time.monotonic() - started
    down = store.notifications(state="dead")
    assert {n.webhook_id for n in down} == set(down_ids)
    assert {(n.attempts, n.last_error) for n in down} == {(4, "no answer: ConnectionError")}
    assert ids_of(store, "back", "delivered") == set(back_ids) == set(back.delivered())
    assert back.requests() == len(back_ids)  # each once: nothing posted twice
    counts = outbox_counts(store)
    assert counts == {"pending": 0, "delivered": 5, "dead": 5, "gone": 0}
    fault_ledger.record(
        area="alerts",
        fault="webhook receiver down (connection refused) for good, and down for one try",
        tries=len(down_ids) + len(back_ids),
        outcome=f"sent 10: the 5 to the receiver that stayed down dead after 4 tries each with "
        f"'no answer: ConnectionError'; the 5 to the one that came back delivered once each "
        f"({back.requests()} requests); outbox settled in {took:.1f} s",
    )


def test_slow_receiver_times_out_is_retried_and_does_not_hold_up_others(
    store: Store, fault_ledger: FaultLedger
) -> None:
    timeout_s = 0.5
    slow_models = [f"slow{i}" for i in range(6)]
    fast_models = [f"fast{i}" for i in range(6)]
    # The slow receiver answers every first try 200 after 1.5 s (the sender has given up
    # by then: the alert arrived but looks failed), later tries at once.
    with (
        PlannedReceiver(lambda _id, n: (200, 1.5 if n == 1 else 0.0)) as slow,
        PlannedReceiver(lambda _id, _n: (200, 0.0)) as fast,
    ):
        config = settings(
            {"slow": slow.url, "fast": fast.url},
            {"slow": slow_models, "fast": fast_models},
            timeout_s=timeout_s,
            max_attempts=5,
            backoff_s=0.1,
            backoff_max_s=0.2,
        )
        slow_ids = fire(store, config, slow_models)  # older: ahead in the outbox
        fast_ids = fire(store, config, fast_models)
        started = time.monotonic()
        with DeliveryWorker(store, config.alerts, poll_s=POLL_S):
            wait_until(
                lambda: set(fast.delivered()) == set(fast_ids), 20, "the fast receiver's alerts"
            )
            fast_took = time.monotonic() - started
            settle(store, 30)
            took = time.monotonic() - started
        # Every alert once after dedupe; each slow one was posted twice (at least once).
        assert set(slow.delivered()) == set(slow_ids) == ids_of(store, "slow", "delivered")
        assert set(fast.delivered()) == set(fast_ids) == ids_of(store, "fast", "delivered")
        assert fast.requests() == len(fast_ids)
        slow_requests = slow.requests()
        assert slow_requests == 2 * len(slow_ids)
        timed_out = [n for n in store.notifications() if n.receiver == "slow"]
        assert {n.attempts for n in timed_out} == {2}
        assert outbox_counts(store) == {"pending": 0, "delivered": 12, "dead": 0, "gone": 0}
    # A receiver that did not answer is not tried again within one delivery pass, so the
    # other receivers' alerts wait for at most one timeout, not one per slow alert.
    assert fast_took < 4 * timeout_s, f"fast receiver waited {fast_took:.2f} s"
    fault_ledger.record(
        area="alerts",
        fault=f"webhook receiver answering after 1.5 s, past the {timeout_s:g} s delivery timeout",
        tries=len(slow_ids),
        outcome=f"sent 12: each of the 6 slow ones timed out once and was posted again "
        f"({slow_requests} requests), 6 distinct webhook-ids kept after dedupe; the other "
        f"receiver's 6 delivered within {fast_took:.2f} s, not held up; all 12 delivered "
        f"in {took:.1f} s",
    )


def test_4xx_answers_are_dead_at_once_with_the_reason(
    store: Store, tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    statuses = (400, 401, 404, 410)
    models = {status: [f"m{status}-{i}" for i in range(3)] for status in statuses}
    receivers = [PlannedReceiver(lambda _id, _n, s=s: (s, 0.0)) for s in statuses]  # type: ignore[misc]
    with contextlib.ExitStack() as running:  # each stopped, even if a later one fails
        for r in receivers:
            running.enter_context(r)
        config = settings(
            {f"r{s}": r.url for s, r in zip(statuses, receivers, strict=True)},
            {f"r{s}": models[s] for s in statuses},
            max_attempts=6,
            backoff_s=0.1,
            backoff_max_s=0.2,
        )
        sent = {s: fire(store, config, models[s]) for s in statuses}
        started = time.monotonic()
        with DeliveryWorker(store, config.alerts, poll_s=POLL_S):
            settle(store, 10)
        took = time.monotonic() - started
    failed = {f["webhook_id"]: f for f in cli_failed(f"sqlite:///{tmp_path / 'alerts.db'}")}
    # The alerts page lists each with its reason too.
    view = read_alerts(store, time.time())
    page = json.dumps(outbox_panel(view.outbox, view.failed), cls=PlotlyJSONEncoder)
    rows: list[dict[str, Any]] = []
    for status, receiver in zip(statuses, receivers, strict=True):
        name = f"r{status}"
        ids = set(sent[status])
        assert set(failed) >= ids, f"{name}: not all listed by batchscope alerts"
        assert all(i in page for i in ids) and f"HTTP {status}" in page, name
        assert set(receiver.delivered()) == set()
        if status == 410:
            # Gone: the first answer marks the receiver; nothing more is sent to it.
            assert receiver.requests() == 1
            assert ids_of(store, name, "gone") == ids
            assert store.receivers_gone() == {name: "answered 410 Gone"}
            reasons = {failed[i]["last_error"] for i in ids}
            assert reasons <= {
                "HTTP 410: ",
                "answered 410 Gone",
                "receiver gone: answered 410 Gone",
            }
        else:
            # Not tried again: another try gets the same refusal.
            assert receiver.requests() == len(ids)
            assert ids_of(store, name, "dead") == ids
            assert {(failed[i]["attempts"], failed[i]["last_status"]) for i in ids} == {(1, status)}
            assert all(failed[i]["last_error"].startswith(f"HTTP {status}") for i in ids)
        rows.append(
            {
                "area": "alerts",
                "fault": f"webhook receiver answering {status}",
                "tries": len(ids),
                "outcome": (
                    f"3 sent, 1 request: the receiver marked gone, all 3 'gone' with the "
                    f"reason in `batchscope alerts` and on the alerts page (outbox settled in "
                    f"{took:.1f} s)"
                    if status == 410
                    else f"3 sent, {receiver.requests()} requests: each dead after its one "
                    f"try with 'HTTP {status}' in `batchscope alerts` and on the alerts page, "
                    f"not retried (outbox settled in {took:.1f} s)"
                ),
            }
        )
    assert outbox_counts(store) == {"pending": 0, "delivered": 0, "dead": 9, "gone": 3}
    for row in rows:  # recorded once every assertion passed
        fault_ledger.record(**row)


def test_5xx_answers_are_retried_with_backoff_then_delivered_or_dead(
    store: Store, fault_ledger: FaultLedger
) -> None:
    flaky_codes = (500, 502, 503)
    recovering_models = [f"rec{i}" for i in range(4)]
    broken_models = [f"brk{i}" for i in range(4)]
    with (
        PlannedReceiver(
            lambda _id, n: (flaky_codes[n - 1] if n <= len(flaky_codes) else 200, 0.0)
        ) as recovering,
        PlannedReceiver(lambda _id, _n: (503, 0.0)) as broken,
    ):
        config = settings(
            {"recovering": recovering.url, "broken": broken.url},
            {"recovering": recovering_models, "broken": broken_models},
            max_attempts=5,
            backoff_s=0.1,
            backoff_max_s=0.4,
        )
        recovering_ids = fire(store, config, recovering_models)
        broken_ids = fire(store, config, broken_models)
        started = time.monotonic()
        with DeliveryWorker(store, config.alerts, poll_s=POLL_S):
            settle(store, 20)
        took = time.monotonic() - started
    assert (
        set(recovering.delivered())
        == set(recovering_ids)
        == ids_of(store, "recovering", "delivered")
    )
    assert recovering.requests() == 4 * len(recovering_ids)  # 500, 502, 503, then 200
    dead = [n for n in store.notifications(state="dead")]
    assert {n.webhook_id for n in dead} == set(broken_ids)
    assert {(n.attempts, n.last_status) for n in dead} == {(5, 503)}
    assert broken.requests() == 5 * len(broken_ids)
    # Backoff: the k-th wait at least half of 0.1 × 2^(k-1) (capped at 0.4), and growing.
    gaps: dict[str, list[float]] = {}
    for h in broken.hits:
        gaps.setdefault(h.webhook_id, []).append(h.at)
    shortest = [
        min(times[k + 1] - times[k] for times in gaps.values()) for k in range(len(flaky_codes))
    ]
    for k, gap in enumerate(shortest, start=1):
        assert gap >= min(0.1 * 2 ** (k - 1), 0.4) / 2 - 0.01, (k, shortest)
    assert outbox_counts(store) == {"pending": 0, "delivered": 4, "dead": 4, "gone": 0}
    fault_ledger.record(
        area="alerts",
        fault="webhook receiver answering 500, 502, 503 then 200; another answering 503 always",
        tries=len(recovering_ids) + len(broken_ids),
        outcome=f"sent 8: the 4 recovering ones delivered once each after 3 retries "
        f"({recovering.requests()} requests, 4 distinct after dedupe); the 4 to the broken one "
        f"dead after the 5-try budget with 'HTTP 503'; shortest waits between tries "
        f"{', '.join(f'{g:.2f}' for g in shortest)} s (backoff 0.1 s doubling); "
        f"settled in {took:.1f} s",
    )


def test_alertmanager_restarted_while_alerts_are_sent(
    store: Store, tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    models = [f"am{i:02d}" for i in range(24)]
    with Receiver() as forwarded:
        am = Alertmanager(tmp_path, forwarded.url, group_by=("alertname", "model"))
        try:
            am.start()
            alerts = {
                "receivers": [{"name": "am", "alertmanager": {"url": am.url}}],
                "max_attempts": 20,
                "backoff_s": 0.1,
                "backoff_max_s": 0.5,
            }
            config = Settings.model_validate({"alerts": alerts})
            sent: list[str] = []
            errors: list[BaseException] = []

            def firing() -> None:  # an alert every 0.1 s while Alertmanager restarts
                try:
                    for model in models:
                        sent.extend(fire(store, config, [model]))
                        time.sleep(0.1)
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            started = time.monotonic()
            with DeliveryWorker(store, config.alerts, poll_s=POLL_S):
                thread = threading.Thread(target=firing)
                thread.start()
                try:
                    wait_until(lambda: len(sent) >= 6, 10, "the first alerts sent")
                    am.stop()
                    down_at = len(sent)
                    wait_until(lambda: len(sent) >= down_at + 4, 10, "alerts sent while down")
                    refused = sum(
                        1
                        for n in store.notifications()
                        if n.attempts >= 1 and n.last_status is None  # tried, no answer
                    )
                    am.start()
                finally:
                    thread.join(timeout=30)
                assert not errors, errors
                settle(store, 20)
                took = time.monotonic() - started

            def forwarded_models() -> set[str]:
                out: set[str] = set()
                for r in forwarded.received:
                    for alert in json.loads(r.body)["alerts"]:
                        out.add(alert["labels"]["model"])
                return out

            # What came while it was down was retried and forwarded.
            wait_until(
                lambda: forwarded_models() >= set(models[down_at:]), 20, "the retried alerts"
            )
            # Alertmanager keeps alerts in memory only: one it took just before it stopped
            # may be lost with it. Firing alerts are sent to it again every resend_s (as
            # Prometheus does), and after that it holds every one.
            later = time.time() + 60.0
            resent = evaluate_alerts(store, config, now=later).notifications
            assert deliver_due(store, config.alerts, now=later).delivered == len(resent)
            held = {a["labels"]["model"] for a in requests.get(f"{am.url}/api/v2/alerts").json()}
            wait_until(lambda: forwarded_models() == set(models), 20, "every alert forwarded")
        finally:
            am.stop()
    assert len(sent) == len(models) and len(resent) == len(models)
    assert ids_of(store, "am", "delivered") == set(sent) | {n.webhook_id for n in resent}
    assert outbox_counts(store) == {
        "pending": 0,
        "delivered": 2 * len(models),
        "dead": 0,
        "gone": 0,
    }
    assert held == set(models)
    assert refused >= 1  # the restart was seen by the sender
    fault_ledger.record(
        area="alerts",
        fault="Alertmanager stopped and started again while an alert was sent every 0.1 s",
        tries=len(models),
        outcome=f"sent {len(models)}: {refused} found it down and were retried; all "
        f"{len(models)} delivered (0 dead) in {took:.1f} s; after the resend interval all "
        f"{len(models)} sent again and delivered; Alertmanager holds all {len(held)} and "
        f"forwarded every one",
    )
