"""Component ids: plain string constants grouped by page, so a typo is an
``AttributeError`` at import rather than a callback that never fires. Ids are
namespaced by page (``overview-…``, ``model-…``)."""

from __future__ import annotations

from typing import Final

__all__ = ["Model", "Overview", "Shell"]


class Shell:
    """The app shell around every page."""

    ROOT: Final = "shell-root"
    THEME: Final = "shell-theme"  # radio: "dark" / "light"
    THEME_STORE: Final = "shell-theme-store"  # the chosen theme, kept in the browser
    NAV: Final = "shell-nav"


class Overview:
    INTERVAL: Final = "overview-interval"
    DATA: Final = "overview-data"  # dcc.Store filled by the one tick callback
    BANNER: Final = "overview-banner"
    SUMMARY: Final = "overview-summary"
    TILES: Final = "overview-tiles"
    MODELS: Final = "overview-models"
    FILTER: Final = "overview-filter"
    SORT: Final = "overview-sort"
    EMPTY: Final = "overview-empty"


class Model:
    INTERVAL: Final = "model-interval"
    DATA: Final = "model-data"  # dcc.Store filled by the one tick callback
    QUERY: Final = "model-query"  # dcc.Store: the page's target, model and range
    BANNER: Final = "model-banner"
    HEADER: Final = "model-header"
    RANGES: Final = "model-ranges"
    QPS: Final = "model-qps"
    BATCH: Final = "model-batch"
    LATENCY: Final = "model-latency"
    PENDING: Final = "model-pending"
    FAILURES: Final = "model-failures"
    DISTRIBUTION: Final = "model-distribution"
    SERVICE_TIME: Final = "model-service-time"
    CONFIG: Final = "model-config"
    FINDINGS: Final = "model-findings"
    RECOMMENDATION: Final = "model-recommendation"
    PBTXT: Final = "model-pbtxt"
    COPY: Final = "model-copy"
