"""What a new user sees first, in headless Chromium at 1280×800: the recommendations
page opens on the model that needs it most, a model page shows its advice above the
fold, the what-if says its delay in µs, one current figure per page, evidence with
units, and no chart draws its title, legend, axis titles or labels over each other.
Each test saves a screenshot under its tmp_path."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace
from itertools import combinations
from urllib.parse import urlencode

from selenium.webdriver.support.ui import WebDriverWait

from collector import records
from collector.analysis.configs import config_changes, render_pbtxt
from collector.store import Store
from collector.synthetic import Load, model_config, scrape_ok, steady_load
from dashboard import ids
from dashboard.app import create_app
from tests.browser.conftest import BATCHED, severe_logs

REFRESH_S = 60.0  # the tests read the page the first tick drew
WIDTH, HEIGHT = 1280, 800
TUNED_DELAY_US = 2000


def viewport(dash_duo, path: str) -> None:  # type: ignore[no-untyped-def]
    """Open ``path`` in a 1280×800 viewport (the size of the screenshots too)."""
    dash_duo.driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False},
    )
    dash_duo.wait_for_page(url=f"{dash_duo.server_url}{path}", timeout=20)


def store_tuned(store: Store, config: records.ModelConfig, *, qps: float, at: float) -> None:
    """A "tune" recommendation for ``config``: preferred 16, a 2000 µs delay."""
    current = records.BatcherConfig.from_model_config(config)
    proposed = replace(
        current,
        dynamic_batching=True,
        preferred_batch_sizes=(16,),
        max_queue_delay_us=TUNED_DELAY_US,
    )
    store.add_recommendation(
        records.Recommendation(
            target="testbed",
            model=config.model,
            created_at=at,
            kind="tune",
            changes=config_changes(current, proposed),
            current_config=current,
            proposed_config=proposed,
            current=records.Prediction(qps=qps, p95_ms=30.0),
            predicted=records.Prediction(qps=qps * 1.18, p95_ms=31.0),
            confidence=0.7,
            reason="batches of 16 formed within 2 ms serve more at the same p95",
            config_pbtxt=render_pbtxt(proposed),
        )
    )


def rect(driver, element) -> dict[str, float]:  # type: ignore[no-untyped-def]
    return driver.execute_script(  # type: ignore[no-any-return]
        "const r = arguments[0].getBoundingClientRect();"
        "return {left: r.left, top: r.top, right: r.right, bottom: r.bottom};",
        element,
    )


# The parts of a Plotly figure that must never overlap one another.
_FIGURE_PARTS = ".gtitle, .legend, .xtitle, .ytitle, .y2title, .annotation"


def overlaps(dash_duo, graph_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Pairs of a graph's title, legend, axis titles and annotations whose boxes
    intersect (as "a / b"), read from the rendered SVG."""
    parts = []
    for element in dash_duo.find_elements(f"#{graph_id} svg :is({_FIGURE_PARTS})"):
        box = rect(dash_duo.driver, element)
        if box["right"] - box["left"] > 0 and box["bottom"] - box["top"] > 0:
            name = (element.get_attribute("class") or "").split()[0]
            label = element.get_attribute("textContent") or ""
            parts.append((f"{name} {label!r}", box))
    found = []
    for (a, p), (b, q) in combinations(parts, 2):
        if (
            p["left"] < q["right"]
            and q["left"] < p["right"]
            and p["top"] < q["bottom"]
            and q["top"] < p["bottom"]
        ):
            found.append(f"{a} / {b}")
    return found


def test_recommendations_open_on_the_model_with_the_most_severe_finding(
    dash_duo, seeded_store, screenshot
) -> None:
    store = seeded_store()  # "unbatched" has a warning; "batched" none
    store_tuned(store, BATCHED, qps=420.0, at=time.time() - 10)
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    viewport(dash_duo, "/recommendations")
    dash_duo.wait_for_element(f"#{ids.Recs.DETAIL} h2", timeout=20)
    items = [e.text for e in dash_duo.find_elements(f"#{ids.Recs.LIST} .rec-model")]
    assert items == ["unbatched", "batched"]
    assert dash_duo.find_element(f"#{ids.Recs.DETAIL} h2").text.startswith("unbatched")
    assert dash_duo.find_element(".rec-selected .rec-model").text == "unbatched"
    screenshot("recommendations-most-severe-first")
    assert severe_logs(dash_duo) == []


