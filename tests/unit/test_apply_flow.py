"""apply: the pure verdict with its named thresholds, the distinction between a server
that refuses live changes and one that cannot be reached, and the flow's record of the
outcome (kept, rolled back, stopped) through a fake HTTP session and fake windows."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import pytest
import requests

import collector.apply as apply_module
from collector.apply import (
    ApplyRefused,
    LiveChangesRefused,
    TargetUnreachable,
    WindowFigures,
    apply_recommendation,
    check_live_changes,
    verdict,
)
from collector.config import ApplySettings, target_from_url
from collector.errors import BatchscopeError
from collector.records import BatcherConfig, ConfigChange, ModelRates, Prediction, Recommendation

DEFAULTS = ApplySettings()


def window(qps: float, p95_ms: float | None, mean_ms: float | None = None) -> WindowFigures:
    rates = ModelRates(
        window_s=30.0,
        requests_per_s=qps,
        inferences_per_s=qps,
        executions_per_s=qps,
        fail_per_s=0.0,
        request_us_per_request=None if mean_ms is None else mean_ms * 1000,
    )
    return WindowFigures(rates=rates, p95_ms=p95_ms)


def test_verdict_keeps_a_change_within_the_thresholds() -> None:
    judged = verdict(window(100, 10.0), window(96, 10.9), None, DEFAULTS)
    assert judged.keep and judged.reasons == ()
    assert judged.summary == "kept: 100 → 96 QPS, p95 10.0 ms → 10.9 ms"


def test_verdict_rolls_back_on_throughput_below_the_ratio() -> None:
    judged = verdict(window(100, 10.0), window(94, 9.0), None, DEFAULTS)
    assert not judged.keep
    assert judged.reasons == ("throughput fell from 100 to 94 QPS",)
    assert judged.summary.startswith("rolled back: throughput fell")
    # A looser threshold keeps the same windows.
    assert verdict(window(100, 10.0), window(94, 9.0), None, ApplySettings(min_qps_ratio=0.9)).keep


def test_verdict_without_an_objective_bounds_p95_growth() -> None:
    judged = verdict(window(100, 10.0), window(100, 11.5), None, DEFAULTS)
    assert judged.reasons == ("p95 rose from 10.0 to 11.5 ms (> 10 %)",)
    assert verdict(
        window(100, 10.0), window(100, 11.5), None, ApplySettings(max_p95_ratio=1.2)
    ).keep


def test_verdict_with_an_objective_judges_p95_against_it_only() -> None:
    assert verdict(window(100, 10.0), window(100, 19.0), 20.0, DEFAULTS).keep
    judged = verdict(window(100, 10.0), window(100, 21.0), 20.0, DEFAULTS)
    assert judged.reasons == ("p95 21.0 ms is above the objective 20 ms",)


def test_verdict_uses_the_mean_when_triton_has_no_summary() -> None:
    judged = verdict(window(100, None, mean_ms=5.0), window(100, None, mean_ms=6.0), None, DEFAULTS)
    assert judged.reasons == ("mean request time rose from 5.0 to 6.0 ms (> 10 %)",)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def http() -> Iterator[requests.Session]:
    with requests.Session() as session:
        session.trust_env = False
        yield session


def test_an_unreachable_server_is_not_called_closed_to_live_changes(http: requests.Session) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    with pytest.raises(TargetUnreachable, match="could not reach") as err:
        check_live_changes(http, url)
    assert not isinstance(err.value, ApplyRefused)
    assert "does not allow live config changes" not in str(err.value)
    assert isinstance(err.value, BatchscopeError)


@pytest.fixture
def polling_triton() -> Iterator[str]:
    """A stand-in for Triton in poll mode: every load or unload is refused."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps(
                {"error": "explicit model load / unload is not allowed if polling is enabled"}
            ).encode()
            self.send_response(400)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_without_explicit_model_control_refuses_live_changes(
    http: requests.Session, polling_triton: str
) -> None:
    with pytest.raises(LiveChangesRefused, match="--model-control-mode=explicit"):
        check_live_changes(http, polling_triton)


# ---------------------------------------------------------------- the flow, faked


def recommendation(slo_p95_ms: float | None = None) -> Recommendation:
    current = BatcherConfig(max_batch_size=8)
    proposed = replace(current, dynamic_batching=True)
    return Recommendation(
        target="t",
        model="m",
        created_at=0.0,
        kind="probe",
        changes=(ConfigChange("dynamic_batching", False, True),),
        current_config=current,
        proposed_config=proposed,
        current=Prediction(qps=100.0, p95_ms=10.0),
        predicted=Prediction(qps=150.0, p95_ms=9.0),
        confidence=0.5,
        reason="test",
        slo_p95_ms=slo_p95_ms,
        config_json=json.dumps({"name": "m", "dynamic_batching": {}}),
    )


