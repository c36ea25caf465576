"""``batchscope alerts``: lists the alerts, silences and outbox (text and JSON), sends
a test notification to a real receiver (its signature verified by standardwebhooks),
and adds, lists and ends silences; mistakes are one line and exit 2."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from alerts.engine import evaluate_alerts
from collector.cli import main
from collector.config import load_settings
from collector.errors import ConfigError
from collector.settings_fields import parse_duration_s
from collector.store import Store
from tests.alert_support import SECRET, Receiver


@pytest.fixture
def db(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    with Store(url) as store:
        store.open()
    return url


def _config(tmp_path: Path, url: str) -> Path:
    cfg = tmp_path / "alerts.yaml"
    cfg.write_text(
        "alerts:\n  receivers:\n"
        f"    - {{name: hook, webhook: {{url: '{url}/hook', secret: '{SECRET}'}}}}\n"
    )
    return cfg


def test_alerts_lists_states_silences_and_the_outbox(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = _config(tmp_path, "http://127.0.0.1:9")
    settings = load_settings(config_file=cfg, env={}, overrides={"db_url": db})
    now = time.time()
    with Store(db) as store:
        store.add_finding(
            kind="queue_saturation",
            severity="warning",
            target="triton-a",
            subject="m",
            summary="m queues",
            window_start=now - 30,
            window_end=now,
            evidence={"queue_share": 0.7},
            created_at=now,
        )
        evaluate_alerts(store, settings, now=now)
        store.add_silence(starts_at=now, ends_at=now + 600, target="triton-b", comment="upgrade")

    assert main(["alerts", "--db", db]) == 0
    text = capsys.readouterr().out
    assert "firing" in text and "queue_saturation" in text and "m queues" in text
    assert "target=triton-b" in text and "upgrade" in text
    assert "hook" in text and SECRET not in text  # the outbox line, no secret

    assert main(["alerts", "--db", db, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [a["state"] for a in doc["alerts"]] == ["firing"]
    assert doc["outbox"] == [{"receiver": "hook", "state": "pending", "count": 1}]
    assert [s["target"] for s in doc["silences"]] == ["triton-b"]


def test_alerts_test_sends_a_signed_notification(
    tmp_path: Path, db: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with Receiver(secret=SECRET) as receiver:
        cfg = _config(tmp_path, receiver.url)
        assert main(["alerts", "test", "--receiver", "hook", "--config", str(cfg), "--db", db]) == 0
        [got] = receiver.received
    assert got.verified is True
    assert json.loads(got.body)["alerts"][0]["labels"]["alertname"] == "BatchscopeTest"
    assert "hook took the test notification" in capsys.readouterr().out
    with Store(db) as store:
        [sent] = store.notifications()
        assert (sent.state, sent.webhook_id) == ("delivered", got.headers["webhook-id"])

    # A receiver that is not there: not taken, exit 1; an unknown name: exit 2.
    cfg = _config(tmp_path, "http://127.0.0.1:9")
    assert main(["alerts", "test", "--receiver", "hook", "--config", str(cfg), "--db", db]) == 1
    assert "did not take the test notification" in capsys.readouterr().err
    assert main(["alerts", "test", "--receiver", "nope", "--config", str(cfg), "--db", db]) == 2
    err = capsys.readouterr().err
    assert "invalid setting receiver: no receiver named 'nope'; known: hook" in err


def test_alerts_silence_adds_lists_and_ends(db: str, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["alerts", "silence", "--db", db]
    assert main([*args, "--rule", "target_down", "--target", "triton-a", "--for", "30m"]) == 0
    assert "silence #1 until" in capsys.readouterr().out
    with Store(db) as store:
        [silence] = store.silences(active_at=time.time())
        assert (silence.rule, silence.target, silence.subject) == ("target_down", "triton-a", None)
        assert silence.ends_at - silence.starts_at == 1800.0
    assert main([*args, "--list"]) == 0
    assert "#1 rule=target_down target=triton-a subject=*" in capsys.readouterr().out
    assert main([*args, "--end", "1"]) == 0
    with Store(db) as store:
        assert store.silences(active_at=time.time() + 1) == []
    capsys.readouterr()
    assert main([*args, "--rule", "nope", "--for", "1h"]) == 2
    assert "invalid setting rule: unknown rule 'nope'" in capsys.readouterr().err
    assert main([*args, "--for", "soon"]) == 2
    assert "invalid setting for:" in capsys.readouterr().err
    assert main([*args, "--end", "99"]) == 2


def test_durations() -> None:
    assert [parse_duration_s(t) for t in ("90", "90s", "30m", "2h", "1d", "1.5h")] == [
        90.0,
        90.0,
        1800.0,
        7200.0,
        86400.0,
        5400.0,
    ]
    for bad in ("", "0", "-5m", "2w", "h"):
        with pytest.raises(ConfigError):
            parse_duration_s(bad)


def test_alerts_run_evaluates_and_delivers_until_its_duration(tmp_path: Path, db: str) -> None:
    # The command installs its own SIGTERM and SIGINT handlers: put pytest's back after.
    saved = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    now = time.time()
    with Store(db) as store:
        store.add_finding(
            kind="batching_off",
            severity="warning",
            target="triton-a",
            subject="m",
            summary="m runs without dynamic batching",
            window_start=now - 30,
            window_end=now,
            evidence={"pending_mean": 2.0},
            created_at=now,
        )
    try:
        with Receiver(secret=SECRET) as receiver:
            cfg = _config(tmp_path, receiver.url)
            cfg.write_text("analysis_every_s: 0.2\n" + cfg.read_text())
            args = ["alerts", "run", "--duration", "1.5", "--config", str(cfg), "--db", db]
            assert main(args) == 0
    finally:
        for signum, handler in saved.items():
            signal.signal(signum, handler)
    [got] = receiver.received
    assert got.verified and json.loads(got.body)["alerts"][0]["labels"]["rule"] == "batching_off"
    with Store(db) as store:
        assert [s.state for s in store.alert_states()] == ["firing"]
        assert [n.state for n in store.notifications()] == ["delivered"]
