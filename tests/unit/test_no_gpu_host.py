"""A CPU host (no NVML library) is a quiet fact, not an outage: the NVML source's
scrape succeeds with ``HostFacts.nvml_absent``, the host target is up, and status
says "no NVIDIA GPU on this host" instead of an error."""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.analysis.status import build_status
from collector.config import Settings
from collector.report import render_status
from collector.scheduler import CollectorService
from collector.sources.nvml import NvmlSource
from collector.store import Store


def _system_has_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(f"sqlite:///{tmp_path}/cpu.db")
    try:
        yield s
    finally:
        s.close()


def test_a_host_without_nvml_is_up_with_the_fact_that_it_has_no_gpu(
    store: Store, tmp_path: Path
) -> None:
    if _system_has_nvml():
        pytest.skip("this host has a real libnvidia-ml.so.1 on its loader path")
    settings = Settings(db_url=f"sqlite:///{tmp_path}/cpu.db", interval_s=1.0)
    source = NvmlSource("cpu-host")
    service = CollectorService(settings, store, [source])
    try:
        assert service.run_source(source)  # the scrape succeeded
    finally:
        service.shutdown()
    (state,) = store.targets()
    assert (state.name, state.up, state.consecutive_failures) == ("cpu-host", True, 0)
    assert state.last_error is None
    facts = store.host_facts("cpu-host")
    assert facts is not None and facts.nvml_absent is not None
    assert "libnvidia-ml.so.1 was not found" in facts.nvml_absent

    report = build_status(store, now=state.last_seen_at)
    (target,) = report.targets
    assert target.health.state == "up"
    assert target.facts is not None and target.facts.nvml_absent
    text = render_status(report)
    assert "no NVIDIA GPU on this host" in text
    assert "down" not in text
