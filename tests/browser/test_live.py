"""The dashboard in headless Chromium over a store filled by a real collection of the
CPU testbed: a Triton (explicit model control) with a batched and an unbatched model,
driven by the load generator while the collector, the detectors and the recommender
run. Login is on (an admin and a viewer password); an admin's Apply changes the live
Triton config, a viewer cannot. Each test saves screenshots under its tmp_path."""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support import expected_conditions
from selenium.webdriver.support.ui import WebDriverWait

from collector.analysis.detect import detector_settings, run_detectors
from collector.analysis.recommend import recommender_job
from collector.config import ApplySettings, Settings, TargetSettings, UiSettings, target_from_url
from collector.scheduler import CollectorService, build_sources
from collector.store import Store
from collector.testbed.load import run_load
from collector.testbed.models import BATCHED_AND_UNBATCHED, ModelSpec
from collector.testbed.server import TritonServer
from dashboard import ids
from dashboard.actions import ConfigActions
from dashboard.app import create_app
from tests.browser.conftest import assert_no_html_ran, open_model_page, severe_logs

ADMIN_PASSWORD = "admin-secret-1"
VIEWER_PASSWORD = "viewer-secret-2"
MODELS = BATCHED_AND_UNBATCHED
# A model whose name is HTML, served for real: an ensemble over "unbatched" (Triton's
# Python backend could not start a model of that name: it passes names to a shell).
HOSTILE = "<img src=x onerror=alert(1)>"
HOSTILE_SPEC = ModelSpec(HOSTILE, max_batch_size=32, ensemble_of="unbatched")
REFRESH_S = 60.0


@dataclass
class Live:
    server: TritonServer
    target: TargetSettings
    store: Store


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    """A real collection: 12 s of load on both models, scraped every 0.5 s, then the
    detectors and the recommender over the store. The collector keeps running until
    the module's last test (the UI shows only fresh readings as live)."""
    root = tmp_path_factory.mktemp("live")
    server = TritonServer(
        (*MODELS, HOSTILE_SPEC),
        workdir=root / "triton",
        extra_args=["--metrics-config", "summary_latencies=true"],
    )
    server.start()
    try:
        target = target_from_url(server.http_url, server.metrics_url)
        url = f"sqlite:///{root}/live.db"
        settings = Settings(
            targets=(target,), db_url=url, interval_s=0.5, jitter_s=0.0, sources=("triton", "host")
        )
        store = Store(url)
        service = CollectorService(settings, store, build_sources(settings))
        service.start()
        try:
            runs = [
                threading.Thread(
                    target=run_load,
                    args=(server.grpc_url, name),
                    kwargs={"concurrency": concurrency, "duration_s": 12.0},
                )
                for name, concurrency in (("batched", 16), ("unbatched", 16), (HOSTILE, 2))
            ]
            for t in runs:
                t.start()
            for t in runs:
                t.join()
            ended = time.time()
            quick = detector_settings({"window_s": 10.0, "sustain": 1, "clear_after": 1})
            run_detectors(store, quick, now=ended)
            recommender_job(window_s=10.0)(store, ended)
            yield Live(server=server, target=target, store=store)
        finally:
            service.shutdown()
        store.close()
    finally:
        server.close()


@pytest.fixture
def app(live: Live) -> Iterator[object]:
    """The UI over the collection, with Apply as ``batchscope serve`` builds it (one-second
    before/after windows)."""
    actions = ConfigActions(
        live.store, [live.target], apply=ApplySettings(before_s=1.0, after_s=1.0)
    )
    ui = UiSettings(admin_password=ADMIN_PASSWORD, viewer_password=VIEWER_PASSWORD)
    yield create_app(live.store, actions=actions, refresh_s=REFRESH_S, ui=ui)
    actions.close()


def _sign_in(dash_duo, password: str, path: str = "/") -> None:  # type: ignore[no-untyped-def]
    driver = dash_duo.driver
    driver.get(dash_duo.server.url + path)
    WebDriverWait(driver, 20).until(
        expected_conditions.presence_of_element_located((By.ID, "login-password"))
    )
    driver.find_element(By.ID, "login-password").send_keys(password)
    driver.find_element(By.ID, "login-submit").click()
    dash_duo.wait_for_element("#react-entry-point", timeout=20)


def _live_config(live: Live, model: str) -> dict:
    with urllib.request.urlopen(
        f"{live.server.http_url}/v2/models/{model}/config", timeout=10
    ) as response:
        return json.loads(response.read())