def test_a_model_page_shows_its_recommendation_and_findings_above_the_fold(
    dash_duo, seeded_store, screenshot
) -> None:
    dash_duo.start_server(create_app(seeded_store(), refresh_s=REFRESH_S))
    query = urlencode({"target": "testbed", "model": "unbatched", "range": "15m"})
    viewport(dash_duo, f"/model?{query}")
    dash_duo.wait_for_contains_text(
        f"#{ids.Model.RECOMMENDATION}", "dynamic_batching {", timeout=20
    )
    dash_duo.wait_for_contains_text(f"#{ids.Model.FINDINGS}", "batching off", timeout=20)
    assert dash_duo.driver.execute_script("return window.innerHeight") == HEIGHT
    for panel in (ids.Model.RECOMMENDATION, ids.Model.FINDINGS):
        box = rect(dash_duo.driver, dash_duo.find_element(f"#{panel}"))
        assert box["top"] < HEIGHT, f"{panel} starts at {box['top']} px, below the fold"
    # The finding's summary line and the recommendation's reason are on screen too.
    for text_of in (f"#{ids.Model.FINDINGS} .finding p", f"#{ids.Model.RECOMMENDATION} .reason"):
        assert rect(dash_duo.driver, dash_duo.find_element(text_of))["bottom"] < HEIGHT
    screenshot("model-page-1280x800")
    assert severe_logs(dash_duo) == []


def test_the_what_if_delay_box_shows_microseconds(dash_duo, seeded_store, screenshot) -> None:
    store = seeded_store()
    store_tuned(store, BATCHED, qps=420.0, at=time.time() - 10)
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    viewport(dash_duo, "/recommendations?" + urlencode({"target": "testbed", "model": "batched"}))
    dash_duo.wait_for_contains_text(f"#{ids.Recs.WHAT_IF_SUMMARY}", "QPS", timeout=30)
    # The control the label names, and what it shows: the proposed 2000 µs (the
    # slider's sixth position), never the position's index.
    label = dash_duo.find_element(f"label[for='{ids.Recs.DELAY}']")
    box = label.find_element("xpath", "following-sibling::*[1]")
    WebDriverWait(dash_duo.driver, 20).until(lambda _d: f"{TUNED_DELAY_US} µs" in box.text)
    shown = [i.get_attribute("value") for i in box.find_elements("css selector", "input")]
    assert all(v.endswith("µs") for v in shown), f"the delay box shows {shown}"
    assert f"at {TUNED_DELAY_US} µs" in dash_duo.find_element(f"#{ids.Recs.WHAT_IF_SUMMARY}").text
    screenshot("what-if-delay-in-us")
    assert severe_logs(dash_duo) == []


def _gains(text: str) -> set[str]:
    return set(re.findall(r"(\d+(?:\.\d+)?)\s*×", text))


def test_the_recommendations_page_shows_one_current_figure_and_one_gain(
    dash_duo, seeded_store, screenshot
) -> None:
    store = seeded_store()
    store_tuned(store, BATCHED, qps=400.0, at=time.time() - 10)
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    viewport(dash_duo, "/recommendations?" + urlencode({"target": "testbed", "model": "batched"}))
    dash_duo.wait_for_contains_text(f"#{ids.Recs.WHAT_IF_SUMMARY}", "QPS", timeout=30)
    dash_duo.wait_for_element(f"#{ids.Recs.WHAT_IF_GRAPH} .barlayer .trace", timeout=30)
    shown = (
        dash_duo.find_element(".rec-selected").text + "\n" + dash_duo.find_element(".rec-main").text
    )
    assert _gains(shown) == {"1.18"}, shown
    current = next(
        row.text
        for row in dash_duo.find_elements(f"#{ids.Recs.DETAIL} table.numbers tr")
        if row.text.startswith("current")
    )
    assert current.split()[1] == "400"
    # The what-if's "QPS now" line is the same figure.
    now = dash_duo.driver.execute_script(
        "const gd = document.querySelector(arguments[0] + ' .js-plotly-plot');"
        "const t = gd.data.find(d => d.name === 'QPS now');"
        "return t ? t.y : null;",
        f"#{ids.Recs.WHAT_IF_GRAPH}",
    )
    assert now == [400, 400]
    screenshot("recommendations-one-current-figure")
    assert severe_logs(dash_duo) == []


