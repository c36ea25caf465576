"""`make demo`'s command end to end, seen in headless Chromium: the testbed under a
varying load, the collector, the analyses and the UI in one process; within a minute of
the URL being printed the UI shows the unbatched model's finding and a recommendation."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from collector.testbed.server import find_triton
from dashboard import ids
from tests.support import free_port, start_process

ROOT = Path(__file__).resolve().parents[2]


def _overview_badges(driver) -> dict[str, str]:  # type: ignore[no-untyped-def]
    rows = driver.find_elements(By.CSS_SELECTOR, f"#{ids.Overview.MODELS} tbody tr")
    out = {}
    for row in rows:
        links = row.find_elements(By.CSS_SELECTOR, "a.model-link")
        if links:
            out[links[0].text] = row.text
    return out


def test_demo_shows_a_finding_and_a_recommendation_within_a_minute(
    dash_duo, tmp_path: Path, screenshot
) -> None:  # type: ignore[no-untyped-def]
    find_triton()  # fails with the reason when the testbed is not installed
    db = f"sqlite:///{tmp_path}/demo.db"
    proc = start_process(
        [sys.executable, "-m", "collector.cli", "demo", "--port", str(free_port()), "--db", db],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    watchdog = threading.Timer(300, proc.kill)
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
        # Keep reading the demo's output, so a full pipe never stalls it.
        threading.Thread(target=proc.stdout.read, daemon=True).start()

        deadline = shown_at + 60.0

        def left() -> float:
            return max(deadline - time.monotonic(), 1.0)

        driver = dash_duo.driver

        def wait(condition):  # type: ignore[no-untyped-def]
            # The pages redraw on every refresh: an element read mid-redraw is stale.
            return WebDriverWait(
                driver,
                left(),
                poll_frequency=1.0,
                ignored_exceptions=(StaleElementReferenceException,),
            ).until(condition)

        driver.get(url)
        # The overview refreshes itself: the finding's badge appears on the model's row.
        wait(lambda d: "batching off" in _overview_badges(d).get("unbatched", ""))
        screenshot("demo-overview")
        driver.get(url.rstrip("/") + "/recommendations")
        href = wait(
            lambda d: next(
                (
                    a.get_attribute("href")
                    for a in d.find_elements(By.CSS_SELECTOR, "a.rec-item")
                    if a.find_element(By.CSS_SELECTOR, ".rec-model").text == "unbatched"
                ),
                False,
            )
        )
        driver.get(href)
        # Its detail proposes dynamic batching for the model that runs without it.
        wait(
            lambda d: d.find_element(By.CSS_SELECTOR, f"#{ids.Recs.DETAIL} h2").text.startswith(
                "unbatched on "
            )
        )
        wait(lambda d: "dynamic_batching" in d.find_element(By.ID, ids.Recs.DETAIL).text)
        print(
            f"\nthe UI showed the finding and the recommendation after "
            f"{time.monotonic() - shown_at:.0f} s"
        )
        screenshot("demo-recommendations")

        # The browser leaves first: its open, polling connections would hold the UI
        # server's shutdown.
        driver.get("about:blank")
        proc.send_signal(signal.SIGINT)
        # Shutting down waits for a running analysis pass, the load phase and Triton.
        assert proc.wait(timeout=150) == 0
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
