"""The dashboard in headless Chromium, served on localhost from seeded SQLite stores.
Each test saves a screenshot under its tmp_path."""

from __future__ import annotations

import time
from urllib.parse import urlencode

from dash.testing.wait import until
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.by import By

from collector.synthetic import scrape_ok, steady_load
from dashboard import ids
from dashboard.app import create_app
from tests.browser.conftest import assert_no_html_ran, loads, open_model_page, severe_logs

HOSTILE = "<img src=x onerror=alert(1)>"
# Slow refresh: the tests read the page the first tick drew.
REFRESH_S = 60.0


def test_overview_lists_both_models_with_their_batch_sizes(
    dash_duo, seeded_store, screenshot
) -> None:
    dash_duo.start_server(create_app(seeded_store(), refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", "unbatched", timeout=20)
    links = [a.text for a in dash_duo.find_elements(f"#{ids.Overview.MODELS} a.model-link")]
    assert links == ["batched", "unbatched"]
    rows = {
        r.find_element(By.CSS_SELECTOR, "a.model-link").text: r.text
        for r in dash_duo.find_elements(f"#{ids.Overview.MODELS} tbody tr")
    }
    # 420 req/s in batches of 4, 8 and 16 (20 %, 50 %, 30 % of executions): 9.6 on average.
    assert "420.0" in rows["batched"]
    assert "9.6" in rows["batched"] and "preferred 8, 16" in rows["batched"]
    assert "1.0" in rows["unbatched"] and "batching off" in rows["unbatched"]
    assert "batching off" in dash_duo.find_element(f"#{ids.Overview.MODELS} .badge").text
    assert "targets up" in dash_duo.find_element(f"#{ids.Overview.SUMMARY}").text
    assert dash_duo.find_elements(".banner") == []
    screenshot("overview")

    # Filtering keeps the rows whose model or target matches.
    dash_duo.find_element(f"#{ids.Overview.FILTER}").send_keys("unb")
    dash_duo.wait_for_text_to_equal(f"#{ids.Overview.MODELS} a.model-link", "unbatched", timeout=20)
    assert len(dash_duo.find_elements(f"#{ids.Overview.MODELS} a.model-link")) == 1
    assert severe_logs(dash_duo) == []


def test_a_model_named_like_html_is_shown_as_text(dash_duo, seeded_store, screenshot) -> None:
    dash_duo.start_server(create_app(seeded_store(HOSTILE), refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", HOSTILE, timeout=20)
    links = [a.text for a in dash_duo.find_elements(f"#{ids.Overview.MODELS} a.model-link")]
    assert HOSTILE in links
    assert_no_html_ran(dash_duo.driver)
    screenshot("overview-hostile-name")

    # Its model page: the name is the heading's text, and still no image element.
    open_model_page(dash_duo, HOSTILE, timeout=20)
    dash_duo.wait_for_contains_text(f"#{ids.Model.CONFIG}", "max_batch_size", timeout=20)
    assert_no_html_ran(dash_duo.driver)
    screenshot("model-hostile-name")


def test_the_model_page_draws_its_graphs(dash_duo, seeded_store, screenshot) -> None:
    dash_duo.start_server(create_app(seeded_store(), refresh_s=REFRESH_S))
    query = urlencode({"target": "testbed", "model": "unbatched", "range": "15m"})
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}/model?{query}", timeout=20)
    dash_duo.wait_for_text_to_equal(f"#{ids.Model.HEADER} h2", "unbatched", timeout=20)
    for graph in (
        ids.Model.QPS,
        ids.Model.BATCH,
        ids.Model.LATENCY,
        ids.Model.PENDING,
        ids.Model.FAILURES,
        ids.Model.SERVICE_TIME,
    ):
        dash_duo.wait_for_element(f"#{graph} .scatterlayer .trace", timeout=20)
    dash_duo.wait_for_element(f"#{ids.Model.DISTRIBUTION} .barlayer .trace", timeout=20)
    # The stacked queue/compute figure has both traces.
    assert len(dash_duo.find_elements(f"#{ids.Model.LATENCY} .scatterlayer .trace")) == 2
    dash_duo.wait_for_contains_text(
        f"#{ids.Model.RECOMMENDATION}", "dynamic_batching {", timeout=20
    )
    assert "probe" in dash_duo.find_element(f"#{ids.Model.RECOMMENDATION}").text
    assert "batching off" in dash_duo.find_element(f"#{ids.Model.FINDINGS}").text
    assert "max_batch_size" in dash_duo.find_element(f"#{ids.Model.CONFIG}").text
    current = dash_duo.find_element(".range-current")
    assert current.text == "15m"
    screenshot("model-page")

    # The light theme restyles the page and redraws the figures with its template.
    dash_duo.find_element(f"#{ids.Shell.THEME} input[value='light']").click()
    dash_duo.wait_for_class_to_equal(f"#{ids.Shell.ROOT}", "shell theme-light", timeout=20)
    dash_duo.wait_for_style_to_equal(
        f"#{ids.Model.QPS} .gtitle", "fill", "rgb(27, 36, 48)", timeout=20
    )
    screenshot("model-page-light")
    assert severe_logs(dash_duo) == []


def test_an_unreachable_store_shows_a_banner_not_a_stack_trace(
    dash_duo, tmp_path, store_at, screenshot
) -> None:
    store = store_at(f"sqlite:///{tmp_path}/no-such-dir/x.db")  # opened on the first read
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.BANNER}", "store cannot be opened", timeout=20)
    body = dash_duo.find_element("body").text
    assert "Traceback" not in body and "sqlalchemy" not in body.lower()
    screenshot("store-unreachable")


def test_an_empty_store_says_how_to_add_a_target(dash_duo, tmp_path, store_at, screenshot) -> None:
    dash_duo.start_server(
        create_app(store_at(f"sqlite:///{tmp_path}/empty.db"), refresh_s=REFRESH_S)
    )
    dash_duo.wait_for_contains_text(f"#{ids.Overview.EMPTY}", "no targets yet", timeout=20)
    assert "batchscope collect --triton URL" in dash_duo.find_element(f"#{ids.Overview.EMPTY}").text
    screenshot("empty-store")


def test_findings_page_filters_and_links_to_the_model(dash_duo, seeded_store, screenshot) -> None:
    dash_duo.start_server(create_app(seeded_store(), refresh_s=REFRESH_S))
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}/findings", timeout=20)
    dash_duo.wait_for_contains_text(f"#{ids.Findings.LIST}", "run one at a time", timeout=20)
    item = dash_duo.find_element(f"#{ids.Findings.LIST} .event")
    assert "batching off" in item.text and "warning" in item.text
    screenshot("findings")
    # Past findings: there are none, and it says so.
    dash_duo.find_element(f"#{ids.Findings.STATE} input[value='past']").click()
    dash_duo.wait_for_contains_text(f"#{ids.Findings.LIST}", "nothing matches", timeout=20)
    dash_duo.find_element(f"#{ids.Findings.STATE} input[value='active']").click()
    dash_duo.wait_for_contains_text(f"#{ids.Findings.LIST}", "run one at a time", timeout=20)
    dash_duo.find_element(f"#{ids.Findings.LIST} a.model-link").click()
    dash_duo.wait_for_text_to_equal(f"#{ids.Model.HEADER} h2", "unbatched", timeout=20)
    # The page's graphs drawn: their callback done, not cut short by the server's stop.
    dash_duo.wait_for_element(f"#{ids.Model.DISTRIBUTION} .barlayer .trace", timeout=20)
    assert severe_logs(dash_duo) == []


def test_devices_page_draws_or_says_why_not(dash_duo, seeded_store, screenshot) -> None:
    dash_duo.start_server(create_app(seeded_store(), refresh_s=REFRESH_S))
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}/devices?range=5m", timeout=20)
    # The seeded store has no GPU or process readings: each graph says so.
    dash_duo.wait_for_contains_text(
        f"#{ids.Devices.HEATMAP}", "no readings in this range", timeout=20
    )
    assert "GPU / MIG utilisation" in dash_duo.find_element(f"#{ids.Devices.HEATMAP}").text
    assert dash_duo.find_element(".range-current").text == "5m"
    screenshot("devices-empty")
    assert severe_logs(dash_duo) == []


