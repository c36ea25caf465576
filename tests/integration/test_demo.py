"""`make demo`'s command end to end: the testbed under a varying load, the collector,
the analyses and the UI in one process; within a minute the store behind the UI holds
the unbatched model's finding and a recommendation, and the UI answers."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from collector.store import Store

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_serves_a_finding_and_a_recommendation_within_a_minute(
        tmp_path: Path, triton_available: None) -> None:
    db = f"sqlite:///{tmp_path}/demo.db"
    proc = subprocess.Popen(
        [sys.executable, "-m", "collector.cli", "demo", "--port", str(_free_port()),
         "--db", db],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})
    watchdog = threading.Timer(180, proc.kill)
    watchdog.start()
    try:
        assert proc.stdout is not None
        url = None
        for line in proc.stdout:
            if line.startswith("batchscope UI: "):
                url = line.split()[2]
                break
        assert url is not None and url.startswith("http://127.0.0.1:")
        shown_at = time.monotonic()
        with urllib.request.urlopen(url, timeout=10) as response:
            assert response.status == 200

        store = Store(db)
        try:
            finding = recommendation = None
            while time.monotonic() - shown_at < 60 and not (finding and recommendation):
                finding = next((f for f in store.active_findings()
                                if f.subject == "unbatched" and f.kind == "batching_off"),
                               None)
                recommendation = next(iter(store.recommendations(model="unbatched")), None)
                time.sleep(1.0)
            took = time.monotonic() - shown_at
            print(f"\nafter {took:.0f} s: finding {finding and finding.summary}; "
                  f"recommendation {recommendation and recommendation.status}")
            assert finding is not None, "no batching_off finding for unbatched within 60 s"
            assert recommendation is not None, "no recommendation for unbatched within 60 s"
            assert recommendation.status in ("probe", "tune")
        finally:
            store.close()
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
