"""Alerts: ``/alerts``. Every alert's state (pending, firing, resolved) with the
silence holding it back, the silences in force, and the notification outbox per
receiver with the notifications that could not be delivered and their last error.
``/alerts?rule=…&target=…&model=…`` fills in the silence form (each open alert's and
finding's "silence" link for an admin).

An admin silences alerts here (by rule, target and model, for a duration) and ends a
silence; a viewer sees the same page without the form and the end buttons. Both
actions check the role again on the server, whatever the page showed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dash
from dash import ALL, Dash, Input, Output, State, ctx, dcc, html, no_update

from dashboard import auth, components
from dashboard.actions import ActionRefused, AlertSilences
from dashboard.components.text import fmt_time
from dashboard.ids import Alerts
from dashboard.page_parts import labelled, live_page, register_tick
from dashboard.queries import AlertsView, DashboardQueries, from_json, to_json

dash.register_page(  # type: ignore[no-untyped-call]
    __name__, path="/alerts", name="Alerts", title="batchscope · alerts", order=4
)

__all__ = ["ADMIN_ONLY", "layout", "register_callbacks"]

ADMIN_ONLY = "Only an admin can silence alerts or end a silence."
_DEFAULT_DURATION = "2h"


def _choice(component_id: str, what: str, given: Any) -> Any:
    """A dropdown started at ``given`` (from the query string); the tick fills in the
    choices."""
    value = given if isinstance(given, str) and given else None
    return dcc.Dropdown(
        id=component_id,
        placeholder=f"any {what}",
        clearable=True,
        options=[{"label": value, "value": value}] if value else [],
        value=value,
    )


def _silence_form(admin: bool, query: dict[str, Any]) -> Any:
    """The form is always in the layout (its callbacks need it), shown to admins only;
    the callbacks check the role again. ``/alerts?rule=…&target=…&model=…`` fills it
    in (the alerts' and findings' silence links)."""
    fields = [
        *labelled("rule", _choice(Alerts.RULE, "rule", query.get("rule"))),
        *labelled("target", _choice(Alerts.TARGET, "target", query.get("target"))),
        *labelled("model", _choice(Alerts.SUBJECT, "model or device", query.get("model"))),
        *labelled(
            "for",
            dcc.Input(
                id=Alerts.DURATION,
                type="text",
                value=_DEFAULT_DURATION,
                placeholder="90s, 30m, 2h, 1d",
                className="filter",
            ),
        ),
        *labelled(
            "comment",
            dcc.Input(id=Alerts.COMMENT, type="text", value="", maxLength=500, className="filter"),
        ),
    ]
    return html.Div(
        [
            html.H3("New silence"),
            html.P(
                "Notifications of matching alerts are held back until it ends; their "
                "states still change. A field left empty matches any value.",
                className="muted",
            ),
            html.Div(fields, className="silence-fields"),
            html.Button("Silence", id=Alerts.ADD, className="button"),
        ],
        id=Alerts.FORM,
        className="panel silence-form" if admin else "hidden",
    )


def layout(**query: Any) -> Any:
    admin = auth.is_admin()
    return live_page(
        Alerts,
        [
            html.Div(id=Alerts.SUMMARY),
            html.Div(id=Alerts.STATES, className="panel"),
            html.Div(
                [
                    html.Div(
                        [
                            html.Div(id=Alerts.SILENCES),
                            html.Div(id=Alerts.RESULT, role="status"),
                            html.P(ADMIN_ONLY, className="muted") if not admin else None,
                        ],
                        className="panel silences-panel",
                    ),
                    _silence_form(admin, query),
                ],
                className="alerts-panels",
            ),
            html.Div(id=Alerts.OUTBOX, className="panel outbox-panel"),
        ],
        stores=[dcc.Store(id=Alerts.CHANGED, data=0)],
    )


def register_callbacks(
    app: Dash, queries: DashboardQueries, silences: AlertSilences | None = None
) -> None:
    """The page's callbacks; ``silences`` (None: read-only) adds and ends silences."""

    def read(_changed: Any) -> Any:
        return to_json(queries.alerts())

    register_tick(app, Alerts, read, Input(Alerts.CHANGED, "data"))

    @app.callback(
        Output(Alerts.BANNER, "children"),
        Output(Alerts.SUMMARY, "children"),
        Output(Alerts.STATES, "children"),
        Output(Alerts.SILENCES, "children"),
        Output(Alerts.OUTBOX, "children"),
        Output(Alerts.RULE, "options"),
        Output(Alerts.TARGET, "options"),
        Output(Alerts.SUBJECT, "options"),
        Input(Alerts.DATA, "data"),
        State(Alerts.RULE, "value"),
        State(Alerts.TARGET, "value"),
        State(Alerts.SUBJECT, "value"),
    )
    def render(data: Any, rule: Any, target: Any, subject: Any) -> tuple[Any, ...]:
        # The choices keep what is chosen (from a link, or a name not seen yet): a
        # choice dropped from its dropdown would widen the silence to any value.
        if data is None:
            return [], [], [], [], [], _exact([], rule), _exact([], target), _exact([], subject)
        view = from_json(AlertsView, data)
        return (
            components.banner([view.error] if view.error else []),
            components.alerts_summary(view),
            components.alerts_table(view.alerts, view.generated_at, can_silence=auth.is_admin()),
            components.silences_table(view.silences, can_end=auth.is_admin()),
            components.outbox_panel(view.outbox, view.failed),
            _exact(view.rules, rule, label=lambda r: r.replace("_", " ")),
            _exact(view.targets, target),
            _exact(view.subjects, subject),
        )

    _register_changes(app, silences)