def _model_links(dash_duo) -> list[str]:  # type: ignore[no-untyped-def]
    # A live refresh may redraw the table between finding a link and reading it.
    for _ in range(5):
        try:
            return [a.text for a in dash_duo.find_elements(f"#{ids.Overview.MODELS} a.model-link")]
        except StaleElementReferenceException:
            continue
    raise AssertionError("the models table kept redrawing")


def test_live_refresh_pauses_while_the_tab_is_hidden(dash_duo, seeded_store, screenshot) -> None:
    store = seeded_store()
    dash_duo.start_server(create_app(store, refresh_s=0.5))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", "unbatched", timeout=20)
    assert _model_links(dash_duo) == ["batched", "unbatched"]

    # The browser reports the tab hidden (as when a wall screen's tab is switched away).
    dash_duo.driver.execute_script(
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => true});"
        "document.dispatchEvent(new Event('visibilitychange'));"
    )
    now = time.time()
    steady_load(store, loads("late")[2:], target="testbed", start=now - 20, seconds=20, step=2.0)
    # Six refresh periods pass: a running refresh would have drawn the new model.
    deadline = time.monotonic() + 3.0
    while time.monotonic() < deadline:
        assert _model_links(dash_duo) == ["batched", "unbatched"]
        time.sleep(0.25)

    # Visible again: the next tick draws it.
    dash_duo.driver.execute_script(
        "Object.defineProperty(document, 'hidden', {configurable: true, get: () => false});"
        "document.dispatchEvent(new Event('visibilitychange'));"
    )
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", "late", timeout=10)
    assert _model_links(dash_duo) == ["batched", "late", "unbatched"]
    screenshot("refresh-resumed")


