"""Fixtures shared by every test: a clean environment, and a throw-away PostgreSQL
schema for tests that need the real server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError
from sqlalchemy.pool import NullPool

from collector import process_control

FAKE_NVML_SOURCE = Path(__file__).with_name("fakenvml") / "fake_nvml.c"
PG_URL_ENV = "BATCHSCOPE_TEST_PG_URL"
DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"stopped by signal {signum}")


def pytest_configure(config: pytest.Config) -> None:
    """A test run stopped with SIGTERM (a CI timeout, ``kill``, ``make`` interrupted)
    stops as Ctrl-C stops it: the fixtures' teardowns still run and stop the servers and
    commands the tests started, which the default action would leave running."""
    if (
        threading.current_thread() is threading.main_thread()
        and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    ):
        signal.signal(signal.SIGTERM, _interrupt)


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``BATCHSCOPE_*`` setting leaks into a test (but the test database URL)."""
    for name in list(os.environ):
        if name.startswith("BATCHSCOPE_") and name != PG_URL_ENV:
            monkeypatch.delenv(name)


@pytest.fixture(autouse=True)
def service_gc_undone() -> Iterator[None]:
    """A command run in-process (``cli.main``) tunes the garbage collector for a
    long-running service, process-wide: its sweeper would pause later tests for a full
    collection once a minute. Undone after each test."""
    yield
    process_control.untune_gc()


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A PostgreSQL URL (``$BATCHSCOPE_TEST_PG_URL`` or the local default) whose
    connections see only a fresh, empty schema, dropped after the test.

    An unreachable server fails the test: a silently skipped PostgreSQL suite would
    let the fleet backend break unnoticed.
    """
    base = make_url(os.environ.get(PG_URL_ENV, DEFAULT_PG_URL))
    shown = base.render_as_string(hide_password=True)
    schema = f"bs_{uuid.uuid4().hex}"
    admin = create_engine(base, poolclass=NullPool, connect_args={"connect_timeout": 5})
    unreachable: str | None = None
    try:
        with admin.begin() as conn:
            conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    except OperationalError as err:
        unreachable = str(err.orig)
    if unreachable is not None:  # failed outside the except, so no chained traceback
        admin.dispose()
        pytest.fail(
            f"PostgreSQL is unreachable at {shown}: {unreachable}\n"
            f"Start it, or point {PG_URL_ENV} at a server where the user may create schemas.",
            pytrace=False,
        )
    url = base.update_query_dict({"options": f"-csearch_path={schema}"})
    try:
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture(scope="session")
def fake_libs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Directories holding a fake libnvidia-ml.so.1 (tests/fakenvml): the full one,
    one built without nvmlDeviceGetProcessesUtilizationInfo (an older driver), and
    one with none. A process finds it through ``LD_LIBRARY_PATH`` set at its start."""
    cc = shutil.which("cc")
    if cc is None:
        pytest.fail("a C compiler (cc) is needed to build tests/fakenvml/fake_nvml.c")
    root = tmp_path_factory.mktemp("fakenvml")
    dirs: dict[str, Path] = {}
    for variant, flags in (("full", []), ("old_driver", ["-DNO_PROCESSES_UTILIZATION_INFO"])):
        out = root / variant
        out.mkdir()
        cmd = [cc, "-shared", "-fPIC", "-O1", "-Wall", *flags]
        cmd += ["-o", str(out / "libnvidia-ml.so.1"), str(FAKE_NVML_SOURCE)]
        result = subprocess.run(cmd, capture_output=True, text=True)
        assert result.returncode == 0, f"building the fake NVML failed:\n{result.stderr}"
        dirs[variant] = out
    dirs["empty"] = root / "empty"
    dirs["empty"].mkdir()
    return dirs
