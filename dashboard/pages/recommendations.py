"""Recommendations: ``/recommendations?target=…&model=…`` (shareable).

The latest recommendation of every model, the chosen one with its change as a diff
of ``config.pbtxt`` and a copy button; a what-if panel whose sliders re-run the
batcher model fitted to the observed load (``DashboardQueries.what_if``) and draw
predicted QPS and p95 against the objective; and Apply, shown only to an admin when
the target takes live config changes, behind a confirmation, with the verification
result after. The role is checked again on the server when Apply fires.
"""

from __future__ import annotations

from typing import Any

import dash
from dash import Dash, Input, Output, State, dcc, html, no_update

from dashboard import auth, components, figures
from dashboard.actions import ActionRefused, ConfigActions
from dashboard.ids import Recs, Shell
from dashboard.page_parts import graph, labelled, live_page, register_tick
from dashboard.queries import (
    WHAT_IF_DELAYS_US,
    DashboardQueries,
    RecommendationView,
    from_json,
    to_json,
)

dash.register_page(  # type: ignore[no-untyped-call]
    __name__,
    path="/recommendations",
    name="Recommendations",
    title="batchscope · recommendations",
    order=2,
)

__all__ = ["layout", "register_callbacks"]

_PREFERRED_CHOICES = (1, 2, 4, 8, 16, 32, 64, 128)


def _what_if_controls() -> Any:
    """The sliders and the dropdown the what-if re-runs the batcher model for."""
    # The slider moves over the delays' indices (evenly spaced); its own number box
    # would show the index, so it has none and the delay is spelled out beside it.
    delay = dcc.Slider(
        id=Recs.DELAY,
        min=0,
        max=len(WHAT_IF_DELAYS_US) - 1,
        step=1,
        value=0,
        marks={i: f"{d}" for i, d in enumerate(WHAT_IF_DELAYS_US)},
        allow_direct_input=False,
    )
    preferred = dcc.Dropdown(
        id=Recs.PREFERRED,
        multi=True,
        value=[],
        placeholder="none (as large as possible)",
        options=[{"label": str(p), "value": p} for p in _PREFERRED_CHOICES],
    )
    instances = dcc.Slider(
        id=Recs.INSTANCES, min=1, max=4, step=1, value=1, marks={i: str(i) for i in range(1, 5)}
    )
    return html.Div(
        [
            html.Label("max queue delay (µs)", htmlFor=Recs.DELAY),
            html.Div(
                [html.Output(_delay_text(0), id=Recs.DELAY_VALUE, className="delay-value"), delay],
                className="delay-box",
            ),
            *labelled("preferred batch sizes", preferred),
            *labelled("instances", instances),
        ],
        className="what-if-controls",
    )


def _delay_us(index: Any) -> int:
    """The delay (µs) at slider position ``index`` (clamped to the slider's range)."""
    i = int(index) if isinstance(index, int | float) else 0
    return WHAT_IF_DELAYS_US[min(max(i, 0), len(WHAT_IF_DELAYS_US) - 1)]


def _delay_text(index: Any) -> str:
    return f"{_delay_us(index)} µs"


def _what_if_panel() -> Any:
    return html.Div(
        [
            html.H3("What if"),
            html.P(
                "Move a slider: the batcher model fitted to this model's observed traffic "
                "predicts throughput and p95 for that config at the same load.",
                className="muted",
            ),
            _what_if_controls(),
            dcc.Loading(graph(Recs.WHAT_IF_GRAPH), type="dot"),
            html.Div(id=Recs.WHAT_IF_SUMMARY),
        ],
        id=Recs.WHAT_IF,
        className="panel",
    )


def _apply_panel() -> Any:
    # The button is always in the layout (its callbacks need it) but shown to admins
    # only; the Apply callback checks the role again on the server.
    confirm = dcc.ConfirmDialogProvider(
        html.Button("Apply this change", id=Recs.APPLY, className="button"),
        id=Recs.APPLY_CONFIRM,
        message="",
    )
    return html.Div(
        [html.Div(id=Recs.APPLY_PANEL), html.Div(confirm, id=Recs.APPLY_BOX, className="hidden")],
        className="panel",
    )


