"""Dash's ``dash_duo`` fixture driving Debian's headless Chromium (``chromium`` and
``chromium-driver``; ``make test`` installs them with ``system-deps``, and
``dash[testing]`` with the ``browser`` extra).

Plain ``pytest`` runs these tests headless in Chrome: ``pytest_configure`` sets what
``--headless --webdriver Chrome`` would. Without Chromium or its driver the tests
fail with the reason, never skip: a browser suite that silently skips would let the
UI break unnoticed.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from collector.store import Store
from collector.synthetic import Load, model_config, scrape_ok, steady_load, store_recommendation
from dashboard import ids

CHROME_ARGUMENTS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--window-size=1600,1200",
)


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def pytest_configure(config: pytest.Config) -> None:
    # What `--headless --webdriver Chrome` says on the command line.
    if hasattr(config.option, "headless"):
        config.option.headless = True
        config.option.webdriver = "Chrome"


def pytest_setup_options():  # type: ignore[no-untyped-def]
    """Chrome options for dash_duo: Debian's Chromium, headless, no sandbox (CI
    containers run as root)."""
    from selenium.webdriver.chrome.options import Options

    options = Options()
    binary = _chromium()
    if binary:
        options.binary_location = binary
    for argument in CHROME_ARGUMENTS:
        options.add_argument(argument)
    return options


@pytest.fixture(autouse=True)
def _browser_installed() -> None:
    missing = [
        name
        for name, found in (
            ("chromium", _chromium()),
            ("chromedriver", shutil.which("chromedriver")),
        )
        if not found
    ]
    if missing:
        pytest.fail(
            f"{' and '.join(missing)} not found: run `make system-deps` (Debian "
            f"packages chromium chromium-driver)",
            pytrace=False,
        )


def no_alert(driver) -> bool:  # type: ignore[no-untyped-def]
    """True when no JavaScript alert is open (a name rendered as HTML would open one)."""
    try:
        driver.switch_to.alert  # noqa: B018 (raises when no alert is open)
    except NoAlertPresentException:
        return True
    return False


def assert_no_html_ran(driver) -> None:  # type: ignore[no-untyped-def]
    """No image element and no alert: a name rendered as HTML would make either."""
    assert driver.find_elements(By.TAG_NAME, "img") == []
    assert no_alert(driver)


def click_when_ready(  # type: ignore[no-untyped-def]
    dash_duo, selector: str, *, text: str | None = None, timeout: float = 20
) -> None:
    """Click the first element at ``selector`` (whose text is ``text``, when given),
    finding it again when a re-render replaced it between the find and the click: a
    held reference goes stale whenever Dash redraws its parent."""

    def clicked(driver) -> bool:  # type: ignore[no-untyped-def]
        for element in driver.find_elements(By.CSS_SELECTOR, selector):
            if text is None or element.text == text:
                element.click()
                return True
        return False

    WebDriverWait(
        dash_duo.driver, timeout, ignored_exceptions=(StaleElementReferenceException,)
    ).until(clicked, f"no {selector!r} to click" + (f" reading {text!r}" if text else ""))


def text_when_ready(dash_duo, selector: str, *, timeout: float = 20) -> str:  # type: ignore[no-untyped-def]
    """The text of the element at ``selector``, read again when a re-render replaced
    the element between the find and the read."""
    read = WebDriverWait(
        dash_duo.driver, timeout, ignored_exceptions=(StaleElementReferenceException,)
    ).until(lambda driver: [driver.find_element(By.CSS_SELECTOR, selector).text])
    return read[0]


def open_model_page(dash_duo, model: str, *, timeout: float) -> None:  # type: ignore[no-untyped-def]
    """Follow the overview's link to ``model``'s page; wait for its heading and rates."""
    link = next(
        a for a in dash_duo.find_elements(f"#{ids.Overview.MODELS} a.model-link") if a.text == model
    )
    link.click()
    dash_duo.wait_for_text_to_equal(f"#{ids.Model.HEADER} h2", model, timeout=timeout)
    dash_duo.wait_for_element(f"#{ids.Model.QPS} .scatterlayer .trace", timeout=timeout)


def severe_logs(dash_duo) -> list[dict]:  # type: ignore[no-untyped-def]
    """The browser console's errors."""
    return [entry for entry in (dash_duo.get_logs() or []) if entry.get("level") == "SEVERE"]


BATCHED = model_config("batched", batching=True, preferred=(8, 16), delay_us=2000)
UNBATCHED = model_config("unbatched", batching=False)


def loads(*names: str) -> list[Load]:
    out = [
        Load(
            config=BATCHED,
            qps=420.0,
            request_ms=22.0,
            queue_share=0.3,
            batch_mix={4: 0.2, 8: 0.5, 16: 0.3},
            cost_ms=lambda b: 4.0 + 0.5 * b,
            pending=4.0,
        ),
        Load(
            config=UNBATCHED,
            qps=180.0,
            request_ms=85.0,
            queue_share=0.9,
            batch_mix={1: 1.0},
            cost_ms=lambda b: 4.5,
            fail_per_s=0.2,
            pending=12.0,
        ),
    ]
    for name in names:  # extra models with the unbatched load
        out.append(
            Load(
                config=model_config(name, batching=False),
                qps=30.0,
                request_ms=10.0,
                queue_share=0.1,
                batch_mix={1: 1.0},
                cost_ms=lambda b: 4.0,
            )
        )
    return out


@pytest.fixture
def store_at() -> Iterator[Callable[[str], Store]]:
    """``store_at(url)``: a ``Store`` over ``url``, closed after the test (the app is
    handed its store, as ``batchscope serve`` hands it the one it opened)."""
    opened: list[Store] = []

    def open_store(url: str) -> Store:
        opened.append(Store(url))
        return opened[-1]

    yield open_store
    for store in opened:
        store.close()


@pytest.fixture
def seeded_store(tmp_path: Path, store_at: Callable[[str], Store]) -> Callable[..., Store]:
    """``seed(*extra_models)`` fills a SQLite store with the last five minutes of two
    models (and any extra, unbatched ones) on target ``testbed``, a finding, and a
    recommendation; returns the store."""

    def seed(*extra: str) -> Store:
        store = store_at(f"sqlite:///{tmp_path}/browser.db")
        now = time.time()
        steady_load(store, loads(*extra), target="testbed", start=now - 300, seconds=300, step=2.0)
        scrape_ok(store, "testbed", now)
        store.add_finding(
            kind="batching_off",
            severity="warning",
            target="testbed",
            subject="unbatched",
            summary="12 requests wait on average but run one at a time",
            window_start=now - 60,
            window_end=now,
            evidence={"concurrency": 15.3, "avg_batch_size": 1.0},
            created_at=now - 30,
        )
        store_recommendation(
            store, target="testbed", config=UNBATCHED, qps=180.0, p95_ms=95.0, created_at=now - 20
        )
        return store

    return seed


@pytest.fixture
def screenshot(dash_duo, tmp_path: Path) -> Iterator[Callable[[str], Path]]:  # type: ignore[no-untyped-def]
    """``screenshot(name)`` saves the page as ``<tmp_path>/<name>.png``."""

    def save(name: str) -> Path:
        path = tmp_path / f"{name}.png"
        dash_duo.driver.save_screenshot(str(path))
        assert path.stat().st_size > 0
        return path

    yield save
