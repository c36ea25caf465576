"""NvmlSource against the real pynvml bindings and a fake libnvidia-ml.so.1.

The fake (tests/fakenvml/fake_nvml.c) is compiled once per session (the
``fake_libs`` fixture in tests/conftest.py). Each test runs
the source in a subprocess (tests/unit/nvml_runner.py) whose LD_LIBRARY_PATH points
at the fake, with the values and errors scripted by a scenario file
(tests/fakenvml/README.md describes the format).
"""

from __future__ import annotations

import ctypes
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.nvml_support import GIB, UUID0, UUID1, scenario

REPO = Path(__file__).resolve().parents[2]
RUNNER = Path(__file__).with_name("nvml_runner.py")

# GPM metric ids, as the fake's scenario names them.
SM_UTIL, SM_OCCUPANCY, ANY_TENSOR_UTIL = 2, 3, 5

# Two healthy GPUs with every reading the source asks for.
BASE: dict[str, object] = {
    "gpu.0.uuid": UUID0,
    "gpu.0.name": "NVIDIA H200",
    "gpu.0.utilization.gpu": 35,
    "gpu.0.utilization.memory": 20,
    "gpu.0.memory.total": 141 * GIB,
    "gpu.0.memory.used": 12 * GIB,
    "gpu.0.memory.reserved": 1 * GIB,
    "gpu.0.power.usage_mw": 250_500,
    "gpu.0.power.limit_mw": 700_000,
    "gpu.0.energy_mj": 5_000_000,
    "gpu.0.clock.sm": 1980,
    "gpu.1.uuid": UUID1,
    "gpu.1.name": "NVIDIA H200",
    "gpu.1.utilization.gpu": 0,
    "gpu.1.utilization.memory": 0,
    "gpu.1.memory.total": 141 * GIB,
    "gpu.1.memory.used": 0,
    "gpu.1.power.usage_mw": 75_000,
    "gpu.1.power.limit_mw": 700_000,
    "gpu.1.clock.sm": 345,
}


# --------------------------------------------------------------------------- harness


@dataclass
class Run:
    ticks: list[dict[str, Any]]
    calls: list[str]  # the fake's call log, one "<symbol> <handle> [details]" per call

    def records(self, tick: int) -> list[dict[str, Any]]:
        error = self.ticks[tick]["error"]
        assert error is None, f"tick {tick} failed: {error}"
        return self.ticks[tick]["records"]

    def devices(self, tick: int) -> dict[str, dict[str, Any]]:
        return {r["uuid"]: r for r in self.records(tick) if r["record"] == "DeviceSample"}

    def processes(self, tick: int) -> dict[tuple[str, int], dict[str, Any]]:
        return {
            (r["gpu_uuid"], r["pid"]): r
            for r in self.records(tick)
            if r["record"] == "ProcessSample"
        }

    def count(self, symbol: str, handle: str | None = None) -> int:
        return sum(
            1
            for line in self.calls
            if line.split()[0] == symbol and (handle is None or line.split()[1] == handle)
        )


@pytest.fixture
def run_source(fake_libs: dict[str, Path], tmp_path: Path):
    """run_source(tick scenarios, lib=..., clock=...) -> Run. A tick scenario of None
    keeps the previous file."""

    def run(ticks: list[str | None], *, lib: str = "full", clock: float | None = None) -> Run:
        scenario_path = tmp_path / "scenario.txt"
        call_log = tmp_path / "calls.log"
        scenario_path.write_text("")
        env = {k: v for k, v in os.environ.items() if not k.startswith("FAKE_NVML_")}
        env.update(
            LD_LIBRARY_PATH=str(fake_libs[lib]),
            FAKE_NVML_SCENARIO=str(scenario_path),
            FAKE_NVML_CALL_LOG=str(call_log),
            PYTHONPATH=os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
        )
        plan = {"scenario_path": str(scenario_path), "clock": clock, "ticks": ticks}
        result = subprocess.run(
            [sys.executable, str(RUNNER)],
            input=json.dumps(plan),
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
            timeout=30,
        )
        assert result.returncode == 0, f"runner failed:\n{result.stderr}"
        out = json.loads(result.stdout)
        calls = call_log.read_text().splitlines() if call_log.exists() else []
        return Run(ticks=out["ticks"], calls=calls)

    return run