def layout(**query: Any) -> Any:
    chosen = {"target": query.get("target") or None, "model": query.get("model") or None}
    recs_list = html.Div(id=Recs.LIST, className="rec-list")
    main = [
        html.Div(id=Recs.DETAIL, className="panel"),
        _what_if_panel(),
        _apply_panel(),
        html.Div(id=Recs.JOB_STATUS, className="panel job"),
    ]
    return live_page(
        Recs,
        [
            html.Div(
                [recs_list, html.Div(main, className="rec-main")],
                className="rec-layout",
            )
        ],
        stores=[
            dcc.Store(id=Recs.QUERY, data=chosen),
            dcc.Store(id=Recs.JOB),
            dcc.Store(id=Recs.SEEDED, data=False),
            dcc.Interval(id=Recs.JOB_POLL, interval=1000, disabled=True),
        ],
        name="recommendations",
    )


def _selected(recs: list[RecommendationView], query: Any) -> RecommendationView | None:
    query = query or {}
    for r in recs:
        if (r.stored.target, r.stored.model) == (query.get("target"), query.get("model")):
            return r
    return recs[0] if recs else None


def _recs(data: Any) -> list[RecommendationView]:
    return [from_json(RecommendationView, r) for r in (data or {}).get("recs", [])]


def _chosen(data: Any, query: Any) -> RecommendationView | None:
    """The recommendation the page shows, from its data and its query."""
    return _selected(_recs(data), query)


# What ``_chosen`` is read from: redrawn on each new read of the page's data, or
# read along when something else (a slider, a click) fires.
_ON_NEW_DATA = (Input(Recs.DATA, "data"), State(Recs.QUERY, "data"))
_WITH_DATA = (State(Recs.DATA, "data"), State(Recs.QUERY, "data"))
# The what-if controls: started at the proposed config, read by the what-if.
_SLIDERS = (Recs.DELAY, Recs.PREFERRED, Recs.INSTANCES)


def register_callbacks(
    app: Dash, queries: DashboardQueries, actions: ConfigActions | None = None
) -> None:
    """The page's callbacks; ``actions`` (None: read-only) carries out Apply."""
    _register_list(app, queries)
    _register_what_if(app, queries)
    _register_apply(app, actions)


def _register_list(app: Dash, queries: DashboardQueries) -> None:
    """The tick that reads every model's latest recommendation; the list and the
    chosen one's detail drawn from it."""

    def read() -> Any:
        recs, error = queries.recommendations()
        return {"recs": [to_json(r) for r in recs], "error": error}

    register_tick(app, Recs, read)

    @app.callback(
        Output(Recs.BANNER, "children"),
        Output(Recs.LIST, "children"),
        Output(Recs.DETAIL, "children"),
        *_ON_NEW_DATA,
    )
    def render(data: Any, query: Any) -> tuple[Any, ...]:
        if data is None:
            return [], [], []
        recs = _recs(data)
        chosen = _selected(recs, query)
        error = data.get("error")
        return (
            components.banner([error] if error else []),
            components.recommendation_list(
                recs, (chosen.stored.target, chosen.stored.model) if chosen else None
            ),
            components.recommendation_detail(chosen),
        )


def _register_what_if(app: Dash, queries: DashboardQueries) -> None:
    """The sliders, started at the proposed config, and the curve they ask for."""

    @app.callback(
        *[Output(c, "value") for c in _SLIDERS],
        Output(Recs.SEEDED, "data"),
        *_ON_NEW_DATA,
        State(Recs.SEEDED, "data"),
        prevent_initial_call=True,
    )
    def start_from_recommendation(data: Any, query: Any, seeded: Any) -> tuple[Any, ...]:
        # The first fill starts the sliders at the proposed config; later refreshes
        # leave whatever the user has set.
        chosen = _chosen(data, query)
        if seeded or chosen is None:
            return no_update, no_update, no_update, no_update
        proposed = chosen.stored.recommendation.proposed_config
        delay = (
            WHAT_IF_DELAYS_US.index(proposed.max_queue_delay_us)
            if proposed.max_queue_delay_us in WHAT_IF_DELAYS_US
            else 0
        )
        return delay, list(proposed.preferred_batch_sizes), proposed.instance_count, True

    @app.callback(
        Output(Recs.WHAT_IF_GRAPH, "figure"),
        Output(Recs.WHAT_IF_SUMMARY, "children"),
        *[Input(c, "value") for c in _SLIDERS],
        Input(Shell.THEME, "value"),
        *_WITH_DATA,
    )
    def what_if(
        delay_index: Any, preferred: Any, instances: Any, theme: str, data: Any, query: Any
    ) -> tuple[Any, ...]:
        chosen = _chosen(data, query)
        if chosen is None:
            view = None
        else:
            sizes = [int(p) for p in (preferred or []) if isinstance(p, int | float)]
            view = queries.what_if(
                chosen.stored.target,
                chosen.stored.model,
                preferred=sizes,
                instances=int(instances or 1),
            )
        delay = _delay_us(delay_index)
        current = chosen.current if chosen is not None else None
        return (
            figures.what_if_figure(
                view,
                theme,
                chosen_delay_us=delay,
                current_qps=current.qps if current is not None else None,
            ),
            components.what_if_summary(view, delay),
        )

    @app.callback(Output(Recs.DELAY_VALUE, "children"), Input(Recs.DELAY, "value"))
    def delay_value(delay_index: Any) -> str:
        return _delay_text(delay_index)


