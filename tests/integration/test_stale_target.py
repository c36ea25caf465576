"""A dead server is never shown as up: a real Triton is collected, then killed; once
its last good scrape is older than the stale horizon, ``status --json`` says it is not
up and gives no rates. With the collector stopped too, the target is "stale"."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from collector.analysis.health import stale_after_s
from collector.testbed.load import run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED
from collector.testbed.server import TritonServer
from tests.support import running_collector

pytestmark = pytest.mark.integration

INTERVAL_S = 0.5  # stale after stale_after_s(0.5) = 5 s


def _status(db_url: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "collector.cli", "status", "--db", db_url, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    data: dict[str, Any] = json.loads(out.stdout)
    return data


def _poll(db_url: str, check: Callable[[dict[str, Any]], bool], timeout_s: float) -> dict:
    deadline = time.monotonic() + timeout_s
    data = _status(db_url)
    while not check(data):
        assert time.monotonic() < deadline, json.dumps(data, indent=1)[:3000]
        time.sleep(0.3)
        data = _status(db_url)
    return data


def _target(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(t for t in data["targets"] if t["target"]["name"] == name)


def test_a_killed_triton_is_not_up_and_has_no_rates_after_the_stale_horizon(
    triton_factory: Callable[..., TritonServer], tmp_path: Path
) -> None:
    server = triton_factory(BATCHED_AND_UNBATCHED[:1])
    model = BATCHED_AND_UNBATCHED[0].name
    db_url = f"sqlite:///{tmp_path}/stale.db"
    args = [
        "--triton",
        server.http_url,
        "--metrics-url",
        server.metrics_url,
        "--db",
        db_url,
        "--interval",
        str(INTERVAL_S),
        "--duration",
        "300",
        "--sources",
        "triton",
    ]
    # status reads an existing store only: the collector is yielded once it has made it
    # (it says so once its store is open and up to date), or status would exit 2.
    with running_collector(tmp_path, args=args, env={"BATCHSCOPE_BACKOFF_MAX_S": "1"}) as collector:
        # Load only once the collector holds a sample of the model: load that ends before
        # the first scrape adds nothing to any counter difference.
        _poll(db_url, lambda d: any(m["last_sample_at"] for m in d["models"]), 60)
        run_load(server.grpc_url, model, concurrency=4, duration_s=2.0)
        live = _poll(
            db_url,
            lambda d: any(m["rates"] and m["rates"]["requests_per_s"] > 0 for m in d["models"]),
            30,
        )
        (row,) = live["models"]
        assert row["up"] is True
        target = row["target"]

        killed_at = time.time()
        server.kill()
        # The collector runs on: the target is down, and once its last good scrape is
        # past the horizon its model has no rates, pending count or p95.
        down = _poll(
            db_url,
            lambda d: d["models"][0]["rates"] is None,
            stale_after_s(INTERVAL_S) + 15,
        )
        waited = time.time() - killed_at
        assert waited >= stale_after_s(INTERVAL_S) - 1.0, waited  # not before the horizon
        (row,) = down["models"]
        assert row["up"] is False and row["pending_request_count"] is None
        assert row["state"] == "down" and row["request_p95_us"] is None
        assert _target(down, target)["health"]["state"] == "down"

        # Every process stopped: nothing is known of now, the target is stale.
        collector.stop()
        stale = _poll(
            db_url,
            lambda d: _target(d, target)["health"]["state"] == "stale",
            stale_after_s(INTERVAL_S) + 15,
        )
        assert stale["models"][0]["up"] is False and stale["models"][0]["rates"] is None
