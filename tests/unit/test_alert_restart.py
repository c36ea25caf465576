"""At least once through SIGKILL: ``batchscope alerts run`` (a real process) is killed
with SIGKILL while the receiver is down, and again while a post is in flight; started
once more, it delivers every notification the first ones left pending, and after
dedupe by webhook-id the receiver has every alert exactly once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from alerts.engine import evaluate_alerts
from collector.config import load_settings
from collector.store import Store
from tests.alert_support import SECRET, Receiver, add_saturation_findings
from tests.support import free_port, wait_until

MODELS = ("m1", "m2", "m3")


class Runs:
    """``batchscope alerts run`` processes on one store; every one is killed at the end."""

    def __init__(self, cfg: Path, db: str, log_dir: Path) -> None:
        self._args = [sys.executable, "-m", "collector.cli", "alerts", "run"]
        self._args += ["--deliver-only", "--config", str(cfg), "--db", db]
        self._log_dir = log_dir
        self.processes: list[subprocess.Popen[bytes]] = []

    def start(self) -> subprocess.Popen[bytes]:
        log = (self._log_dir / f"run{len(self.processes)}.log").open("wb")
        process = subprocess.Popen(self._args, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        self.processes.append(process)
        return process

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


@pytest.fixture
def runs(tmp_path: Path) -> Iterator[tuple[Runs, str, int]]:
    port = free_port()
    cfg = tmp_path / "alerts.yaml"
    cfg.write_text(
        "analysis_every_s: 0.2\n"
        "alerts:\n"
        "  receivers:\n"
        f"    - {{name: hook, webhook: {{url: 'http://127.0.0.1:{port}/hook', "
        f"secret: '{SECRET}'}}}}\n"
        "  max_attempts: 100\n  backoff_s: 0.1\n  backoff_max_s: 0.3\n"
        "  timeout_s: 0.5\n  deliver_every_s: 0.1\n"
    )
    db = f"sqlite:///{tmp_path / 'restart.db'}"
    settings = load_settings(config_file=cfg, env={}, overrides={"db_url": db})
    now = time.time()
    with Store(db) as store:
        add_saturation_findings(store, MODELS, now)
        assert len(evaluate_alerts(store, settings, now=now).notifications) == len(MODELS)
    started = Runs(cfg, db, tmp_path)
    try:
        yield started, db, port
    finally:
        started.close()


def _attempts(db: str) -> list[int]:
    with Store(db) as store:
        return [n.attempts for n in store.notifications()]


def test_killed_while_the_receiver_is_down_and_mid_post_every_alert_arrives_once(
    runs: tuple[Runs, str, int],
) -> None:
    processes, db, port = runs
    # 1. The receiver is down: every notification is tried and stays pending; SIGKILL.
    first = processes.start()
    wait_until(lambda: min(_attempts(db)) >= 1, 30, "every notification tried")
    first.send_signal(signal.SIGKILL)
    assert first.wait(timeout=10) == -signal.SIGKILL
    with Store(db) as store:
        assert {n.state for n in store.notifications()} == {"pending"}

    # 2. The receiver is back, but holds the first post: SIGKILL with it in flight.
    release = threading.Event()
    with Receiver(secret=SECRET, port=port, hold_first=release) as receiver:
        second = processes.start()
        wait_until(lambda: len(receiver.received) >= 1, 30, "a post in flight")
        os.kill(second.pid, signal.SIGKILL)
        assert second.wait(timeout=10) == -signal.SIGKILL
        release.set()  # the receiver answers 200 to a process that is gone

        # 3. Started again: the pending ones go at once, the one in flight after its lease.
        third = processes.start()
        wait_until(lambda: len(receiver.delivered()) == len(MODELS), 30, "every alert delivered")
        with Store(db) as store:
            wait_until(
                lambda: {n.state for n in store.notifications()} == {"delivered"},
                30,
                "the outbox recorded as delivered",
            )
        third.send_signal(signal.SIGTERM)
        assert third.wait(timeout=10) == 0

    delivered = receiver.delivered()
    models = sorted(json.loads(body)["alerts"][0]["labels"]["model"] for body in delivered.values())
    assert models == list(MODELS)  # every alert exactly once, after dedupe by webhook-id
    assert all(r.verified for r in receiver.received)
    # The post in flight at the kill was sent again with the same webhook-id.
    ids = [r.headers["webhook-id"] for r in receiver.received]
    assert len(ids) == len(MODELS) + 1 and ids.count(ids[0]) == 2
