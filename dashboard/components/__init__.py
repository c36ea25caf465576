"""Pure component builders: the query module's answers in, Dash components out.

Every name that comes from Triton (model, target, label, error text) is passed as a
component's *children* string, which Dash renders as text; nothing here builds HTML
from strings, and nothing uses ``dangerously_allow_html``.

One module per concern: ``text`` (formatting, links, banners, badges), ``overview``
(summary, tiles, models table), ``model`` (header, ranges, config), ``findings``
(finding and event lists), ``alerts`` (alert states, silences, outbox) and
``recommendations`` (card, list, detail, what-if, apply progress). Pages use them
through this package.
"""

from __future__ import annotations

from dashboard.components.alerts import (
    alerts_summary,
    alerts_table,
    outbox_panel,
    silence_matcher,
    silences_table,
)
from dashboard.components.findings import events_list, findings_list
from dashboard.components.model import (
    config_panel,
    model_banner,
    model_header,
    model_messages,
    range_links,
)
from dashboard.components.overview import (
    EMPTY_TEXT,
    SORT_KEYS,
    device_tile,
    empty_state,
    filter_rows,
    models_table,
    overview_messages,
    overview_summary,
    sort_rows,
    target_tile,
    tiles,
)
from dashboard.components.recommendations import (
    apply_job_status,
    pbtxt_diff,
    recommendation_card,
    recommendation_detail,
    recommendation_list,
    what_if_summary,
)
from dashboard.components.text import (
    banner,
    evidence_facts,
    finding_badges,
    fmt_ago,
    fmt_num,
    fmt_share,
    fmt_time,
    model_href,
    recs_href,
    silence_href,
)

__all__ = [
    "EMPTY_TEXT",
    "SORT_KEYS",
    "alerts_summary",
    "alerts_table",
    "apply_job_status",
    "banner",
    "config_panel",
    "device_tile",
    "empty_state",
    "events_list",
    "evidence_facts",
    "filter_rows",
    "finding_badges",
    "findings_list",
    "fmt_ago",
    "fmt_num",
    "fmt_share",
    "fmt_time",
    "model_banner",
    "model_header",
    "model_href",
    "model_messages",
    "models_table",
    "outbox_panel",
    "overview_messages",
    "overview_summary",
    "pbtxt_diff",
    "range_links",
    "recommendation_card",
    "recommendation_detail",
    "recommendation_list",
    "recs_href",
    "silence_href",
    "silence_matcher",
    "silences_table",
    "sort_rows",
    "target_tile",
    "tiles",
    "what_if_summary",
]
