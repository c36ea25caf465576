"""Mapping Triton's processes to model instances from their command lines."""

from __future__ import annotations

import subprocess
import sys

import psutil

from collector.config import target_from_url
from collector.sources.host import HostSource, http_port_of, stub_identity

# As recorded from the CPU testbed (`ps -o args`), with the temporary folder renamed.
STUB_CMDLINE = [
    "/srv/tb/backends/python/triton_python_backend_stub", "/srv/tb/models/batched/1/model.py",
    "triton_python_backend_shm_region_dec16056-7e79-4ce7-bf03-9ca765c4d759", "1048576",
    "1048576", "12815", "/srv/tb/backends/python", "336", "batched_0_0", "DEFAULT",
]


def test_stub_identity_from_recorded_command_line() -> None:
    identity = stub_identity(STUB_CMDLINE)
    assert identity.model == "batched"
    assert identity.instance_name == "batched_0_0"


def test_stub_identity_falls_back_to_the_instance_name() -> None:
    identity = stub_identity(["stub", "no-model-path-here", "my_model_1_3", "DEFAULT"])
    assert identity.instance_name == "my_model_1_3"
    assert identity.model == "my_model"


def test_http_port_of_server_command_line() -> None:
    assert http_port_of(["tritonserver", "--model-repository=/m", "--http-port=18000"]) == 18000
    assert http_port_of(["tritonserver", "--http-port", "9000"]) == 9000
    assert http_port_of(["tritonserver", "--model-repository=/m"]) == 8000


def test_remote_target_yields_nothing_and_touches_no_process() -> None:
    calls: list[int] = []

    def processes() -> list[psutil.Process]:
        calls.append(1)
        return []

    source = HostSource(target_from_url("http://triton.example.invalid:8000"),
                        processes=processes)
    assert source.collect() == []
    assert calls == []


def test_local_target_without_server_is_reported_down() -> None:
    # A real process that is not a tritonserver: the source must not mistake it for one.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        source = HostSource(target_from_url("http://127.0.0.1:1"),
                            processes=lambda: [psutil.Process(child.pid)])
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
