"""The usual mistakes get one clear line and a non-zero status, never a traceback:
a mistyped store URL given to a command that only reads (status, recommend from the
store, dashboard, apply) says there is no store there and creates none; an unknown
``--model`` names the models the store knows; and every flag of every subcommand says
what it does in ``--help``."""

from __future__ import annotations

import argparse
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.cli import build_parser, main
from collector.errors import ConfigError
from collector.store import Store
from collector.synthetic import Load, model_config, scrape_ok, steady_load

# A port nothing listens on: apply must fail on the missing store before any network.
_NO_SERVER = "http://127.0.0.1:9"

READ_COMMANDS = {
    "status": ["status"],
    "recommend": ["recommend"],
    "dashboard": ["dashboard", "--port", "8099"],
    "apply": ["apply", "--triton", _NO_SERVER, "--model", "m", "--yes"],
}


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    assert "Traceback" not in text
    return lines[0]


def _tables(path: Path) -> set[str]:
    with sqlite3.connect(path) as conn:
        return {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")}


# ------------------------------------------------------------------ missing store


@pytest.mark.parametrize("command", sorted(READ_COMMANDS))
def test_a_read_command_on_a_missing_store_says_so_and_creates_nothing(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)
    # Were the store opened, the dashboard would serve until stopped: stop it short.
    monkeypatch.setattr("dashboard.app.serve", lambda *a, **k: None)
    url = "sqlite:///nonexistent.db"
    status = main([*READ_COMMANDS[command], "--db", url])
    out, err = capsys.readouterr()
    assert status == 2, out + err
    line = _one_line(err)
    assert line.startswith("batchscope: invalid setting db_url: no batchscope store at ")
    assert url in line and "does not exist" in line
    assert out == ""
    assert list(tmp_path.iterdir()) == []  # no file, no -wal, no -journal


def test_status_on_a_missing_store_from_the_shell(tmp_path: Path) -> None:
    # The issue's own command line, run as a user runs it.
    done = subprocess.run(
        [sys.executable, "-m", "collector.cli", "status", "--db", "sqlite:///nonexistent.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    line = _one_line(done.stderr)
    assert "db_url" in line and "sqlite:///nonexistent.db" in line
    assert "does not exist" in line
    assert "no model samples yet" not in done.stdout
    assert not (tmp_path / "nonexistent.db").exists()


def test_a_database_without_batchscope_tables_is_not_a_store_and_is_left_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "other.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE notes (body TEXT)")
    conn.close()
    status = main(["status", "--db", f"sqlite:///{path}"])
    out, err = capsys.readouterr()
    assert status == 2, out + err
    line = _one_line(err)
    assert "db_url" in line and "is not a batchscope store" in line
    assert _tables(path) == {"notes"}  # no migration ran from a read command


def test_a_store_opened_without_create_never_makes_one(tmp_path: Path) -> None:
    path = tmp_path / "later.db"
    url = f"sqlite:///{path}"
    reader = Store(url, create=False)
    with pytest.raises(ConfigError, match="does not exist") as caught:
        reader.targets()
    assert caught.value.field == "db_url" and not path.exists()
    with pytest.raises(ConfigError, match="not a batchscope store"):
        Store("sqlite://", create=False).targets()  # in memory: always empty
    with Store(url) as writer:  # by default (collect, serve, demo) a store is made
        assert writer.targets() == []
    assert path.exists()
    assert reader.targets() == []  # looked for again, found this time
    reader.close()


# ------------------------------------------------------------------ unknown model


@pytest.fixture
def seeded_url(tmp_path: Path) -> Iterator[str]:
    """Models "batched" and "unbatched" on target t, the last two minutes."""
    url = f"sqlite:///{tmp_path}/seeded.db"
    start = time.time() - 120
    loads = [
        Load(
            config=model_config("batched", batching=True, preferred=(8,), delay_us=2000),
            qps=100.0,
            request_ms=20.0,
            queue_share=0.25,
            batch_mix={4: 0.5, 8: 0.5},
            cost_ms=lambda b: 4.0 + 0.5 * b,
        ),
        Load(
            config=model_config("unbatched", batching=False),
            qps=50.0,
            request_ms=40.0,
            queue_share=0.8,
            batch_mix={1: 1.0},
            cost_ms=lambda b: 4.5,
        ),
    ]
    with Store(url) as store:
        steady_load(store, loads, target="t", start=start, seconds=110, step=5)
        scrape_ok(store, "t", start + 110)
    yield url


def test_recommend_for_an_unknown_model_lists_the_known_ones(
    seeded_url: str, capsys: pytest.CaptureFixture
) -> None:
    status = main(["recommend", "--db", seeded_url, "--model", "nosuchmodel"])
    out, err = capsys.readouterr()
    assert status == 2, out + err
    line = _one_line(err)
    assert "unknown model 'nosuchmodel'" in line
    assert "known models: batched, unbatched" in line
    assert out == ""  # no other model's findings, no "no model has enough traffic"


# ------------------------------------------------------------------ --help


def _options_without_help(
    parser: argparse.ArgumentParser, command: str
) -> Iterator[tuple[str, str]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _options_without_help(sub, f"{command} {name}")
        elif action.option_strings and not (action.help or "").strip():
            yield command, "/".join(action.option_strings)


def test_every_flag_of_every_subcommand_has_help_text() -> None:
    parser = build_parser()
    missing = list(_options_without_help(parser, parser.prog))
    assert missing == [], f"options without --help text: {missing}"


# ------------------------------------------------------------------ one line, never a traceback


def _closed_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def test_a_cause_that_spans_lines_is_still_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("targets: [\n")  # PyYAML's message has a caret on a line of its own
    status = main(["status", "--config", str(config)])
    out, err = capsys.readouterr()
    assert status == 2, out + err
    line = _one_line(err)
    assert line.startswith("batchscope: invalid setting config: ") and "not valid YAML" in line


def test_collect_into_a_database_that_cannot_be_opened_stops_at_once(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    url = f"sqlite:///{tmp_path}/no/such/folder/c.db"
    status = main(
        ["collect", "--triton", _closed_url(), "--sources", "triton", "--duration", "30"]
        + ["--db", url]
    )
    out, err = capsys.readouterr()
    assert status == 2, out + err
    assert "Traceback" not in err and "could not record" not in err
    assert "batchscope: invalid setting db_url: cannot open database" in err


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["demo", "--db", "garbled", "--duration", "1"], "db_url"),
        (["demo", "--port", "70000", "--duration", "1"], "port"),
        (["apply", "--triton", "not a url", "--model", "m", "--yes"], "triton"),
        (["collect", "--file-sd", "missing.json", "--duration", "30"], "file_sd"),
        (["serve", "--file-sd", "missing.json", "--port", "8099"], "file_sd"),
        (["exporter", "--file-sd", "missing.json"], "file_sd"),
        (["collect", "--dns-sd", "_http._tcp.a b.test", "--duration", "30"], "dns_sd"),
        (["serve", "--dns-sd", "triton.test/x", "--port", "8099"], "dns_sd"),
        (["collect", "--triton", _NO_SERVER, "--shard", "3/3", "--duration", "30"], "shard"),
        (["serve", "--triton", _NO_SERVER, "--shard", "1-of-2", "--port", "8099"], "shard"),
    ],
)
def test_a_bad_flag_is_refused_before_anything_starts(
    argv: list[str], field: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.chdir(tmp_path)
    started = time.monotonic()
    status = main(argv)
    out, err = capsys.readouterr()
    assert status == 2, out + err
    assert _one_line(err).startswith(f"batchscope: invalid setting {field}: ")
    assert "starting a CPU Triton" not in out
    assert time.monotonic() - started < 10.0
    assert list(tmp_path.iterdir()) == []


def test_recommend_against_a_server_never_reached_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    url = _closed_url()
    status = main(
        ["recommend", "--triton", url, "--observe", "1", "--db", f"sqlite:///{tmp_path}/r.db"]
    )
    out, err = capsys.readouterr()
    assert status == 5, out + err
    line = [x for x in err.splitlines() if x.startswith("batchscope: ")]
    assert len(line) == 1 and "Traceback" not in err
    assert line[0].startswith(f"batchscope: could not reach Triton at {url}: ")
    assert "no model has enough observed traffic" not in out


def test_a_taken_ui_port_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        status = main(
            ["serve", "--triton", _closed_url(), "--sources", "triton", "--port", str(port)]
            + ["--db", f"sqlite:///{tmp_path}/s.db"]
        )
    for signum, handler in handlers.items():  # serve took Ctrl-C over: give it back
        signal.signal(signum, handler)
    out, err = capsys.readouterr()
    assert status == 2, out + err
    assert "Traceback" not in err
    assert "batchscope: invalid setting port: cannot listen there" in err


def test_a_reader_that_goes_away_early_gets_no_traceback(tmp_path: Path) -> None:
    """`batchscope status | head -1`: the pipe is closed before status is written."""
    import os

    from collector.store import Store

    db = f"sqlite:///{tmp_path}/p.db"
    store = Store(db)
    try:  # a store with one target and no samples: status still prints its lines
        store.record_endpoints("t:8000", url="http://t:8000", metrics_url="http://t:8002/metrics")
    finally:
        store.close()
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before the first byte
    try:
        out = subprocess.run(
            [sys.executable, "-m", "collector.cli", "status", "--db", db],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
        )
    finally:
        os.close(write_end)
    stderr = out.stderr.decode()
    assert "Traceback" not in stderr and "Exception ignored" not in stderr, stderr
    assert out.returncode == 141


def test_an_invalid_file_sd_entry_is_one_line_naming_the_file_and_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    fleet = tmp_path / "fleet.json"
    fleet.write_text('[{"targets": ["triton-a:8000"]}, {"targets": ["http://triton-b"]}]')
    db = tmp_path / "c.db"
    status = main(["collect", "--file-sd", str(fleet), "--db", f"sqlite:///{db}"])
    out, err = capsys.readouterr()
    assert status == 2, out + err
    line = _one_line(err)
    assert line.startswith(f"batchscope: invalid setting file_sd: {fleet}: group 1 targets[0]: ")
    assert "host:port (no scheme)" in line
    assert not db.exists()  # refused before the store was made