def test_login_is_enforced(dash_duo, live: Live, app, screenshot) -> None:  # type: ignore[no-untyped-def]
    dash_duo.start_server(app, navigate=False)
    driver = dash_duo.driver
    driver.get(dash_duo.server.url + "/recommendations")
    WebDriverWait(driver, 20).until(expected_conditions.url_contains("/login"))
    assert "next=%2Frecommendations" in driver.current_url
    assert driver.find_elements(By.ID, "react-entry-point") == []
    # A callback without a session is refused, not answered.
    request = urllib.request.Request(dash_duo.server.url + "/_dash-layout")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    assert refused.value.code == 401
    driver.find_element(By.ID, "login-password").send_keys("wrong")
    driver.find_element(By.ID, "login-submit").click()
    WebDriverWait(driver, 20).until(
        expected_conditions.presence_of_element_located((By.ID, "login-error"))
    )
    assert ADMIN_PASSWORD not in driver.page_source
    screenshot("login-refused")

    _sign_in(dash_duo, VIEWER_PASSWORD, "/recommendations")
    assert driver.current_url.endswith("/recommendations")
    dash_duo.wait_for_text_to_equal(f"#{ids.Shell.ROLE}", "viewer", timeout=20)
    screenshot("signed-in-viewer")


def test_overview_lists_both_models_from_the_real_collection(
    dash_duo,
    live: Live,  # type: ignore[no-untyped-def]
    app,
    screenshot,
) -> None:
    # Traffic in the overview's window: its rows show live figures only.
    runs = [
        threading.Thread(
            target=run_load,
            args=(live.server.grpc_url, name),
            kwargs={"concurrency": 16, "duration_s": 3.0},
        )
        for name in ("batched", "unbatched")
    ]
    for t in runs:
        t.start()
    for t in runs:
        t.join()
    dash_duo.start_server(app, navigate=False)
    _sign_in(dash_duo, VIEWER_PASSWORD)
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", "unbatched", timeout=30)
    rows = {
        r.find_element(By.CSS_SELECTOR, "a.model-link").text: r.text
        for r in dash_duo.find_elements(f"#{ids.Overview.MODELS} tbody tr")
    }
    assert set(rows) == {"batched", "unbatched", HOSTILE}
    assert "batching off" in rows["unbatched"]
    assert "preferred 8, 16" in rows["batched"]
    # The average batch size each model ran at: 1 without batching, several with it.
    sizes = {
        r.find_element(By.CSS_SELECTOR, "a.model-link").text: float(
            r.find_element(By.CSS_SELECTOR, "td .num").text
        )
        for r in dash_duo.find_elements(f"#{ids.Overview.MODELS} tbody tr")
        if r.find_elements(By.CSS_SELECTOR, "td .num")
    }
    assert sizes["unbatched"] == 1.0
    assert sizes["batched"] > 2.0
    # Triton runs with summary_latencies=true here: the p95 column has a figure.
    headers = [h.text for h in dash_duo.find_elements(f"#{ids.Overview.MODELS} thead th")]
    p95_column = headers.index("p95 ms")
    for r in dash_duo.find_elements(f"#{ids.Overview.MODELS} tbody tr"):
        if r.find_element(By.CSS_SELECTOR, "a.model-link").text in ("batched", "unbatched"):
            assert float(r.find_elements(By.TAG_NAME, "td")[p95_column].text) > 0
    screenshot("live-overview")

    # The unbatched model's page draws its graphs from the collection.
    dash_duo.find_element(f"#{ids.Overview.MODELS} a.model-link[href*='unbatched']").click()
    dash_duo.wait_for_text_to_equal(f"#{ids.Model.HEADER} h2", "unbatched", timeout=30)
    for graph in (ids.Model.QPS, ids.Model.BATCH, ids.Model.LATENCY):
        dash_duo.wait_for_element(f"#{graph} .scatterlayer .trace", timeout=30)
    dash_duo.wait_for_element(f"#{ids.Model.DISTRIBUTION} .barlayer .trace", timeout=30)
    dash_duo.wait_for_contains_text(f"#{ids.Model.FINDINGS}", "batching off", timeout=30)
    screenshot("live-model-page")
    assert severe_logs(dash_duo) == []


