"""NVML failing under a running ``batchscope collect``, through the fake library.

One collector scrapes the host's NVML (the fake ``libnvidia-ml.so.1`` of
``tests/fakenvml``, whose scenario file is read again on every call) and a Triton
look-alike every second, while the scenario turns, one phase after the other: a GPU
lost, a reading not supported, a second GPU appearing, the kernel driver gone mid-run
(DRIVER_NOT_LOADED, and init failing too), NVML uninitialised under the collector.
Each phase must be seen in the store, the collector keeps running, the Triton target
keeps its interval, and NVML is read again once the scenario is healthy. Then a fresh
collector starts on a host whose library is gone: the host's facts say why, and the
Triton target is collected all the same.
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

from collector.store import Store
from collector.store.rows import StoredDevice, TargetTransition
from tests.nvml_support import GIB, UUID0, UUID1, scenario, write_scenario
from tests.reliability.conftest import FaultLedger
from tests.reliability.fault_server import FaultServer
from tests.support import RunningCollector, running_collector, wait_until

INTERVAL_S = 1.0
PHASE_TIMEOUT_S = 8.0  # the longest wait for one phase to show in the store
GPU0: dict[str, object] = {
    "gpu.count": 1,
    "gpu.0.uuid": UUID0,
    "gpu.0.name": "NVIDIA H200",
    "gpu.0.utilization.gpu": 35,
    "gpu.0.utilization.memory": 20,
    "gpu.0.memory.total": 141 * GIB,
    "gpu.0.memory.used": 12 * GIB,
    "gpu.0.power.usage_mw": 250_500,
    "gpu.0.power.limit_mw": 700_000,
    "gpu.0.clock.sm": 1980,
}
GPU1: dict[str, object] = {
    "gpu.count": 2,
    "gpu.1.uuid": UUID1,
    "gpu.1.name": "NVIDIA H200",
    "gpu.1.utilization.gpu": 0,
    "gpu.1.utilization.memory": 0,
    "gpu.1.memory.total": 141 * GIB,
    "gpu.1.memory.used": 3 * GIB,
}


def _every_call(code: str, gpus: int) -> dict[str, object]:
    """Every call NVML answers after its init fails with ``code``."""
    errors: dict[str, object] = {f"gpu.{i}.error.*": code for i in range(gpus)}
    errors["error.nvmlDeviceGetCount"] = code
    return errors


@dataclass
class Phase:
    name: str
    started: float
    seen_after: float  # s from the phase's start to the store showing it
    back_after: float | None = None  # s from the healthy scenario to readings again
    triton_scrapes: int = 0  # of the Triton target during the phase
    duration_s: float = 0.0


class Collector:
    """The running collector, its scenario file and its store."""

    def __init__(self, scenario: Path, store: Store, triton: str) -> None:
        self.scenario = scenario
        self.store = store
        self.host = socket.gethostname()
        self.triton = triton

    def write(self, *parts: Mapping[str, object]) -> float:
        """Make the scenario ``parts`` (later wins), atomically; when it was made."""
        write_scenario(self.scenario, scenario(*parts))
        return time.time()

    def devices(self, since: float) -> list[StoredDevice]:
        return self.store.device_samples(since=since, source="nvml")

    def nvml_transitions(self, since: float) -> list[TargetTransition]:
        return self.store.transitions(self.host, source="nvml", since=since)

    def triton_scrapes(self, since: float, until: float) -> int:
        samples = self.store.model_samples(target=self.triton, since=since, until=until)
        return len({s.collected_at for s in samples})

    def wait(self, what: str, check: Callable[[], bool], since: float) -> float:
        """Seconds from ``since`` until ``check()`` holds."""
        wait_until(check, PHASE_TIMEOUT_S, what, every_s=0.1)
        return time.time() - since


def _collecting(
    tmp: Path, db_url: str, server: FaultServer, lib_dir: Path, scenario: Path
) -> contextlib.AbstractContextManager[RunningCollector]:
    """``batchscope collect`` of the look-alike and of NVML from ``lib_dir`` (the fake
    library reading ``scenario``) every second into the store at ``db_url``."""
    settings = {
        "targets": [
            {"name": "triton-a", "url": server.url("a"), "metrics_url": server.metrics_url("a")}
        ],
        "db_url": db_url,
        "interval_s": INTERVAL_S,
        "timeout_s": 2,
        "backoff_max_s": INTERVAL_S,
        "jitter_s": 0,
        "duration_s": 120,
        "sources": ["triton", "nvml"],
    }
    env = {"LD_LIBRARY_PATH": str(lib_dir), "FAKE_NVML_SCENARIO": str(scenario)}
    return running_collector(tmp, settings=settings, env=env)


@pytest.fixture(scope="module")
def server() -> Iterator[FaultServer]:
    with FaultServer(["a"]) as fault_server:
        yield fault_server


def test_nvml_errors_mid_run_are_recorded_and_collection_goes_on(
    fake_libs: dict[str, Path],
    server: FaultServer,
    tmp_path: Path,
    fault_ledger: FaultLedger,
) -> None:
    scenario = tmp_path / "scenario.txt"
    db_url = f"sqlite:///{tmp_path / 'nvml.db'}"
    c_store = Store(db_url)
    c = Collector(scenario, c_store, "triton-a")
    c.write(GPU0)
    phases: list[Phase] = []
    with (
        _collecting(tmp_path, db_url, server, fake_libs["full"], scenario) as collect,
        contextlib.closing(c_store),
    ):
        start = time.time()

        def gpu_read(uuid: str, since: float) -> bool:
            return any(d.sample.uuid == uuid and d.sample.healthy for d in c.devices(since))

        c.wait("GPU 0's first readings", lambda: gpu_read(UUID0, start), start)

        # 1. GPU 0 falls off the bus: reported unhealthy with the reason; the host's NVML
        # scrape still succeeds (a lost GPU is a reading, not an outage).
        at = c.write(GPU0, {"gpu.0.error.*": "GPU_IS_LOST"})
        seen = c.wait(
            "GPU 0 reported lost",
            lambda: any(
                d.sample.uuid == UUID0 and not d.sample.healthy and d.sample.error == "gpu_is_lost"
                for d in c.devices(at)
            ),
            at,
        )
        assert c.store.targets() and {t.name: t for t in c.store.targets()}[c.host].up
        ok_at = c.write(GPU0)
        back = c.wait("GPU 0 read again", lambda: gpu_read(UUID0, ok_at), ok_at)
        phases.append(Phase("GPU_IS_LOST on GPU 0", at, seen, back))

        # 2. A reading turns NOT_SUPPORTED: None for it, the others still read.
        at = c.write(GPU0, {"gpu.0.error.nvmlDeviceGetPowerUsage": "NOT_SUPPORTED"})
        seen = c.wait(
            "power not supported, memory still read",
            lambda: any(
                d.sample.uuid == UUID0
                and d.sample.power_w is None
                and d.sample.memory_used_bytes == 12 * GIB
                for d in c.devices(at)
            ),
            at,
        )
        phases.append(Phase("NOT_SUPPORTED for power on GPU 0", at, seen))
        c.write(GPU0)

        # 3. A second GPU appears (gpu.count 1 -> 2): enumerated without a restart.
        at = c.write(GPU0, GPU1)
        seen = c.wait("GPU 1 picked up", lambda: gpu_read(UUID1, at), at)
        phases.append(Phase("a GPU appears later (count 1 -> 2)", at, seen))

        # 4. The kernel driver goes away mid-run, and NVML cannot be initialised again.
        at = c.write(
            GPU0,
            GPU1,
            _every_call("DRIVER_NOT_LOADED", 2),
            {"error.nvmlInitWithFlags": "DRIVER_NOT_LOADED"},
        )
        seen = c.wait(
            "the driver's loss recorded, then the host's fact",
            lambda: (
                any(
                    not t.up
                    and t.error_kind == "nvml_unavailable"
                    and "driver is not loaded" in (t.error or "")
                    for t in c.nvml_transitions(at)
                )
                and (c.store.host_facts(c.host) or _NO_FACTS).nvml_absent is not None
            ),
            at,
        )
        facts = c.store.host_facts(c.host)
        assert facts is not None and facts.nvml_absent == "the NVIDIA kernel driver is not loaded"
        ok_at = c.write(GPU0, GPU1)
        back = c.wait(
            "both GPUs read again with the driver back",
            lambda: (
                gpu_read(UUID0, ok_at)
                and gpu_read(UUID1, ok_at)
                and (c.store.host_facts(c.host) or _NO_FACTS).nvml_absent is None
            ),
            ok_at,
        )
        phases.append(Phase("DRIVER_NOT_LOADED mid-run (library vanished)", at, seen, back))

        # 5. NVML answers UNINITIALIZED to everything: recorded, initialised again.
        at = c.write(GPU0, GPU1, _every_call("UNINITIALIZED", 2))
        seen = c.wait(
            "NVML uninitialised recorded",
            lambda: any(
                not t.up and "no longer initialised" in (t.error or "")
                for t in c.nvml_transitions(at)
            ),
            at,
        )
        ok_at = c.write(GPU0, GPU1)
        back = c.wait(
            "both GPUs read again", lambda: gpu_read(UUID0, ok_at) and gpu_read(UUID1, ok_at), ok_at
        )
        phases.append(Phase("UNINITIALIZED mid-run", at, seen, back))

        ended = time.time()
        assert collect.proc.poll() is None, collect.log()
        # The Triton target kept its interval through every phase.
        bounds = [p.started for p in phases] + [ended]
        for phase, until in zip(phases, bounds[1:], strict=True):
            phase.duration_s = until - phase.started
            phase.triton_scrapes = c.triton_scrapes(phase.started, until)
            assert phase.triton_scrapes >= phase.duration_s / INTERVAL_S - 1.5, phase
        total_s = ended - phases[0].started
        total = c.triton_scrapes(phases[0].started, ended)
        assert total >= total_s / INTERVAL_S - 1.5, (total, total_s)
        host = {t.name: t for t in c.store.targets()}[c.host]
        assert host.up and host.sources.get("nvml") is True, host
    assert collect.proc.returncode == 0, collect.log()
    for phase in phases:
        healed = (
            ""
            if phase.back_after is None
            else f", read again {phase.back_after:.1f} s after the scenario healed"
        )
        fault_ledger.record(
            area="nvml",
            fault=phase.name,
            tries=1,
            outcome=(
                f"seen in the store {phase.seen_after:.1f} s after the scenario changed{healed}; "
                f"the Triton target kept its {INTERVAL_S:g} s interval throughout ({total} "
                f"scrapes in the {total_s:.1f} s of all five phases); the collector ran on"
            ),
        )


class _NoFacts:
    nvml_absent: str | None = "no facts yet"


_NO_FACTS = _NoFacts()


def test_a_fresh_collector_without_the_library_says_so_and_collects_triton(
    fake_libs: dict[str, Path],
    server: FaultServer,
    tmp_path: Path,
    fault_ledger: FaultLedger,
) -> None:
    # The library removed: a directory that held it, emptied before the start.
    lib_dir = tmp_path / "lib"
    lib_dir.mkdir()
    (lib_dir / "libnvidia-ml.so.1").write_bytes(
        (fake_libs["full"] / "libnvidia-ml.so.1").read_bytes()
    )
    (lib_dir / "libnvidia-ml.so.1").unlink()
    scenario = tmp_path / "scenario.txt"
    scenario.write_text("gpu.count = 1\n")
    db_url = f"sqlite:///{tmp_path / 'nolib.db'}"
    start = time.time()
    with (
        _collecting(tmp_path, db_url, server, lib_dir, scenario) as collect,
        contextlib.closing(Store(db_url)) as store,
    ):
        host = socket.gethostname()
        wait_until(
            lambda: (
                (store.host_facts(host) or _NO_FACTS).nvml_absent is not None
                and len({s.collected_at for s in store.model_samples(target="triton-a")}) >= 3
            ),
            PHASE_TIMEOUT_S + 5,
            "the host's fact and three Triton scrapes",
        )
        seen = time.time() - start
        facts = store.host_facts(host)
        assert facts is not None and facts.nvml_absent is not None
        assert "libnvidia-ml.so.1 was not found" in facts.nvml_absent
        state = {t.name: t for t in store.targets()}[host]
        assert state.up and state.sources.get("nvml") is True, state
        assert store.device_samples(source="nvml") == []
        assert collect.proc.poll() is None
    assert collect.proc.returncode == 0, collect.log()
    fault_ledger.record(
        area="nvml",
        fault="libnvidia-ml.so.1 removed, collector started afresh",
        tries=1,
        outcome=(
            f"host fact nvml_absent = '{facts.nvml_absent[:60]}...' and 3 Triton scrapes "
            f"stored {seen:.1f} s after start; host target up, no device rows; exit 0"
        ),
    )