def test_a_down_target_shows_a_banner_with_its_error(dash_duo, seeded_store, screenshot) -> None:
    store = seeded_store()
    now = time.time()
    for i in range(3):
        scrape_ok(store, "testbed", now + i, ok=False, error="connection refused (127.0.0.1:8000)")
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.BANNER}", "target testbed is down", timeout=20)
    banner = dash_duo.find_element(f"#{ids.Overview.BANNER}").text
    assert "connection refused (127.0.0.1:8000)" in banner
    assert "3 failed scrape(s) in a row" in banner
    screenshot("target-down")


def test_a_4k_wall_screen_scales_the_page_up(dash_duo, seeded_store, screenshot) -> None:
    dash_duo.start_server(create_app(seeded_store(), refresh_s=REFRESH_S))
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", "unbatched", timeout=20)
    laptop = float(
        dash_duo.driver.execute_script(
            "return parseFloat(getComputedStyle(document.documentElement).fontSize);"
        )
    )
    dash_duo.driver.set_window_size(3840, 2160)
    until(lambda: dash_duo.driver.execute_script("return window.innerWidth;") >= 3800, timeout=10)
    wall = float(
        dash_duo.driver.execute_script(
            "return parseFloat(getComputedStyle(document.documentElement).fontSize);"
        )
    )
    table = dash_duo.find_element(f"#{ids.Overview.MODELS}")
    assert wall >= 1.5 * laptop  # readable from across the room
    assert table.size["width"] > 3000  # the table uses the width
    screenshot("overview-4k")


def test_filters_are_readable_and_their_menus_open(dash_duo, seeded_store, screenshot) -> None:
    """Dash's dropdowns follow the dark theme: the placeholder in the muted text
    colour on the page's surface, not Dash's stock navy on white."""
    dash_duo.start_server(create_app(seeded_store(), refresh_s=REFRESH_S))
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}/findings", timeout=20)
    dash_duo.wait_for_contains_text(f"#{ids.Findings.LIST}", "batching off", timeout=20)
    placeholder = dash_duo.find_element(f"#{ids.Findings.KIND} .dash-dropdown-placeholder")
    assert placeholder.value_of_css_property("color") == "rgba(139, 149, 163, 1)"  # --muted
    dash_duo.find_element(f"#{ids.Findings.KIND}").click()
    dash_duo.wait_for_element(".dash-dropdown-option", timeout=10)
    screenshot("findings-kind-menu")
