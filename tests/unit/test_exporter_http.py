"""``batchscope exporter`` as a process and an HTTP server: its endpoints, readiness
judged from the store by the one freshness rule, one clear line for a bad or taken
--listen, and a prompt stop on SIGTERM that leaves no temporary store behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from collector.cli import main
from collector.config import Settings, TargetSettings
from collector.exporter.cli import parse_listen
from collector.exporter.service import Exporter
from collector.synthetic import scrape_ok
from tests.support import free_port, start_process, wait_until

NO_TRITON = "http://127.0.0.1:9"  # nothing listens on the discard port


def _settings(tmp_path: Path) -> Settings:
    return Settings(
        targets=(TargetSettings(url=NO_TRITON),),
        db_url=f"sqlite:///{tmp_path / 'x.db'}",
        interval_s=0.5,
        sources=("triton",),
    )


@pytest.fixture
def exporter(tmp_path: Path) -> Iterator[Exporter]:
    e = Exporter(_settings(tmp_path), host="127.0.0.1", port=free_port())
    e.start()
    try:
        yield e
    finally:
        e.close()


def test_endpoints_of_an_exporter_whose_triton_is_down(exporter: Exporter) -> None:
    base = exporter.url
    assert requests.get(base + "healthz", timeout=5).status_code == 200
    wait_until(
        lambda: "latest scrape failed" in requests.get(base + "readyz", timeout=5).text,
        10,
        "the first (failed) scrape",
    )
    ready = requests.get(base + "readyz", timeout=5)
    assert ready.status_code == 503
    assert ready.text.strip() == "127.0.0.1:9: down (its latest scrape failed)"
    page = requests.get(base, timeout=5)
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    for link in ("href='metrics'", "href='healthz'", "href='readyz'", NO_TRITON):
        assert link in page.text
    metrics = requests.get(base + "metrics", timeout=5)
    assert metrics.status_code == 200
    assert 'batchscope_source_up{source="triton",target="127.0.0.1:9"} 0.0' in metrics.text
    assert requests.get(base + "nothing", timeout=5).status_code == 404
    exporter.close()
    assert not exporter.healthy()


def test_ready_once_the_triton_target_is_up_and_fresh(tmp_path: Path) -> None:
    e = Exporter(_settings(tmp_path), host="127.0.0.1", port=0)  # never started
    try:
        assert e.readiness(now=100.0).reason == "127.0.0.1:9: not scraped yet"
        scrape_ok(e.store, "127.0.0.1:9", 100.0)
        assert e.readiness(now=101.0).ready
        # Stale by the rule: three intervals (at least 5 s) without a good scrape.
        late = e.readiness(now=130.0)
        assert not late.ready and "stale" in late.reason
    finally:
        e.close()


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in text, text
    return lines[0]


@pytest.mark.parametrize("listen", ["9478", "localhost", ":9478", "::1:9478", "h:port", "h:0"])
def test_a_bad_listen_is_one_line_naming_the_field(
    listen: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["exporter", "--triton", NO_TRITON, "--listen", listen]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("batchscope: invalid setting listen: "), line


def test_listen_takes_ipv6_in_brackets() -> None:
    assert parse_listen("[::1]:9478") == ("::1", 9478)
    assert parse_listen("0.0.0.0:80") == ("0.0.0.0", 80)


def test_a_taken_port_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        started = time.monotonic()
        assert main(["exporter", "--triton", NO_TRITON, "--listen", f"127.0.0.1:{port}"]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("batchscope: invalid setting listen: cannot listen on 127.0.0.1:")
    assert "choose another --listen" in line
    assert time.monotonic() - started < 5


def test_no_triton_target_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exporter"]) == 2
    assert "invalid setting targets" in _one_line(capsys.readouterr().err)


def test_sigterm_stops_it_promptly_and_removes_its_store(tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    env["TMPDIR"] = str(tmp_path)  # where its temporary store goes
    proc = start_process(
        [sys.executable, "-m", "collector.cli", "exporter", "--triton", NO_TRITON]
        + ["--listen", f"127.0.0.1:{port}", "--interval", "0.5", "--sources", "triton"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        url = f"http://127.0.0.1:{port}/healthz"
        wait_until(lambda: requests.get(url, timeout=2).status_code == 200, 30, "/healthz")
        assert [p.name for p in tmp_path.glob("batchscope-exporter-*")] != []
        proc.send_signal(signal.SIGTERM)
        stopped = time.monotonic()
        assert proc.wait(timeout=10) == 0
        assert time.monotonic() - stopped < 5
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert list(tmp_path.glob("batchscope-exporter-*")) == []
    assert proc.stdout is not None
    assert f"on http://127.0.0.1:{port}/metrics" in proc.stdout.read().decode()