def _system_has_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


# --------------------------------------------------------------------------- devices


def test_device_values_and_units(run_source) -> None:
    run = run_source([scenario(BASE)])
    devices = run.devices(0)
    assert set(devices) == {UUID0, UUID1}
    gpu0 = devices[UUID0]
    assert gpu0 == {
        **gpu0,
        "source": "nvml",
        "kind": "gpu",
        "index": 0,
        "name": "NVIDIA H200",
        "utilization_gpu_pct": 35.0,
        "utilization_memory_pct": 20.0,
        "memory_used_bytes": 12 * GIB,  # v2 struct: excludes the reserved GiB
        "memory_total_bytes": 141 * GIB,
        "power_w": 250.5,  # NVML: mW
        "power_limit_w": 700.0,
        "energy_j": 5000.0,  # NVML: mJ
        "sm_clock_mhz": 1980,
        "sm_active_pct": None,  # no GPM on this GPU
        "healthy": True,
        "error": None,
    }
    assert devices[UUID1]["index"] == 1
    assert devices[UUID1]["energy_j"] is None  # not scripted -> NOT_SUPPORTED
    # Lazy init, paired with one shutdown at close().
    assert run.count("nvmlInitWithFlags") == 1
    assert run.count("nvmlShutdown") == 1


def test_not_supported_reads_none_and_is_not_polled_again(run_source) -> None:
    unsupported = {
        "gpu.0.error.nvmlDeviceGetPowerUsage": "NOT_SUPPORTED",
        "gpu.0.error.nvmlDeviceGetClockInfo": "NOT_SUPPORTED",
    }
    run = run_source([scenario(BASE, unsupported), None, None])
    for tick in range(3):
        gpu0 = run.devices(tick)[UUID0]
        assert gpu0["power_w"] is None
        assert gpu0["sm_clock_mhz"] is None
        assert gpu0["power_limit_w"] == 700.0  # the rest of the GPU still reads
        assert gpu0["healthy"] is True
        assert run.devices(tick)[UUID1]["power_w"] == 75.0
    assert run.count("nvmlDeviceGetPowerUsage", "gpu0") == 1
    assert run.count("nvmlDeviceGetClockInfo", "gpu0") == 1
    assert run.count("nvmlDeviceGetPowerUsage", "gpu1") == 3


def test_one_gpu_lost_while_the_other_reports(run_source) -> None:
    lost = {"gpu.1.error.*": "GPU_IS_LOST"}
    run = run_source([scenario(BASE), scenario(BASE, lost), None, scenario(BASE)])

    assert all(d["healthy"] for d in run.devices(0).values())
    for tick in (1, 2):
        devices = run.devices(tick)
        assert devices[UUID1]["healthy"] is False
        assert devices[UUID1]["error"] == "gpu_is_lost"
        assert devices[UUID1]["index"] == 1
        assert devices[UUID1]["power_w"] is None
        assert devices[UUID0]["healthy"] is True
        assert devices[UUID0]["power_w"] == 250.5
    # After the loss the source enumerates again: 2 handles at tick 0, 2 at tick 2
    # (GPU 1 still lost there) and 2 at tick 3 (the loss cleared).
    assert run.count("nvmlDeviceGetHandleByIndex_v2") == 6
    assert run.devices(3)[UUID1]["healthy"] is True
    assert run.devices(3)[UUID1]["power_w"] == 75.0


def test_gpu_lost_before_its_uuid_was_read(run_source) -> None:
    run = run_source([scenario(BASE, {"gpu.1.error.*": "GPU_IS_LOST"})])
    devices = run.devices(0)
    assert devices[UUID0]["healthy"] is True
    lost = [d for d in devices.values() if not d["healthy"]]
    assert [(d["index"], d["error"]) for d in lost] == [(1, "gpu_is_lost")]


# --------------------------------------------------------------------------- processes


RUNNING = {
    "gpu.0.process.0.pid": 4242,
    "gpu.0.process.0.memory": 3 * GIB,
    "gpu.0.process.1.pid": 4343,
    "gpu.0.process.1.memory": "NA",  # NVML_VALUE_NOT_AVAILABLE
}


