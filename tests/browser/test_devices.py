"""GPU tiles on the overview and the Devices page, from a real collection: ``batchscope
collect --sources nvml`` reads the real pynvml bindings, which load the fake
libnvidia-ml.so.1 (tests/fakenvml) scripted as two H200s, the second split into two
MIG instances. Each test saves a screenshot under its tmp_path."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collector.store import Store
from dashboard import ids
from dashboard.app import create_app
from tests.nvml_support import GIB
from tests.nvml_support import scenario as scenario_text
from tests.support import start_process

REFRESH_S = 60.0

# GPU 0 busy 12 % with one process at 9 % SM; GPU 1 in MIG mode (no utilisation
# rates there), its two 3g instances at 85 % and 4 % SM activity (GPM).
SCENARIO = {
    "gpu.0.uuid": "GPU-11111111-0000-0000-0000-000000000000",
    "gpu.0.name": "NVIDIA H200",
    "gpu.0.utilization.gpu": 12,
    "gpu.0.utilization.memory": 5,
    "gpu.0.memory.total": 140 * GIB,
    "gpu.0.memory.used": 20 * GIB,
    "gpu.0.power.usage_mw": 180_000,
    "gpu.0.process.0.pid": 4242,
    "gpu.0.process.0.memory": 9 * GIB,
    "gpu.0.putil.0.pid": 4242,
    "gpu.0.putil.0.sm": 9,
    "gpu.0.putil.0.mem": 3,
    "gpu.1.uuid": "GPU-22222222-0000-0000-0000-000000000001",
    "gpu.1.name": "NVIDIA H200",
    "gpu.1.memory.total": 140 * GIB,
    "gpu.1.memory.used": 30 * GIB,
    "gpu.1.power.usage_mw": 400_000,
    "gpu.1.mig.enabled": 1,
    "gpu.1.gpm.supported": 1,
    **{
        f"gpu.1.mig.{j}.{key}": value
        for j, (sm, used) in enumerate(((85, 20), (4, 1)))
        for key, value in (
            ("uuid", f"MIG-{'ab'[j] * 8}-0000-0000-0000-00000000000{j + 1}"),
            ("name", "NVIDIA H200 MIG 3g.70gb"),
            ("gi", j + 1),
            ("ci", 0),
            ("memory.total", 70 * GIB),
            ("memory.used", used * GIB),
            ("gpm.supported", 1),
            ("gpm.metric.2", sm),
        )
    },
}


@pytest.fixture
def nvml_store(
    fake_libs: dict[str, Path], tmp_path: Path, store_at: Callable[[str], Store]
) -> Iterator[Store]:
    """A SQLite store filled by ``batchscope collect --sources nvml`` against the fake
    NVML, which keeps collecting while the test runs (the overview shows only fresh
    readings) and is stopped after it."""
    scenario = tmp_path / "scenario.txt"
    scenario.write_text(scenario_text(SCENARIO))
    url = f"sqlite:///{tmp_path}/nvml.db"
    env = {
        **os.environ,
        "LD_LIBRARY_PATH": str(fake_libs["full"]),
        "FAKE_NVML_SCENARIO": str(scenario),
    }
    log = (tmp_path / "collect.log").open("wb")
    collector = start_process(
        [
            sys.executable,
            "-m",
            "collector.cli",
            "collect",
            "--sources",
            "nvml",
            "--interval",
            "0.5",
            "--duration",
            "600",
            "--db",
            url,
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        deadline = time.monotonic() + 60
        store: Store | None = None
        while True:
            assert collector.poll() is None, (tmp_path / "collect.log").read_text()
            if store is None and (tmp_path / "nvml.db").exists():
                store = store_at(url)
            # Three seconds of readings, as the page's figures expect.
            times = sorted({d.collected_at for d in store.device_samples()}) if store else []
            if times and times[-1] - times[0] >= 3.0:
                break
            assert time.monotonic() < deadline, "no NVML readings within 60 s"
            time.sleep(0.2)
        assert {d.sample.kind for d in store.device_samples()} == {"gpu", "mig"}
        yield store
    finally:
        collector.send_signal(signal.SIGTERM)
        try:
            collector.wait(timeout=20)
        except subprocess.TimeoutExpired:
            collector.kill()
            collector.wait()
        log.close()


def _figure(dash_duo, graph_id: str) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    """The data and layout plotly drew in one dcc.Graph."""
    return dash_duo.driver.execute_script(
        "const el = document.querySelector(`#${arguments[0]} .js-plotly-plot`);"
        "return el && el.data ? {data: el.data, title: el.layout.title.text} : null;",
        graph_id,
    )


def _mean(values: list[float | None]) -> float:
    present = [v for v in values if v is not None]
    return sum(present) / len(present)


def test_gpu_and_mig_tiles_total_the_idle_capacity(dash_duo, nvml_store, screenshot) -> None:
    dash_duo.start_server(create_app(nvml_store, refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.SUMMARY}", "GPUs idle", timeout=20)
    # GPU 0: 88 % idle of a whole GPU. GPU 1 counts through its instances, each half
    # of its memory: 15 % and 96 % idle of 0.5 GPU. 0.88 + 0.075 + 0.48 = 1.4.
    summary = dash_duo.find_element(f"#{ids.Overview.SUMMARY}").text
    assert "1.4\nGPUs idle" in summary and "over 2.0 GPUs read" in summary
    tiles = [t.text for t in dash_duo.find_elements(f"#{ids.Overview.TILES} .tile-device")]
    assert len(tiles) == 4
    assert sorted(t.split("\n")[:2] for t in tiles) == [
        ["MIG 3g.70gb", "4 %"],
        ["MIG 3g.70gb", "85 %"],
        ["NVIDIA H200", "12 %"],
        ["NVIDIA H200", "2 MIG"],
    ]  # MIG mode: its instances count
    empty = dash_duo.find_element(f"#{ids.Overview.EMPTY}").text
    assert "no Triton target" in empty
    screenshot("nvml-overview")


def test_devices_page_draws_gpus_mig_instances_and_processes(
    dash_duo, nvml_store, screenshot
) -> None:
    dash_duo.start_server(create_app(nvml_store, refresh_s=REFRESH_S))
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}/devices?range=5m", timeout=20)
    dash_duo.wait_for_contains_text(f"#{ids.Devices.HEATMAP}", "3g.70gb", timeout=20)

    heat = _figure(dash_duo, ids.Devices.HEATMAP)
    rows = {y: _mean(z) for y, z in zip(heat["data"][0]["y"], heat["data"][0]["z"], strict=True)}
    # One row per GPU or instance with a utilisation reading (GPU 1 has none in MIG
    # mode: its instances stand for it).
    assert len(rows) == 3
    by_suffix = {label.rsplit("(", 1)[-1].rstrip(")"): value for label, value in rows.items()}
    assert by_suffix == {
        "00000000": pytest.approx(12),
        "00000001": pytest.approx(85),
        "00000002": pytest.approx(4),
    }

    procs = _figure(dash_duo, ids.Devices.PROCESSES)
    assert "SM % (NVML)" in procs["title"]
    [label] = procs["data"][0]["y"]
    assert "pid 4242" in label
    assert _mean(procs["data"][0]["z"][0]) == pytest.approx(9)

    memory = _figure(dash_duo, ids.Devices.MEMORY)
    used = {
        trace["name"].rsplit("(", 1)[-1].rstrip(")"): _mean(trace["y"]) for trace in memory["data"]
    }
    assert used["00000000"] == pytest.approx(20 * GIB / 1e9)
    assert used["00000002"] == pytest.approx(1 * GIB / 1e9)
    power = _figure(dash_duo, ids.Devices.POWER)
    assert sorted(
        round(_mean(t["y"])) for t in power["data"] if any(v is not None for v in t["y"])
    ) == [180, 400]
    screenshot("nvml-devices")
