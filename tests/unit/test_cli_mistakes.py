"""The usual mistakes get one clear line and a non-zero status, never a traceback:
a mistyped store URL given to a command that only reads (status, recommend from the
store, dashboard, apply) says there is no store there and creates none; an unknown
``--model`` names the models the store knows; and every flag of every subcommand says
what it does in ``--help``."""

from __future__ import annotations

import argparse
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

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
