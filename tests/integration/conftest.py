"""Fixtures for tests that talk to a real tritonserver running on the CPU.

``triton_factory(specs, **kwargs)`` starts a :class:`TritonServer` and returns it once
it is ready; every server it started is stopped at teardown, and teardown fails if any
of its ``triton_python_backend_stub`` processes survived.  ``module_triton_factory`` is
the same, shared by the tests of one module.  At the end of the session a last sweep
looks for stubs of any server these fixtures started, kills them and fails the run.

Without nvidia-pytriton installed (the ``testbed`` extra) the tests that use these
fixtures fail with the reason: `make test` installs it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from collector.testbed.models import ModelSpec
from collector.testbed.server import TestbedError, TritonServer, find_triton, stub_processes_under

TritonFactory = Callable[..., TritonServer]

# Working directories of every server started in this session; stub command lines
# contain them, which is how the final sweep tells our stubs from anyone else's.
_WORKDIRS: list[Path] = []


@pytest.fixture(scope="session")
def triton_available() -> None:
    try:
        find_triton()
    except TestbedError as exc:
        pytest.fail(f"no tritonserver (install the testbed extra: make install): {exc}")


class _Factory:
    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self.servers: list[TritonServer] = []

    def __call__(self, specs: Iterable[ModelSpec], **kwargs: Any) -> TritonServer:
        # Under pytest's temp root, so the server log outlives a failed test.
        workdir = self._tmp.mktemp("triton")
        _WORKDIRS.append(workdir)
        # Triton waits out its whole exit timeout while an HTTP connection a client has
        # left (a finished `batchscope apply`, a collector) is still counted open: 10 s
        # per server at teardown. The testbed's inferences finish well within 3 s.
        kwargs.setdefault("exit_timeout_s", 3)
        server = TritonServer(specs, workdir=workdir, **kwargs)
        self.servers.append(server)
        server.start()
        return server

    def close(self) -> None:
        survivors: list[str] = []
        errors: list[str] = []
        for server in reversed(self.servers):
            try:
                server.close()
            except TestbedError as exc:
                errors.append(str(exc))
            for p in server.leftover_processes():
                survivors.append(f"{p.pid} ({server.workdir})")
                with contextlib.suppress(psutil.Error):
                    p.kill()
        assert not errors, f"stopping testbed servers failed: {errors}"
        assert not survivors, f"processes left after stop: {survivors}"


def _factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Factory]:
    factory = _Factory(tmp_path_factory)
    try:
        yield factory
    finally:
        factory.close()


@pytest.fixture
def triton_factory(
    triton_available: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonFactory]:
    """Start servers for one test: ``server = triton_factory([ModelSpec("m")])``."""
    yield from _factory(tmp_path_factory)


@pytest.fixture(scope="module")
def module_triton_factory(
    triton_available: None, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TritonFactory]:
    """Like ``triton_factory``, but its servers live until the module's last test."""
    yield from _factory(tmp_path_factory)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    leftovers = stub_processes_under(_WORKDIRS)
    if not leftovers:
        return
    pids = ", ".join(str(p.pid) for p in leftovers)
    for p in leftovers:
        with contextlib.suppress(psutil.Error):
            p.kill()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None:
        reporter.write_line(f"ERROR: triton_python_backend_stub processes left over: {pids}")
    session.exitstatus = pytest.ExitCode.TESTS_FAILED
