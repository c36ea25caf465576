"""Everything the dashboard reads: the only part of ``dashboard`` that reads the store
(the store rows its views hold are re-exported from here for the pages).

``DashboardQueries`` (``reader``) wraps the process's one ``Store`` and answers with
small frozen dataclasses (``views``) that compose the records they show, so a tick
callback can put them in a ``dcc.Store`` (``to_json``) and a figure callback can
rebuild them (``from_json``, ``codec``) without knowing how they were read.

Reads are bounded: the overview reads one status window (``overview``); a model page
reads one model over one range, from raw samples up to ``RAW_RANGE_S`` and from
rollups (plus the raw tail not rolled up yet) beyond, downsampled to at most
``max_points`` points (``series``, ``model``); the findings page reads events
(``events``), the alerts page alert states, silences and the outbox (``alerts``),
the devices page heatmap buckets (``devices``), the recommendations page what-if
curves (``what_if``). Nothing here raises on a database failure: each
answer carries ``error`` (a one-line message for the banner).
"""

from collector.store import StoredFinding, StoredModelConfig, StoredRecommendation
from collector.store.alerts import AlertState, Notification, Silence
from dashboard.queries.codec import from_json, to_json
from dashboard.queries.events import MODEL_FINDINGS_SHOWN
from dashboard.queries.reader import DashboardQueries
from dashboard.queries.views import (
    DEFAULT_RANGE,
    RANGES,
    RAW_RANGE_S,
    WHAT_IF_DELAYS_US,
    AlertRow,
    AlertsView,
    BatchDistribution,
    DevicesView,
    DeviceTile,
    EventsView,
    HeatRow,
    ModelDetail,
    ModelRow,
    ModelSeries,
    OverviewData,
    ReceiverOutbox,
    RecommendationView,
    ServiceTimeView,
    TargetTile,
    WhatIfView,
    is_open,
    parse_range,
)

__all__ = [
    "MODEL_FINDINGS_SHOWN",
    "DEFAULT_RANGE",
    "RANGES",
    "RAW_RANGE_S",
    "WHAT_IF_DELAYS_US",
    "AlertRow",
    "AlertState",
    "AlertsView",
    "BatchDistribution",
    "DashboardQueries",
    "DeviceTile",
    "DevicesView",
    "EventsView",
    "HeatRow",
    "ModelDetail",
    "ModelRow",
    "ModelSeries",
    "Notification",
    "OverviewData",
    "ReceiverOutbox",
    "RecommendationView",
    "ServiceTimeView",
    "Silence",
    "StoredFinding",
    "StoredModelConfig",
    "StoredRecommendation",
    "TargetTile",
    "WhatIfView",
    "from_json",
    "is_open",
    "parse_range",
    "to_json",
]