def test_evidence_reads_as_figures_with_units(dash_duo, seeded_store, screenshot) -> None:
    store = seeded_store()
    now = time.time()
    store.add_finding(
        kind="queue_saturation",
        severity="critical",
        target="testbed",
        subject="batched",
        summary="requests spend most of their time queued",
        window_start=now - 60,
        window_end=now,
        evidence={"queue_us_per_request": 12345.0, "queue_share": 0.9, "requests_per_s": 420.0},
        created_at=now - 5,
    )
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    viewport(dash_duo, "/findings")
    dash_duo.wait_for_contains_text(f"#{ids.Findings.LIST}", "queue saturation", timeout=20)
    event = next(
        e
        for e in dash_duo.find_elements(f"#{ids.Findings.LIST} .event")
        if "queue saturation" in e.text
    )
    event.find_element("css selector", "summary").click()
    facts = event.find_elements("css selector", ".evidence dt, .evidence dd")
    pairs = dict(zip([f.text for f in facts][::2], [f.text for f in facts][1::2], strict=True))
    assert pairs["queue time per request"] == "12.3 ms"
    assert pairs["time spent queued"] == "90%"
    assert pairs["requests"] == "420 req/s"
    assert "_" not in "".join(pairs)
    screenshot("findings-evidence")
    assert severe_logs(dash_duo) == []


def _autofilled(store_at: Callable[[str], Store], url: str) -> Store:
    """A model whose batching Triton completed to ``preferred_batch_size: [32]`` with
    ``max_batch_size: 32``: the preferred size and the maximum coincide."""
    store = store_at(url)
    now = time.time()
    load = Load(
        config=model_config("autofilled", batching=True, preferred=(32,), max_batch_size=32),
        qps=420.0,
        request_ms=22.0,
        queue_share=0.3,
        batch_mix={4: 0.2, 8: 0.5, 16: 0.3},
        cost_ms=lambda b: 4.0 + 0.5 * b,
        pending=4.0,
    )
    steady_load(store, [load], target="testbed", start=now - 300, seconds=300, step=2.0)
    scrape_ok(store, "testbed", now)
    store_tuned(store, load.config, qps=420.0, at=now - 10)
    return store


def test_chart_titles_legends_and_labels_never_overlap(
    dash_duo, tmp_path, store_at, screenshot
) -> None:
    store = _autofilled(store_at, f"sqlite:///{tmp_path}/autofilled.db")
    dash_duo.start_server(create_app(store, refresh_s=REFRESH_S))
    query = urlencode({"target": "testbed", "model": "autofilled", "range": "15m"})
    viewport(dash_duo, f"/model?{query}")
    graphs = (ids.Model.QPS, ids.Model.BATCH, ids.Model.LATENCY, ids.Model.SERVICE_TIME)
    for graph in graphs:
        dash_duo.wait_for_element(f"#{graph} .scatterlayer .trace", timeout=20)
    annotations = [
        a.get_attribute("textContent")
        for a in dash_duo.find_elements(f"#{ids.Model.BATCH} .annotation")
    ]
    found = {g: overlaps(dash_duo, g) for g in (*graphs, ids.Model.DISTRIBUTION)}
    dash_duo.driver.execute_script(
        "arguments[0].scrollIntoView()", dash_duo.find_element(f"#{ids.Model.BATCH}")
    )
    screenshot("model-charts-1280x800")

    viewport(
        dash_duo, "/recommendations?" + urlencode({"target": "testbed", "model": "autofilled"})
    )
    what_if = f"#{ids.Recs.WHAT_IF_GRAPH}"
    dash_duo.wait_for_element(f"{what_if} .barlayer .trace", timeout=30)
    assert dash_duo.find_elements(f"{what_if} .legend") and dash_duo.find_elements(
        f"{what_if} .xtitle"
    )
    found[ids.Recs.WHAT_IF_GRAPH] = overlaps(dash_duo, ids.Recs.WHAT_IF_GRAPH)
    dash_duo.driver.execute_script("arguments[0].scrollIntoView()", dash_duo.find_element(what_if))
    screenshot("what-if-chart-1280x800")
    assert {g: f for g, f in found.items() if f} == {}
    assert annotations == ["preferred 32 · max 32"]
    assert severe_logs(dash_duo) == []
