"""`batchscope recommend` and `batchscope apply` against a real Triton: a recommendation
is applied live and kept; a harmful one is rolled back; a server without explicit model
control is refused with nothing changed."""

from __future__ import annotations

import json
import shlex
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import pytest

from collector.analysis.configs import config_changes, config_with, render_pbtxt
from collector.config import ApplySettings, target_from_url
from collector.records import BatcherConfig, Prediction, Recommendation
from collector.store import Store
from collector.testbed.load import load_in_background
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer
from dashboard.actions import ActionRefused, ConfigActions

pytestmark = pytest.mark.integration

MODEL = ModelSpec("m", fixed_ms=4.0, per_sample_ms=0.3, max_batch_size=32)


@contextmanager
def background_load(server: TritonServer, concurrency: int, seconds: float) -> Iterator[None]:
    """Load while the block runs: for at most ``seconds``, stopped when it ends."""
    with load_in_background(
        server.grpc_url, MODEL.name, concurrency=concurrency, duration_s=seconds
    ):
        yield


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "collector.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def hand_made(target: str, proposed: BatcherConfig, config: dict[str, object]) -> Recommendation:
    current = BatcherConfig(max_batch_size=MODEL.max_batch_size)
    return Recommendation(
        target=target,
        model=MODEL.name,
        created_at=0.0,
        kind="tune",
        changes=config_changes(current, proposed),
        current_config=current,
        proposed_config=proposed,
        current=Prediction(qps=1.0, p95_ms=1.0),
        predicted=Prediction(qps=1.0, p95_ms=1.0),
        confidence=0.5,
        reason="test",
        config_pbtxt=render_pbtxt(proposed),
        config_json=json.dumps(config_with(json.dumps(config), proposed)),
    )


def stored_recommendation(db_url: str, server: TritonServer, proposed: BatcherConfig) -> None:
    """A hand-made recommendation in the store, as `recommend` would leave it."""
    config = server.get_json(f"/v2/models/{MODEL.name}/config")
    target = target_from_url(server.http_url, server.metrics_url)
    store = Store(db_url)
    try:
        store.add_recommendation(hand_made(target.name, proposed, config))
    finally:
        store.close()


def outcome(db_url: str) -> str:
    """What the store says became of the one recommendation of the model."""
    store = Store(db_url)
    try:
        [stored] = store.recommendations(model=MODEL.name)
        return stored.status
    finally:
        store.close()


def test_recommend_then_apply_keeps_a_good_change(
    triton_factory: Callable[..., TritonServer], tmp_path: Path
) -> None:
    server = triton_factory([MODEL], extra_args=["--metrics-config", "summary_latencies=true"])
    db = f"sqlite:///{tmp_path}/a.db"
    with background_load(server, concurrency=16, seconds=14):
        out = cli(
            "recommend",
            "--triton",
            server.http_url,
            "--metrics-url",
            server.metrics_url,
            "--db",
            db,
            "--observe",
            "10",
            "--window",
            "8",
            "--json",
        )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    (rec,) = data["recommendations"]
    assert rec["model"] == "m" and rec["kind"] == "probe"
    assert {
        "target",
        "model",
        "changes",
        "current",
        "predicted",
        "confidence",
        "config_pbtxt",
        "config_json",
    } <= set(rec)
    assert {"field": "dynamic_batching", "from": False, "to": True} in rec["changes"]
    # A probe measures; it claims no gain, and its one current figure is what was measured.
    assert rec["figures"]["gain"] is None
    assert rec["figures"]["current_qps"] == rec["current"]["qps"]

    with background_load(server, concurrency=16, seconds=12):
        out = cli(
            "apply",
            "--triton",
            server.http_url,
            "--metrics-url",
            server.metrics_url,
            "--model",
            "m",
            "--db",
            db,
            "--yes",
            "--verify-s",
            "4",
        )
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith("kept:")
    assert "dynamic_batching" in server.get_json("/v2/models/m/config")
    store = Store(db)
    try:
        (applied,) = store.findings(kind="config_applied")
        assert applied.evidence["after_qps"] > applied.evidence["before_qps"]
        assert applied.evidence["rolled_back"] is False
    finally:
        store.close()
    # `batchscope apply` records the outcome as the UI does.
    assert outcome(db) == "kept"


