"""Component ids, grouped by page, so a typo is an ``AttributeError`` at import rather
than a callback that never fires. Each id is named after its attribute in its page's
namespace: ``Overview.MODELS`` is ``"overview-models"``, ``Recs.APPLY_BOX`` is
``"recs-apply-box"``."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["Devices", "Findings", "Model", "Overview", "Recs", "Shell"]


class _Id:
    """An id spelled from the attribute that holds it and its class's ``PREFIX``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._suffix = name.lower().replace("_", "-")

    def __get__(self, instance: object, owner: type[_Namespace]) -> str:
        return f"{owner.PREFIX}-{self._suffix}"


class _Namespace:
    PREFIX: ClassVar[str]


class _Page(_Namespace):
    """What every live page has."""

    INTERVAL = _Id()  # dcc.Interval: the live refresh
    DATA = _Id()  # dcc.Store filled by the page's one tick callback
    BANNER = _Id()  # alert lines (store unreachable, target down)


class Shell(_Namespace):
    """The app shell around every page."""

    PREFIX = "shell"
    ROOT = _Id()
    THEME = _Id()  # radio: "dark" / "light"
    NAV = _Id()
    ROLE = _Id()
    VISIBLE = _Id()  # dcc.Store: the tab is visible (live refresh runs)


class Overview(_Page):
    PREFIX = "overview"
    SUMMARY = _Id()
    TILES = _Id()
    MODELS = _Id()
    FILTER = _Id()
    SORT = _Id()
    EMPTY = _Id()


class Model(_Page):
    PREFIX = "model"
    QUERY = _Id()  # dcc.Store: the page's target, model and range
    HEADER = _Id()
    RANGES = _Id()
    QPS = _Id()
    BATCH = _Id()
    LATENCY = _Id()
    PENDING = _Id()
    FAILURES = _Id()
    DISTRIBUTION = _Id()
    SERVICE_TIME = _Id()
    CONFIG = _Id()
    FINDINGS = _Id()
    RECOMMENDATION = _Id()
    PBTXT = _Id()
    COPY = _Id()


class Recs(_Page):
    PREFIX = "recs"
    QUERY = _Id()  # dcc.Store: the chosen target and model
    LIST = _Id()
    DETAIL = _Id()
    WHAT_IF = _Id()
    DELAY = _Id()  # slider over WHAT_IF_DELAYS_US (index)
    PREFERRED = _Id()
    INSTANCES = _Id()
    WHAT_IF_GRAPH = _Id()
    WHAT_IF_SUMMARY = _Id()
    APPLY_PANEL = _Id()
    APPLY_BOX = _Id()  # holds the button; hidden unless it may be used
    APPLY_CONFIRM = _Id()
    APPLY = _Id()
    JOB = _Id()  # dcc.Store: the running apply job's id
    SEEDED = _Id()  # dcc.Store: the sliders were set from the recommendation
    JOB_POLL = _Id()
    JOB_STATUS = _Id()


class Findings(_Page):
    PREFIX = "findings"
    TARGET = _Id()
    MODEL = _Id()
    KIND = _Id()
    SEVERITY = _Id()
    STATE = _Id()
    LIST = _Id()


class Devices(_Page):
    PREFIX = "devices"
    QUERY = _Id()  # dcc.Store: the chosen range
    RANGES = _Id()
    HEATMAP = _Id()
    PROCESSES = _Id()
    MEMORY = _Id()
    POWER = _Id()
