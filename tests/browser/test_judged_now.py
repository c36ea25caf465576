"""The UI judged from now: a target not scraped lately is greyed and shows no live
figures; a host without NVIDIA GPU (a real collection whose NVML finds no library) is
up, with one quiet note instead of a red banner, and the Devices page says why its
GPU panels are empty. Each test saves a screenshot under its tmp_path."""

from __future__ import annotations

import ctypes
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium.webdriver.common.by import By

from collector.config import Settings
from collector.scheduler import CollectorService
from collector.sources.nvml import NvmlSource
from collector.store import Store
from collector.synthetic import scrape_ok, steady_load
from dashboard import ids
from dashboard.app import create_app
from tests.browser.conftest import loads

REFRESH_S = 60.0


def test_a_target_not_scraped_lately_is_greyed_with_no_live_qps(
    dash_duo, tmp_path: Path, store_at, screenshot
) -> None:
    store = store_at(f"sqlite:///{tmp_path}/stale.db")
    now = time.time()
    # Five minutes of 420 and 180 req/s that ended 157 s ago; nothing scraped since.
    steady_load(store, loads(), target="testbed", start=now - 457, seconds=300, step=2.0)
    scrape_ok(store, "testbed", now - 157)
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", "unbatched", timeout=20)
    rows = dash_duo.find_elements(f"#{ids.Overview.MODELS} tbody tr")
    assert len(rows) == 2
    for row in rows:
        assert "row-not-live" in row.get_attribute("class")
        assert "stale" in row.text.lower()
        assert "420.0" not in row.text and "180.0" not in row.text
        qps = row.find_elements(By.CSS_SELECTOR, "td.num")[0].text
        assert qps == "—"
        opacity = float(row.find_element(By.TAG_NAME, "td").value_of_css_property("opacity"))
        assert opacity < 1.0  # greyed
    tile = dash_duo.find_element(f"#{ids.Overview.TILES} .tile-target")
    assert "tile-stale" in tile.get_attribute("class") and "stale" in tile.text
    assert "0/1" in dash_duo.find_element(f"#{ids.Overview.SUMMARY}").text
    assert "not live" in dash_duo.find_element(f"#{ids.Overview.BANNER}").text
    screenshot("stale-target")


def _system_has_nvml() -> bool:
    try:
        ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return False
    return True


@pytest.fixture
def cpu_host_store(tmp_path: Path, store_at) -> Iterator[Store]:  # type: ignore[no-untyped-def]
    """A real collection of this CPU host's NVML source (no libnvidia-ml.so.1 here),
    running while the test runs."""
    if _system_has_nvml():
        pytest.skip("this host has a real libnvidia-ml.so.1 on its loader path")
    url = f"sqlite:///{tmp_path}/cpu.db"
    store = store_at(url)
    settings = Settings(db_url=url, interval_s=0.5, jitter_s=0.0, sources=("nvml",))
    service = CollectorService(settings, store, [NvmlSource("cpu-vm")])
    service.start()
    try:
        deadline = time.monotonic() + 20
        while not store.targets():  # its first scrape, whatever it found
            assert time.monotonic() < deadline, "the NVML source never scraped"
            time.sleep(0.1)
        yield store
    finally:
        service.shutdown()


def test_a_host_without_nvml_shows_a_quiet_note_not_a_red_banner(
    dash_duo, cpu_host_store: Store, screenshot
) -> None:
    dash_duo.start_server(create_app(cpu_host_store, refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(
        f"#{ids.Overview.EMPTY}", "no NVIDIA GPU on this host", timeout=20
    )
    assert dash_duo.find_elements(".banner") == []
    notes = dash_duo.find_elements(f"#{ids.Overview.EMPTY} .note")
    assert len(notes) == 1 and "cpu-vm" in notes[0].text  # said once, quietly
    assert "1/1" in dash_duo.find_element(f"#{ids.Overview.SUMMARY}").text
    tile = dash_duo.find_element(f"#{ids.Overview.TILES} .tile-target")
    assert "tile-up" in tile.get_attribute("class") and "no NVIDIA GPU" in tile.text
    screenshot("cpu-host-overview")

    dash_duo.driver.get(dash_duo.server.url + "/devices")
    dash_duo.wait_for_contains_text(f"#{ids.Devices.BANNER}", "No NVIDIA GPU", timeout=20)
    note = dash_duo.find_element(f"#{ids.Devices.BANNER}").text
    assert "cpu-vm" in note and "libnvidia-ml.so.1 was not found" in note
    assert "panels stay empty" in note
    assert dash_duo.find_elements(".banner") == []
    screenshot("cpu-host-devices")
