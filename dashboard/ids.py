"""Component ids, grouped by page, so a typo is an ``AttributeError`` at import rather
than a callback that never fires. Each id is named after its attribute in its page's
namespace: ``Overview.MODELS`` is ``"overview-models"``, ``Recs.APPLY_BOX`` is
``"recs-apply-box"``."""

from __future__ import annotations

from typing import ClassVar

__all__ = ["Alerts", "Devices", "Findings", "LivePage", "Model", "Overview", "Recs", "Shell"]


class _Id:
    """An id spelled from the attribute that holds it and its class's ``PREFIX``."""

    def __set_name__(self, owner: type, name: str) -> None:
        self._suffix = name.lower().replace("_", "-")

    def __get__(self, instance: object, owner: type[_Namespace]) -> str:
        return f"{owner.PREFIX}-{self._suffix}"


def _ids(count: int) -> tuple[_Id, ...]:
    """``count`` ids, for the names of one line (``A, B = _ids(2)``)."""
    return tuple(_Id() for _ in range(count))


class _Namespace:
    PREFIX: ClassVar[str]


class LivePage(_Namespace):
    """What every live page has: its refresh, the data its one tick callback reads, and
    the banner for a store or target that is down."""

    INTERVAL, DATA, BANNER = _ids(3)


class Shell(_Namespace):
    """The app shell around every page."""

    PREFIX = "shell"
    ROOT, NAV, ROLE = _ids(3)
    THEME = _Id()  # radio: "dark" / "light"
    VISIBLE = _Id()  # dcc.Store: the tab is visible (live refresh runs)


class Overview(LivePage):
    PREFIX = "overview"
    SUMMARY, TILES, EMPTY = _ids(3)
    MODELS, FILTER, SORT = _ids(3)  # the models table and its controls


class Model(LivePage):
    PREFIX = "model"
    QUERY = _Id()  # dcc.Store: the page's target, model and range
    HEADER, RANGES = _ids(2)
    QPS, BATCH, LATENCY, PENDING, FAILURES, DISTRIBUTION, SERVICE_TIME = _ids(7)  # graphs
    RECOMMENDATION, FINDINGS, CONFIG = _ids(3)  # panels
    PBTXT, COPY = _ids(2)  # the recommended fragment and its copy button


class Recs(LivePage):
    PREFIX = "recs"
    QUERY = _Id()  # dcc.Store: the chosen target and model
    LIST, DETAIL = _ids(2)
    WHAT_IF, WHAT_IF_GRAPH, WHAT_IF_SUMMARY = _ids(3)
    DELAY = _Id()  # slider over WHAT_IF_DELAYS_US (index)
    DELAY_VALUE = _Id()  # the slider's delay in µs, as text
    PREFERRED, INSTANCES = _ids(2)
    SEEDED = _Id()  # dcc.Store: the sliders were set from the recommendation
    APPLY_PANEL, APPLY_CONFIRM, APPLY = _ids(3)
    APPLY_BOX = _Id()  # holds the button; hidden unless it may be used
    JOB = _Id()  # dcc.Store: the running apply job's id
    JOB_POLL, JOB_STATUS = _ids(2)


class Findings(LivePage):
    PREFIX = "findings"
    TARGET, MODEL, KIND, SEVERITY, STATE = _ids(5)  # the filters
    LIST = _Id()


class Alerts(LivePage):
    PREFIX = "alerts"
    SUMMARY, STATES, SILENCES, OUTBOX = _ids(4)  # the panels
    CHANGED = _Id()  # dcc.Store: a silence was added or ended (the tick reads again)
    # The silence form (an admin's only) and what became of its last use.
    FORM, RULE, TARGET, SUBJECT, DURATION, COMMENT, ADD, RESULT = _ids(8)
    #: The type of each silence's end button, ``{"type": END, "index": silence id}``.
    END = _Id()


class Devices(LivePage):
    PREFIX = "devices"
    QUERY = _Id()  # dcc.Store: the chosen range
    RANGES = _Id()
    HEATMAP, PROCESSES, MEMORY, POWER = _ids(4)  # graphs