def test_not_found_means_no_samples_and_running_processes_read_zero(run_source) -> None:
    run = run_source([scenario(BASE, RUNNING)])  # no putil entries -> NOT_FOUND
    procs = run.processes(0)
    assert set(procs) == {(UUID0, 4242), (UUID0, 4343)}
    assert procs[(UUID0, 4242)] == {
        **procs[(UUID0, 4242)],
        "source": "nvml",
        "role": "gpu",
        "sm_util_pct": 0.0,
        "mem_util_pct": 0.0,
        "gpu_memory_bytes": 3 * GIB,
    }
    assert procs[(UUID0, 4343)]["gpu_memory_bytes"] is None
    assert run.count("nvmlDeviceGetProcessUtilization") == 0  # no fallback on NOT_FOUND


def test_sizing_call_answering_success_is_treated_as_no_samples(run_source) -> None:
    # pynvml then raises a base NVMLError with value 0 (§1.5 of the NVML notes).
    quirk = {"gpu.0.error.nvmlDeviceGetProcessesUtilizationInfo": "SUCCESS"}
    run = run_source([scenario(BASE, RUNNING, quirk)])
    procs = run.processes(0)
    assert procs[(UUID0, 4242)]["sm_util_pct"] == 0.0
    assert run.devices(0)[UUID0]["healthy"] is True


def test_process_utilization_since_the_last_seen_sample(run_source) -> None:
    now = 1000.0  # the source's clock, in s; samples are in µs
    samples = {
        "gpu.0.putil.0.pid": 4242,
        "gpu.0.putil.0.sm": 10,
        "gpu.0.putil.0.ts": 999_200_000,
        "gpu.0.putil.1.pid": 4242,  # a newer sample of the same process wins
        "gpu.0.putil.1.sm": 30,
        "gpu.0.putil.1.mem": 12,
        "gpu.0.putil.1.ts": 999_500_000,
        "gpu.0.putil.2.pid": 5555,  # not a compute process (e.g. graphics): still listed
        "gpu.0.putil.2.sm": 7,
        "gpu.0.putil.2.ts": 999_400_000,
        "gpu.0.putil.3.pid": 4343,
        "gpu.0.putil.3.sm": 250,  # impossible value
        "gpu.0.putil.3.ts": 999_300_000,
    }
    run = run_source([scenario(BASE, RUNNING, samples), None], clock=now)
    first = run.processes(0)
    assert (first[(UUID0, 4242)]["sm_util_pct"], first[(UUID0, 4242)]["mem_util_pct"]) == (
        30.0,
        12.0,
    )
    assert first[(UUID0, 5555)]["sm_util_pct"] == 7.0
    assert first[(UUID0, 5555)]["gpu_memory_bytes"] is None
    assert first[(UUID0, 4343)]["sm_util_pct"] is None
    # First query: the last second; second query: after the newest sample seen.
    queries = [c for c in run.calls if c.startswith("nvmlDeviceGetProcessesUtilizationInfo gpu0")]
    assert "lastSeen=999000000" in queries[0]
    assert "lastSeen=999500000" in queries[-1]
    # Nothing newer at tick 1: the known processes are idle, not gone.
    second = run.processes(1)
    assert second[(UUID0, 4242)]["sm_util_pct"] == 0.0
    assert (UUID0, 5555) not in second


def test_function_not_found_falls_back_to_the_older_api(run_source) -> None:
    samples = {"gpu.0.putil.0.pid": 4242, "gpu.0.putil.0.sm": 55, "gpu.0.putil.0.mem": 5}
    run = run_source([scenario(BASE, RUNNING, samples), None], lib="old_driver")
    for tick in (0, 1):
        assert run.devices(tick)[UUID0]["healthy"] is True
    assert run.processes(0)[(UUID0, 4242)]["sm_util_pct"] == 55.0
    assert run.processes(0)[(UUID0, 4343)]["sm_util_pct"] == 0.0
    # The older API served both GPUs on both ticks (GPU 1 has no samples: one call
    # a tick that answers NOT_FOUND; GPU 0 a sizing call and a copy).
    assert run.count("nvmlDeviceGetProcessUtilization", "gpu1") == 2
    assert run.count("nvmlDeviceGetProcessUtilization", "gpu0") == 4