def _refused(text: str) -> tuple[Any, Any]:
    return [html.P(text, className="bad")], no_update


def _register_changes(app: Dash, silences: AlertSilences | None) -> None:
    """Adding and ending a silence: admin only, checked here on the server."""

    @app.callback(
        Output(Alerts.RESULT, "children"),
        Output(Alerts.CHANGED, "data"),
        Input(Alerts.ADD, "n_clicks"),
        State(Alerts.RULE, "value"),
        State(Alerts.TARGET, "value"),
        State(Alerts.SUBJECT, "value"),
        State(Alerts.DURATION, "value"),
        State(Alerts.COMMENT, "value"),
        State(Alerts.CHANGED, "data"),
        prevent_initial_call=True,
    )
    def add(
        clicks: Any, rule: Any, target: Any, subject: Any, duration: Any, comment: Any, n: Any
    ) -> tuple[Any, Any]:
        if not clicks:
            return no_update, no_update
        if not auth.is_admin():  # the form is hidden from viewers; this is the guard
            return _refused(ADMIN_ONLY)
        if silences is None:
            return _refused("This dashboard cannot change silences.")
        try:
            silence = silences.add(
                rule=_text(rule),
                target=_text(target),
                subject=_text(subject),
                duration=str(duration or ""),
                comment=str(comment or "").strip(),
                created_by=f"dashboard ({auth.current_role()})",
            )
        except ActionRefused as exc:
            return _refused(str(exc))
        said = (
            f"Silence #{silence.id} ({components.silence_matcher(silence)}) "
            f"until {fmt_time(silence.ends_at)}."
        )
        return [html.P(said, className="ok")], int(n or 0) + 1

    @app.callback(
        Output(Alerts.RESULT, "children", allow_duplicate=True),
        Output(Alerts.CHANGED, "data", allow_duplicate=True),
        Input({"type": Alerts.END, "index": ALL}, "n_clicks"),
        State(Alerts.CHANGED, "data"),
        prevent_initial_call=True,
    )
    def end(clicks: Any, n: Any) -> tuple[Any, Any]:
        # A redrawn list fires this with no click; only a real click ends a silence.
        del clicks
        trigger = ctx.triggered_id
        if not isinstance(trigger, dict) or not ctx.triggered or not ctx.triggered[0]["value"]:
            return no_update, no_update
        if not auth.is_admin():
            return _refused(ADMIN_ONLY)
        if silences is None:
            return _refused("This dashboard cannot change silences.")
        silence_id = trigger.get("index")
        if not isinstance(silence_id, int):
            return _refused("no such silence")
        try:
            silences.end(silence_id)
        except ActionRefused as exc:
            return _refused(str(exc))
        return [html.P(f"Silence #{silence_id} ended.", className="ok")], int(n or 0) + 1


def _exact(
    names: list[str], chosen: Any, *, label: Callable[[str], str] = str
) -> list[dict[str, str]]:
    """Dropdown options for ``names`` and the ``chosen`` value, each shown as it is (a
    target or model name) or as ``label`` spells it."""
    extra = [chosen] if isinstance(chosen, str) and chosen and chosen not in names else []
    every = [*names, *extra]
    return [{"label": label(name), "value": name} for name in every]


def _text(value: Any) -> str | None:
    """A dropdown's or field's value: its stripped text, or None when empty."""
    text = str(value).strip() if value is not None else ""
    return text or None