def _apply_offer(
    chosen: RecommendationView | None, actions: ConfigActions | None
) -> tuple[Any, ...]:
    """The Apply panel's text, the button box's class and the confirmation message:
    Apply is offered to an admin when the change is real and the target takes live
    changes; otherwise the panel says why not."""

    def say(text: str) -> tuple[Any, ...]:
        return [html.P(text, className="muted")], "hidden", ""

    if chosen is None:
        return [], "hidden", ""
    if not chosen.changes:
        return say("Nothing to apply: the current config is already the best found.")
    if not auth.is_admin():
        return say("Only an admin can apply a change.")
    target, model = chosen.stored.target, chosen.stored.model
    if actions is None or not actions.knows(target):
        return say(
            "This dashboard does not know where this server is; run "
            "`batchscope serve` with its URL to apply from here."
        )
    # Unreachable and "no live changes" (start it with --model-control-mode=explicit)
    # read differently; either way the fragment can still be copied.
    refusal = actions.live_change_refusal(target)
    if refusal is not None:
        return say(f"Cannot apply from here: {refusal.rstrip('.')}. Copy the fragment instead.")
    return (
        [
            html.H3("Apply"),
            html.P(
                "Loads the proposed config through Triton's model-repository API, "
                "measures before and after, and rolls back when throughput falls "
                "or p95 breaks the objective.",
                className="muted",
            ),
        ],
        "apply-box",
        f"Apply the recommended config to {model} on {target} now? "
        f"It is verified and rolled back on a regression.",
    )


def _register_apply(app: Dash, actions: ConfigActions | None) -> None:
    """Apply: shown to an admin when the target takes live changes, started behind a
    confirmation, its progress polled until it is done."""

    @app.callback(
        Output(Recs.APPLY_PANEL, "children"),
        Output(Recs.APPLY_BOX, "className"),
        Output(Recs.APPLY_CONFIRM, "message"),
        *_ON_NEW_DATA,
    )
    def apply_panel(data: Any, query: Any) -> tuple[Any, ...]:
        return _apply_offer(_chosen(data, query), actions)

    @app.callback(
        Output(Recs.JOB, "data"),
        Output(Recs.JOB_POLL, "disabled"),
        Output(Recs.JOB_STATUS, "children", allow_duplicate=True),
        Input(Recs.APPLY_CONFIRM, "submit_n_clicks"),
        *_WITH_DATA,
        prevent_initial_call=True,
    )
    def apply(submitted: Any, data: Any, query: Any) -> tuple[Any, ...]:
        chosen = _chosen(data, query)
        if not submitted or chosen is None:
            return no_update, no_update, no_update
        if not auth.is_admin():  # the button is hidden from viewers; this is the guard
            return None, True, [html.P("Only an admin can apply a change.", className="bad")]
        if actions is None:
            return None, True, [html.P("This dashboard cannot apply changes.", className="bad")]
        try:
            job = actions.start_apply(chosen.stored.target, chosen.stored.model, chosen.stored.id)
        except ActionRefused as exc:
            return None, True, [html.P(str(exc), className="bad")]
        return job.id, False, components.apply_job_status(job)

    @app.callback(
        Output(Recs.JOB_STATUS, "children"),
        Output(Recs.JOB_POLL, "disabled", allow_duplicate=True),
        Input(Recs.JOB_POLL, "n_intervals"),
        State(Recs.JOB, "data"),
        prevent_initial_call=True,
    )
    def poll(_n: Any, job_id: Any) -> tuple[Any, ...]:
        job = actions.job(job_id) if actions is not None and job_id else None
        if job is None:
            return [], True
        return components.apply_job_status(job), job.done