# --------------------------------------------------------------------------- MIG, GPM

MIG_UUID_A = "MIG-aaaaaaaa-0000-0000-0000-000000000000"
MIG_UUID_B = "MIG-bbbbbbbb-0000-0000-0000-000000000000"
MIG = {
    "gpu.0.mig.enabled": 1,
    "gpu.0.mig.0.uuid": MIG_UUID_A,
    "gpu.0.mig.0.name": "NVIDIA H200 MIG 3g.71gb",
    "gpu.0.mig.0.gi": 1,
    "gpu.0.mig.0.ci": 0,
    "gpu.0.mig.0.memory.total": 70 * GIB,
    "gpu.0.mig.0.memory.used": 8 * GIB,
    "gpu.0.mig.0.process.0.pid": 777,
    "gpu.0.mig.0.process.0.memory": 6 * GIB,
    "gpu.0.mig.1.uuid": MIG_UUID_B,
    "gpu.0.mig.1.gi": 2,
    "gpu.0.mig.1.ci": 0,
    "gpu.0.mig.1.memory.total": 70 * GIB,
    "gpu.0.mig.1.memory.used": 0,
    "gpu.1.mig.enabled": 0,
}


def test_mig_instances_are_listed_with_their_parent(run_source) -> None:
    run = run_source([scenario(BASE, MIG)])
    devices = run.devices(0)
    assert set(devices) == {UUID0, UUID1, MIG_UUID_A, MIG_UUID_B}
    mig_a = devices[MIG_UUID_A]
    assert mig_a == {
        **mig_a,
        "kind": "mig",
        "parent_uuid": UUID0,
        "gpu_instance_id": 1,
        "compute_instance_id": 0,
        "name": "NVIDIA H200 MIG 3g.71gb",
        "memory_used_bytes": 8 * GIB,
        "memory_total_bytes": 70 * GIB,
        "utilization_gpu_pct": None,
    }
    assert devices[MIG_UUID_B]["gpu_instance_id"] == 2
    # Utilization rates are not supported on a MIG-enabled GPU; the rest still reads.
    assert devices[UUID0]["utilization_gpu_pct"] is None
    assert devices[UUID0]["power_w"] == 250.5
    assert devices[UUID1]["kind"] == "gpu"
    assert devices[UUID1]["utilization_gpu_pct"] == 0.0
    # Processes are listed per instance; NVML has no per-process utilization there.
    procs = run.processes(0)
    assert procs[(MIG_UUID_A, 777)]["gpu_memory_bytes"] == 6 * GIB
    assert procs[(MIG_UUID_A, 777)]["sm_util_pct"] is None


def _gpm(prefix: str, sm: float, occupancy: float, tensor: float) -> dict[str, object]:
    return {
        f"{prefix}.gpm.metric.{SM_UTIL}": sm,
        f"{prefix}.gpm.metric.{SM_OCCUPANCY}": occupancy,
        f"{prefix}.gpm.metric.{ANY_TENSOR_UTIL}": tensor,
    }


def test_gpm_values_from_the_second_tick_on(run_source) -> None:
    on = {"gpu.0.gpm.supported": 1}
    run = run_source(
        [
            scenario(BASE, on, _gpm("gpu.0", 10, 5, 1)),
            scenario(BASE, on, _gpm("gpu.0", 62.5, 31.25, 40)),
            scenario(BASE, on, {f"gpu.0.gpm.metric.{SM_UTIL}": 70}),  # others not counted
        ]
    )
    first = run.devices(0)[UUID0]
    assert (first["sm_active_pct"], first["sm_occupancy_pct"], first["tensor_active_pct"]) == (
        None,
        None,
        None,
    )
    second = run.devices(1)[UUID0]
    assert (second["sm_active_pct"], second["sm_occupancy_pct"], second["tensor_active_pct"]) == (
        62.5,
        31.25,
        40.0,
    )
    third = run.devices(2)[UUID0]
    assert (third["sm_active_pct"], third["sm_occupancy_pct"]) == (70.0, None)
    # GPU 1 has no GPM: no samples are allocated for it, and all GPM fields are None.
    assert run.devices(1)[UUID1]["sm_active_pct"] is None
    assert run.count("nvmlGpmSampleGet", "gpu1") == 0
    # Two buffers for GPU 0, freed at close().
    assert run.count("nvmlGpmSampleAlloc") == 2
    assert run.count("nvmlGpmSampleFree") == 2