def test_what_if_slider_changes_the_predicted_curve(
    dash_duo,
    live: Live,  # type: ignore[no-untyped-def]
    app,
    screenshot,
) -> None:
    dash_duo.start_server(app, navigate=False)
    _sign_in(dash_duo, VIEWER_PASSWORD, f"/recommendations?target={live.target.name}&model=batched")
    graph = f"#{ids.Recs.WHAT_IF_GRAPH}"
    dash_duo.wait_for_element(f"{graph} .barlayer .trace", timeout=60)
    dash_duo.wait_for_contains_text(f"#{ids.Recs.WHAT_IF_SUMMARY}", "QPS", timeout=60)

    def bars() -> list[str]:
        return [
            p.get_attribute("d") for p in dash_duo.find_elements(f"{graph} .barlayer .point path")
        ]

    before = bars()
    summary_before = dash_duo.find_element(f"#{ids.Recs.WHAT_IF_SUMMARY}").text
    screenshot("what-if-before")
    # One instance instead of the proposed two: the whole curve is predicted again.
    assert "2 instance(s)" in dash_duo.find_element(f"{graph} .gtitle").text
    box = dash_duo.find_element(f"#{ids.Recs.INSTANCES} input")
    box.send_keys(Keys.CONTROL, "a")
    box.send_keys("1", Keys.TAB)
    WebDriverWait(dash_duo.driver, 60).until(lambda _d: bars() != before)
    WebDriverWait(dash_duo.driver, 60).until(
        lambda _d: dash_duo.find_element(f"#{ids.Recs.WHAT_IF_SUMMARY}").text != summary_before
    )
    assert "1 instance(s)" in dash_duo.find_element(f"{graph} .gtitle").text
    screenshot("what-if-after")
    assert severe_logs(dash_duo) == []


def test_admin_apply_changes_the_live_config_and_a_viewer_cannot(
    dash_duo,
    live: Live,  # type: ignore[no-untyped-def]
    app,
    screenshot,
) -> None:
    assert "dynamic_batching" not in _live_config(live, "unbatched")
    dash_duo.start_server(app, navigate=False)
    page = f"/recommendations?target={live.target.name}&model=unbatched"

    # A viewer sees the recommendation but no Apply button.
    _sign_in(dash_duo, VIEWER_PASSWORD, page)
    dash_duo.wait_for_contains_text(f"#{ids.Recs.APPLY_PANEL}", "Only an admin", timeout=30)
    assert not dash_duo.find_element(f"#{ids.Recs.APPLY}").is_displayed()
    dash_duo.wait_for_contains_text(f"#{ids.Recs.DETAIL}", "dynamic_batching", timeout=30)
    screenshot("viewer-no-apply")
    dash_duo.driver.get(dash_duo.server.url + "/logout")

    # An admin applies it, confirms, and sees the verification result.
    _sign_in(dash_duo, ADMIN_PASSWORD, page)
    WebDriverWait(dash_duo.driver, 30).until(
        lambda _d: dash_duo.find_element(f"#{ids.Recs.APPLY}").is_displayed()
    )
    screenshot("admin-apply")
    dash_duo.find_element(f"#{ids.Recs.APPLY}").click()
    WebDriverWait(dash_duo.driver, 20).until(expected_conditions.alert_is_present())
    dash_duo.driver.switch_to.alert.accept()
    dash_duo.wait_for_contains_text(f"#{ids.Recs.JOB_STATUS}", "Applied and kept", timeout=60)
    assert "kept" in dash_duo.find_element(f"#{ids.Recs.JOB_STATUS}").text
    screenshot("admin-applied")
    config = _live_config(live, "unbatched")
    assert "dynamic_batching" in config


def test_a_model_named_like_html_is_shown_as_text(
    dash_duo,
    live: Live,  # type: ignore[no-untyped-def]
    app,
    screenshot,
) -> None:
    """Triton reports the name in its metrics and statistics; every place the UI shows
    it, it is text: no image element, no script run."""
    dash_duo.start_server(app, navigate=False)
    _sign_in(dash_duo, VIEWER_PASSWORD)
    dash_duo.wait_for_contains_text(f"#{ids.Overview.MODELS}", HOSTILE, timeout=30)
    driver = dash_duo.driver
    assert_no_html_ran(driver)
    screenshot("live-overview-hostile-name")

    open_model_page(dash_duo, HOSTILE, timeout=30)
    assert_no_html_ran(driver)
    screenshot("live-model-hostile-name")

    driver.get(dash_duo.server.url + "/findings?state=all")
    dash_duo.wait_for_contains_text(f"#{ids.Findings.LIST}", "unbatched", timeout=30)
    driver.get(dash_duo.server.url + "/devices?range=5m")
    dash_duo.wait_for_element(f"#{ids.Devices.PROCESSES} .js-plotly-plot", timeout=30)
    assert_no_html_ran(driver)
    assert severe_logs(dash_duo) == []