def test_apply_rolls_back_a_change_that_breaks_latency(
    triton_factory: Callable[..., TritonServer], tmp_path: Path
) -> None:
    server = triton_factory([MODEL], extra_args=["--metrics-config", "summary_latencies=true"])
    db = f"sqlite:///{tmp_path}/b.db"
    # At two clients, waiting up to 100 ms for a batch of 32 only adds latency.
    harmful = replace(
        BatcherConfig(max_batch_size=32),
        dynamic_batching=True,
        preferred_batch_sizes=(32,),
        max_queue_delay_us=100_000,
    )
    stored_recommendation(db, server, harmful)
    with background_load(server, concurrency=2, seconds=12):
        out = cli(
            "apply",
            "--triton",
            server.http_url,
            "--metrics-url",
            server.metrics_url,
            "--model",
            "m",
            "--db",
            db,
            "--yes",
            "--verify-s",
            "4",
        )
    assert out.returncode == 4, out.stdout + out.stderr
    assert "rolled back" in out.stdout
    assert "dynamic_batching" not in server.get_json("/v2/models/m/config")
    store = Store(db)
    try:
        (applied,) = store.findings(kind="config_applied")
        assert applied.evidence["rolled_back"] is True
        assert applied.severity == "warning"
    finally:
        store.close()
    assert outcome(db) == "rolled_back"


def test_apply_refuses_without_explicit_model_control(
    triton_factory: Callable[..., TritonServer], tmp_path: Path
) -> None:
    server = triton_factory([MODEL], explicit_model_control=False)
    db = f"sqlite:///{tmp_path}/c.db"
    stored_recommendation(
        db, server, replace(BatcherConfig(max_batch_size=32), dynamic_batching=True)
    )
    with background_load(server, concurrency=4, seconds=3):
        out = cli(
            "apply",
            "--triton",
            server.http_url,
            "--metrics-url",
            server.metrics_url,
            "--model",
            "m",
            "--db",
            db,
            "--yes",
            "--verify-s",
            "1",
        )
    assert out.returncode == 3
    assert "--model-control-mode=explicit" in out.stderr
    assert "does not allow live config changes" in out.stderr
    assert "Nothing was changed" in out.stderr
    assert "Traceback" not in out.stderr
    assert "dynamic_batching" not in server.get_json("/v2/models/m/config")
    assert outcome(db) == "open"

    # The dashboard's Apply asks the same server, finds it closed and refuses too.
    target = target_from_url(server.http_url, server.metrics_url)
    store = Store(db)
    actions = ConfigActions(store, [target], apply=ApplySettings(before_s=1.0, after_s=1.0))
    try:
        assert actions.live_changes_allowed(target.name) is False
        refusal = actions.live_change_refusal(target.name)
        assert refusal is not None and "does not allow live config changes" in refusal
        [stored] = store.recommendations(model="m")
        with pytest.raises(ActionRefused, match="--model-control-mode=explicit"):
            actions.start_apply(target.name, "m", stored.id)
    finally:
        actions.close()
        store.close()
    assert "dynamic_batching" not in server.get_json("/v2/models/m/config")
    assert outcome(db) == "open"