class FakeStore:
    def __init__(self) -> None:
        self.outcomes: list[tuple[int, str, dict[str, Any] | None]] = []
        self.findings: list[dict[str, Any]] = []
        self.added: list[Recommendation] = []

    def add_recommendation(self, rec: Recommendation) -> int:
        self.added.append(rec)
        return 41 + len(self.added)

    def record_recommendation_outcome(
        self, rec_id: int, *, outcome: str, at: float, verification: dict[str, Any] | None
    ) -> None:
        self.outcomes.append((rec_id, outcome, verification))

    def add_finding(self, **finding: Any) -> int:
        self.findings.append(finding)
        return len(self.findings)


class FakeTriton(requests.Session):
    """Answers the config read and every load; remembers the loaded configs."""

    def __init__(self) -> None:
        super().__init__()
        self.loaded: list[str] = []

    def _answer(self, status: int, doc: object) -> requests.Response:
        response = requests.Response()
        response.status_code = status
        response._content = json.dumps(doc).encode()
        return response

    def get(self, url: str | bytes, **_kwargs: Any) -> requests.Response:  # type: ignore[override]
        assert str(url).endswith("/v2/models/m/config")
        return self._answer(200, {"name": "m"})

    def post(
        self,
        url: str | bytes,
        data: Any = None,
        json: Any = None,  # type: ignore[override]
        **_kwargs: Any,
    ) -> requests.Response:
        assert str(url).endswith("/v2/repository/models/m/load")
        self.loaded.append(json["parameters"]["config"])
        return self._answer(200, {})


def run_flow(
    monkeypatch: pytest.MonkeyPatch,
    windows: list[WindowFigures | None],
    rec: Recommendation,
    **kwargs: Any,
) -> tuple[FakeStore, FakeTriton, Any]:
    """``windows``: what the before and after measurements give; None: stopped."""
    measured = iter(windows)

    def fake_window(_source: object, _model: str, _seconds: float, _wait: object) -> Any:
        figures = next(measured)
        if figures is None:
            raise apply_module.ApplyInterrupted("stopped")
        return figures

    monkeypatch.setattr(apply_module, "measure_window", fake_window)
    store, http = FakeStore(), FakeTriton()
    result = apply_recommendation(
        target_from_url("http://t:8000"),
        rec,
        store=store,  # type: ignore[arg-type]
        http=http,
        clock=lambda: 1000.0,
        wait=lambda _s: False,
        **kwargs,
    )
    return store, http, result


def test_a_kept_change_is_recorded_applied_then_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    store, http, result = run_flow(
        monkeypatch, [window(100, 10.0), window(140, 9.0)], recommendation(), recommendation_id=7
    )
    assert result.verdict.keep and result.recommendation_id == 7
    assert len(http.loaded) == 1 and json.loads(http.loaded[0])["dynamic_batching"] == {}
    assert [(i, o) for i, o, _ in store.outcomes] == [(7, "applied"), (7, "kept")]
    verification = store.outcomes[-1][2]
    assert verification is not None and verification["after_qps"] == 140
    assert verification["verdict"].startswith("kept:")
    (finding,) = store.findings
    assert finding["kind"] == "config_applied" and finding["evidence"]["rolled_back"] is False
    assert store.added == []


def test_a_regression_is_rolled_back_and_an_unstored_recommendation_stored_first(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rec = recommendation(slo_p95_ms=20.0)
    store, http, result = run_flow(monkeypatch, [window(100, 10.0), window(100, 25.0)], rec)
    assert result.rolled_back
    assert store.added == [rec]
    assert [(i, o) for i, o, _ in store.outcomes] == [(42, "applied"), (42, "rolled_back")]
    assert http.loaded[-1] == json.dumps({"name": "m"})  # the previous config, again
    assert store.findings[0]["severity"] == "warning"


def test_stopped_while_verifying_rolls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    store, http, result = run_flow(
        monkeypatch, [window(100, 10.0), None], recommendation(), recommendation_id=3
    )
    assert result.rolled_back and result.after is None
    assert result.verdict.summary == "rolled back: stopped before the change was verified"
    assert len(http.loaded) == 2
    assert store.outcomes[-1][1] == "rolled_back"


def test_stopped_before_the_change_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(apply_module.ApplyInterrupted):
        run_flow(monkeypatch, [None], recommendation(), recommendation_id=3)