def test_gpm_per_mig_instance(run_source) -> None:
    on = {"gpu.0.gpm.supported": 1}
    ticks = [
        scenario(BASE, MIG, on, _gpm("gpu.0.mig.0", 20, 10, 5), _gpm("gpu.0.mig.1", 1, 1, 0)),
        scenario(BASE, MIG, on, _gpm("gpu.0.mig.0", 80, 45, 33), _gpm("gpu.0.mig.1", 2, 1, 0)),
    ]
    run = run_source(ticks)
    assert run.devices(0)[MIG_UUID_A]["sm_active_pct"] is None
    mig_a = run.devices(1)[MIG_UUID_A]
    assert (mig_a["sm_active_pct"], mig_a["sm_occupancy_pct"], mig_a["tensor_active_pct"]) == (
        80.0,
        45.0,
        33.0,
    )
    assert run.devices(1)[MIG_UUID_B]["sm_active_pct"] == 2.0
    assert any(c.startswith("nvmlGpmMigSampleGet gpu0 gi=2") for c in run.calls)
    assert run.count("nvmlGpmSampleAlloc") == run.count("nvmlGpmSampleFree")


# --------------------------------------------------------------------------- init


def test_no_library_is_a_host_fact_not_a_failure_and_is_retried(run_source) -> None:
    """A CPU host: no libnvidia-ml.so.1. Each tick succeeds with the fact that the
    host has no NVIDIA GPU (and why), and no device; NVML is tried again each tick."""
    if _system_has_nvml():
        pytest.skip("this host has a real libnvidia-ml.so.1 on its loader path")
    run = run_source([scenario(BASE), None], lib="empty")
    for i in range(2):
        (facts,) = run.records(i)
        assert facts["record"] == "HostFacts" and facts["target"] == "test-host"
        assert "libnvidia-ml.so.1 was not found" in facts["nvml_absent"]
        assert facts["cpu_count"] >= 1


def test_driver_not_loaded_is_a_host_fact_then_init_is_retried(run_source) -> None:
    down = {"error.nvmlInitWithFlags": "DRIVER_NOT_LOADED"}
    run = run_source([scenario(BASE, down), scenario(BASE)])
    (facts,) = run.records(0)
    assert facts["record"] == "HostFacts"
    assert "kernel driver is not loaded" in facts["nvml_absent"]
    # The driver is there on the next tick: the GPUs, and the fact cleared.
    assert set(run.devices(1)) == {UUID0, UUID1}
    (cleared,) = [r for r in run.records(1) if r["record"] == "HostFacts"]
    assert cleared["nvml_absent"] is None
    assert run.count("nvmlInitWithFlags") == 2
    assert run.count("nvmlShutdown") == 1  # only the successful init is paired


def test_a_driver_that_does_not_match_its_library_is_a_failure(run_source) -> None:
    """NVML on a GPU host that errors is an outage, unlike a host without NVML."""
    mismatch = {"error.nvmlInitWithFlags": "LIB_RM_VERSION_MISMATCH"}
    run = run_source([scenario(BASE, mismatch)])
    error = run.ticks[0]["error"]
    assert error["type"] == "NvmlUnavailable" and error["error_kind"] == "nvml_unavailable"
    assert "differ in version" in error["message"]


# --------------------------------------------------------------------------- registry


def test_registered_as_one_per_host_source() -> None:
    from collector.config import Settings
    from collector.sources.base import SOURCES
    from collector.sources.nvml import NvmlSource

    spec = SOURCES["nvml"]
    assert spec.per_target is False
    source = spec.factory(Settings(), None)  # does not touch NVML until collect()
    assert isinstance(source, NvmlSource)
    assert source.name == "nvml"
    assert source.target
    source.close()