def test_apply_to_an_unreachable_server_says_so_without_a_traceback(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # closed once the block ends
    db = f"sqlite:///{tmp_path}/d.db"
    store = Store(db)
    try:
        store.add_recommendation(
            hand_made(
                target_from_url(url).name,
                replace(BatcherConfig(max_batch_size=32), dynamic_batching=True),
                {"name": MODEL.name},
            )
        )
    finally:
        store.close()
    out = cli("apply", "--triton", url, "--model", "m", "--db", db, "--yes", "--verify-s", "1")
    assert out.returncode == 5, out.stdout + out.stderr
    assert "could not reach" in out.stderr and "nothing was changed" in out.stderr
    assert "does not allow live config changes" not in out.stderr
    assert "Traceback" not in out.stderr
    assert outcome(db) == "open"


class _Forwarder:
    """A TCP port that relays to another, as a container's mapped port does: the server
    behind it runs with a --http-port that is not the port the user knows."""

    def __init__(self, to_port: int) -> None:
        self._to = to_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:  # closed
                return
            upstream = socket.create_connection(("127.0.0.1", self._to))
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with src, dst:
            while data := src.recv(65536):
                dst.sendall(data)

    def close(self) -> None:
        self._listener.close()
        self._threads[0].join(timeout=5)


def test_apply_copied_from_the_demo_finds_the_metrics_url_or_names_the_flag(
    triton_factory: Callable[..., TritonServer], tmp_path: Path
) -> None:
    server = triton_factory([MODEL], extra_args=["--metrics-config", "summary_latencies=true"])
    assert not server.metrics_url.endswith(":8002/metrics")  # as in the demo
    db = f"sqlite:///{tmp_path}/e.db"
    forwarder = _Forwarder(int(server.http_url.rsplit(":", 1)[1]))
    try:
        hidden = f"http://127.0.0.1:{forwarder.port}"
        config = server.get_json(f"/v2/models/{MODEL.name}/config")
        store = Store(db)
        try:
            on = replace(BatcherConfig(max_batch_size=32), dynamic_batching=True)
            store.add_recommendation(hand_made(target_from_url(hidden).name, on, config))
        finally:
            store.close()
        # Behind another port no tritonserver of this host is found, and nothing
        # answers on Triton's default metrics port: one line that names the flag.
        out = cli("apply", "--triton", hidden, "--model", "m", "--db", db, "--yes")
        assert out.returncode == 2, out.stdout + out.stderr
        assert "Traceback" not in out.stderr
        (line,) = out.stderr.strip().splitlines()
        assert line.startswith("batchscope: invalid setting metrics_url: ")
        assert "--metrics-url" in line and hidden in line
        assert "dynamic_batching" not in server.get_json("/v2/models/m/config")

        # Once a collector has scraped the server at that URL, the store knows where
        # its metrics are, and the same command finds them there.
        out = cli(
            "collect", "--triton", hidden, "--metrics-url", server.metrics_url,
            "--db", db, "--sources", "triton", "--interval", "0.5", "--duration", "2",
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr
        with background_load(server, concurrency=16, seconds=10):
            out = cli("apply", "--triton", hidden, "--model", "m", "--db", db, "--yes",
                      "--verify-s", "3")  # fmt: skip
        assert out.returncode in (0, 4), out.stdout + out.stderr
        assert "Traceback" not in out.stderr
        hidden_name = target_from_url(hidden).name
        assert f"metrics of {hidden_name}: {server.metrics_url} (the store)" in out.stderr
    finally:
        forwarder.close()

    stored_recommendation(
        db, server, replace(BatcherConfig(max_batch_size=32), dynamic_batching=True)
    )
    # The line the demo prints, as a user copies it: the demo collects into that store,
    # so the line needs no --metrics-url.
    from collector.demo import apply_command

    printed = shlex.split(apply_command(server.http_url, db, "m"))
    assert printed[:2] == ["batchscope", "apply"] and "--metrics-url" not in printed
    out = cli(
        "collect", "--triton", server.http_url, "--metrics-url", server.metrics_url,
        "--db", db, "--sources", "triton", "--interval", "0.5", "--duration", "2",
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    with background_load(server, concurrency=16, seconds=10):
        out = cli(*printed[1:], "--yes", "--verify-s", "3")
    assert out.returncode in (0, 4), out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    name = target_from_url(server.http_url).name
    assert f"metrics of {name}: {server.metrics_url} (the store)" in out.stderr
    assert out.stdout.strip().splitlines()[-1].startswith(("kept:", "rolled back:"))
    assert outcome_of_latest(db, name) in ("kept", "rolled_back")


def outcome_of_latest(db_url: str, target: str) -> str:
    store = Store(db_url)
    try:
        return store.recommendations(target=target, model=MODEL.name)[-1].status
    finally:
        store.close()
