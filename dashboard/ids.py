"""Component ids: plain string constants grouped by page, so a typo is an
``AttributeError`` at import rather than a callback that never fires. Ids are
namespaced by page (``overview-…``, ``model-…``)."""

from __future__ import annotations

from typing import Final

__all__ = ["Devices", "Findings", "Model", "Overview", "Recs", "Shell"]


class Shell:
    """The app shell around every page."""

    ROOT: Final = "shell-root"
    THEME: Final = "shell-theme"  # radio: "dark" / "light"
    THEME_STORE: Final = "shell-theme-store"  # the chosen theme, kept in the browser
    NAV: Final = "shell-nav"
    ROLE: Final = "shell-role"
    VISIBLE: Final = "shell-visible"  # dcc.Store: the tab is visible (live refresh runs)


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


class Recs:
    INTERVAL: Final = "recs-interval"
    DATA: Final = "recs-data"  # dcc.Store: the latest recommendation per model
    QUERY: Final = "recs-query"  # dcc.Store: the chosen target and model
    BANNER: Final = "recs-banner"
    LIST: Final = "recs-list"
    DETAIL: Final = "recs-detail"
    WHAT_IF: Final = "recs-what-if"
    DELAY: Final = "recs-delay"  # slider over WHAT_IF_DELAYS_US (index)
    PREFERRED: Final = "recs-preferred"
    INSTANCES: Final = "recs-instances"
    WHAT_IF_GRAPH: Final = "recs-what-if-graph"
    WHAT_IF_SUMMARY: Final = "recs-what-if-summary"
    APPLY_PANEL: Final = "recs-apply-panel"
    APPLY_BOX: Final = "recs-apply-box"  # holds the button; hidden unless it may be used
    APPLY_CONFIRM: Final = "recs-apply-confirm"
    APPLY: Final = "recs-apply"
    JOB: Final = "recs-job"  # dcc.Store: the running apply job's id
    SEEDED: Final = "recs-seeded"  # dcc.Store: the sliders were set from the recommendation
    JOB_POLL: Final = "recs-job-poll"
    JOB_STATUS: Final = "recs-job-status"


class Findings:
    INTERVAL: Final = "findings-interval"
    DATA: Final = "findings-data"
    BANNER: Final = "findings-banner"
    TARGET: Final = "findings-target"
    MODEL: Final = "findings-model"
    KIND: Final = "findings-kind"
    SEVERITY: Final = "findings-severity"
    STATE: Final = "findings-state"
    LIST: Final = "findings-list"


class Devices:
    INTERVAL: Final = "devices-interval"
    DATA: Final = "devices-data"
    QUERY: Final = "devices-query"
    BANNER: Final = "devices-banner"
    RANGES: Final = "devices-ranges"
    HEATMAP: Final = "devices-heatmap"
    PROCESSES: Final = "devices-processes"
    MEMORY: Final = "devices-memory"
    POWER: Final = "devices-power"
