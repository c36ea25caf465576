"""Mapping Triton's processes to model instances from their command lines, and the
facts of the machine Triton runs on."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import PurePosixPath

import psutil
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collector.config import target_from_url
from collector.records import HostFacts, ProcessSample
from collector.sources.host import (
    HostSource,
    StubIdentity,
    http_port_of,
    path_parts,
    program_name,
    stub_identity,
)
from tests.support import start_process, wait_until

# As recorded from the CPU testbed (`ps -o args`), with the temporary folder renamed.
STUB_CMDLINE = [
    "/srv/tb/backends/python/triton_python_backend_stub",
    "/srv/tb/models/batched/1/model.py",
    "triton_python_backend_shm_region_dec16056-7e79-4ce7-bf03-9ca765c4d759",
    "1048576",
    "1048576",
    "12815",
    "/srv/tb/backends/python",
    "336",
    "batched_0_0",
    "DEFAULT",
]


def test_stub_identity_from_recorded_command_line() -> None:
    identity = stub_identity(STUB_CMDLINE)
    assert identity.model == "batched"
    assert identity.instance_name == "batched_0_0"


def test_stub_identity_falls_back_to_the_instance_name() -> None:
    identity = stub_identity(["stub", "no-model-path-here", "my_model_1_3", "DEFAULT"])
    assert identity.instance_name == "my_model_1_3"
    assert identity.model == "my_model"


def pathlib_stub_identity(cmdline: list[str]) -> StubIdentity:
    """``stub_identity`` as it read paths through pathlib: the reference."""
    model = None
    for arg in cmdline[1:]:
        path = PurePosixPath(arg)
        if path.suffix == ".py" and len(path.parts) >= 3 and path.parent.name.isdigit():
            model = path.parent.parent.name
            break
    instance = cmdline[-2] if len(cmdline) >= 3 else None
    if instance is not None and model is None and "_" in instance:
        model = instance.rsplit("_", 2)[0]
    return StubIdentity(model=model, instance_name=instance)


# Paths made of the pieces that matter: slashes (single, double, leading, trailing),
# dots, digits, ".py" names and plain names.
_PIECES = ["/", "//", ".", "..", "1", "12", "m", "model.py", ".py", "..py", "a.py.", "x"]
_PATH = st.lists(st.sampled_from(_PIECES), max_size=8).map("".join)


@settings(max_examples=300, deadline=None)
@given(st.lists(_PATH, min_size=0, max_size=5))
def test_command_lines_read_as_pathlib_reads_them(cmdline: list[str]) -> None:
    for arg in cmdline:
        path = PurePosixPath(arg)
        assert path_parts(arg) == list(path.parts[1:] if path.root else path.parts)
        assert program_name(arg) == path.name
    assert stub_identity(cmdline) == pathlib_stub_identity(cmdline)


def test_reading_command_lines_interns_no_string(monkeypatch: pytest.MonkeyPatch) -> None:
    """The host is read every tick, every process's command line with it: strings
    interned and freed each second churn the interpreter's table of interned strings
    (pathlib interns every component it parses), which grew ``serve`` by 1.8 MiB."""
    interned: list[str] = []
    monkeypatch.setattr(sys, "intern", lambda text: interned.append(text) or text)
    identity = stub_identity(STUB_CMDLINE)
    name = program_name("/opt/tritonserver/bin/tritonserver")
    assert interned == []
    assert (identity.model, name) == ("batched", "tritonserver")
    # The check can fail: the reference, through pathlib, interns each component.
    assert pathlib_stub_identity(STUB_CMDLINE) == identity
    assert "batched" in interned


def test_http_port_of_server_command_line() -> None:
    assert http_port_of(["tritonserver", "--model-repository=/m", "--http-port=18000"]) == 18000
    assert http_port_of(["tritonserver", "--http-port", "9000"]) == 9000
    assert http_port_of(["tritonserver", "--model-repository=/m"]) == 8000


def test_remote_target_yields_nothing_and_touches_no_process() -> None:
    calls: list[int] = []

    def processes() -> list[psutil.Process]:
        calls.append(1)
        return []

    source = HostSource(target_from_url("http://triton.example.invalid:8000"), processes=processes)
    assert source.collect() == []
    assert calls == []


def test_local_target_without_server_is_reported_down() -> None:
    # A real process that is not a tritonserver: the source must not mistake it for one.
    child = start_process([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        source = HostSource(
            target_from_url("http://127.0.0.1:1"), processes=lambda: [psutil.Process(child.pid)]
        )
        try:
            source.collect()
        except Exception as exc:  # noqa: BLE001 - the kind is what matters
            assert getattr(exc, "error_kind", None) == "down"
            assert "port 1" in str(exc)
        else:
            raise AssertionError("expected TargetDown")
    finally:
        child.kill()
        child.wait()


FAKE_SERVER_PORT = 18123
FAKE_SERVER_TARGET = target_from_url(f"http://127.0.0.1:{FAKE_SERVER_PORT}")


@pytest.fixture
def fake_server() -> Iterator[subprocess.Popen[bytes]]:
    """A real process whose command line reads as a tritonserver on FAKE_SERVER_PORT."""
    child = start_process(
        ["tritonserver", "-c", "import time; time.sleep(30)", f"--http-port={FAKE_SERVER_PORT}"],
        executable=sys.executable,
    )
    try:
        # Until the child has exec'd, its command line is still this process's.
        wait_until(
            lambda: psutil.Process(child.pid).cmdline()[:1] == ["tritonserver"],
            10,
            "the fake tritonserver's command line",
        )
        yield child
    finally:
        child.kill()
        child.wait()


def _collect(server: subprocess.Popen[bytes]) -> list[ProcessSample | HostFacts]:
    source = HostSource(
        FAKE_SERVER_TARGET,
        processes=lambda: [psutil.Process(server.pid)],
        wall_clock=lambda: 1234.5,
    )
    return source.collect()


def test_host_facts_give_the_cpu_count_of_the_triton_host(
    fake_server: subprocess.Popen[bytes],
) -> None:
    records = _collect(fake_server)
    server = [r for r in records if isinstance(r, ProcessSample)]
    assert [(r.pid, r.role) for r in server] == [(fake_server.pid, "server")]
    expected = len(psutil.Process(fake_server.pid).cpu_affinity())
    assert [r for r in records if isinstance(r, HostFacts)] == [
        HostFacts(target=FAKE_SERVER_TARGET.name, collected_at=1234.5, cpu_count=expected)
    ]


@pytest.mark.skipif(
    not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
    reason="needs CPU affinity and two CPUs",
)
def test_host_facts_count_the_cpus_triton_may_use_not_ours(
    fake_server: subprocess.Popen[bytes],
) -> None:
    # Triton pinned to one CPU (taskset, --cpuset-cpus) while batchscope may use more:
    # the count is Triton's.
    os.sched_setaffinity(fake_server.pid, {min(os.sched_getaffinity(0))})
    facts = [r for r in _collect(fake_server) if isinstance(r, HostFacts)]
    assert [f.cpu_count for f in facts] == [1]
    assert len(os.sched_getaffinity(0)) >= 2
