"""The app factory and the production server.

``create_app`` builds one Dash app over the store its caller opened (one engine per
process, shared with the collector): the shell (brand, page links, theme switch)
around ``dash.page_container``, the pages found in ``dashboard/pages``, and their
callbacks as closures over one ``DashboardQueries`` and the caller's
``ConfigActions`` (no module-level state, so two apps in one process each read their
own store). Callback validation stays on: ``app.validation_layout`` holds every
page's layout.
"""

from __future__ import annotations

import importlib
import logging
import math
from pathlib import Path
from typing import Any, Final

import dash
import flask
from dash import Dash, Input, Output, dcc, html

from collector.config import UiSettings
from collector.store import Store
from dashboard import auth
from dashboard.actions import AlertSilences, ConfigActions
from dashboard.auth import LOGIN_REQUIRED_KEY, install_access
from dashboard.context import DEFAULT_REFRESH_S, REFRESH_MS_KEY
from dashboard.ids import Alerts, Devices, Findings, Model, Overview, Recs, Shell
from dashboard.queries import DashboardQueries
from dashboard.theme import DARK, LIGHT

__all__ = ["PAGES", "create_app", "serve", "waitress_options"]

log = logging.getLogger("batchscope.dashboard")

_HERE: Final = Path(__file__).resolve().parent
#: The page modules under ``dashboard/pages``, each with ``layout`` and
#: ``register_callbacks(app, queries, actions)`` (the alerts page's actions are the
#: app's ``AlertSilences``, every other page's the caller's ``ConfigActions``).
PAGES: Final = ("overview", "model", "recommendations", "findings", "alerts", "devices")
#: Every page's live-refresh Interval (paused while the tab is hidden).
LIVE_INTERVALS: Final = (
    Overview.INTERVAL,
    Model.INTERVAL,
    Recs.INTERVAL,
    Findings.INTERVAL,
    Alerts.INTERVAL,
    Devices.INTERVAL,
)


def _shell() -> Any:
    nav = [
        dcc.Link("Overview", href="/", className="nav-link"),
        dcc.Link("Recommendations", href="/recommendations", className="nav-link"),
        dcc.Link("Findings", href="/findings", className="nav-link"),
        dcc.Link("Alerts", href="/alerts", className="nav-link"),
        dcc.Link("Devices", href="/devices", className="nav-link"),
    ]
    role = auth.current_role() if flask.has_request_context() else None
    who: list[Any] = [html.Span(role or "", id=Shell.ROLE, className="muted role")]
    if flask.has_request_context() and flask.current_app.config.get(LOGIN_REQUIRED_KEY):
        # A form that posts: signing out changes state, so it is never a plain link.
        who.append(
            html.Form(
                html.Button("sign out", type="submit", className="nav-link"),
                method="POST",
                action="/logout",
                className="sign-out",
            )
        )
    return html.Div(
        [
            dcc.Store(id=Shell.VISIBLE, data=True),
            html.Header(
                [
                    dcc.Link("batchscope", href="/", className="brand"),
                    html.Nav(nav, id=Shell.NAV, className="nav"),
                    html.Div(who, className="who"),
                    dcc.RadioItems(
                        id=Shell.THEME,
                        value=DARK,
                        inline=True,
                        persistence=True,
                        persistence_type="local",
                        className="theme-switch",
                        options=[
                            {"label": "dark", "value": DARK},
                            {"label": "light", "value": LIGHT},
                        ],
                    ),
                ],
                className="topbar",
            ),
            html.Main(dash.page_container, className="content"),
        ],
        id=Shell.ROOT,
        className=f"shell theme-{DARK}",
    )


def create_app(
    store: Store,
    *,
    actions: ConfigActions | None = None,
    refresh_s: float = DEFAULT_REFRESH_S,
    ui: UiSettings | None = None,
    host: str = "127.0.0.1",
    slo_p95_ms: dict[str, float] | None = None,
    queries: DashboardQueries | None = None,
    silences: AlertSilences | None = None,
) -> Dash:
    """The dashboard over ``store`` (the caller's, which it closes), refreshing every
    ``refresh_s`` seconds. Nothing is read here, so a store whose database does not
    answer yet shows a banner on each page until it does.

    ``actions`` carries out Apply (``None``: the dashboard changes nothing); ``ui``
    sets login and roles (see ``dashboard.auth``; ``host`` is the bind address, which
    decides the role when no password is set); ``slo_p95_ms`` the objectives the
    what-if draws; ``queries`` replaces the query object (tests); ``silences`` the
    silences an admin sets on the alerts page (default: in ``store``)."""
    ui = ui or UiSettings()
    if not (isinstance(refresh_s, int | float) and math.isfinite(refresh_s) and refresh_s > 0):
        raise ValueError(f"refresh_s must be a positive number of seconds, got {refresh_s!r}")
    app = Dash(
        "dashboard",  # the package: page modules are named dashboard.pages.<page>
        use_pages=True,
        pages_folder=str(_HERE / "pages"),
        assets_folder=str(_HERE / "assets"),
        title="batchscope",
        update_title="",  # the tab title stays while a callback runs
        serve_locally=True,
    )
    app.server.config[REFRESH_MS_KEY] = int(round(refresh_s * 1000))
    queries = queries or DashboardQueries(store, slo_p95_ms=slo_p95_ms)
    install_access(app.server, ui, host=host, inline_script_hashes=app.csp_hashes)

    pages = [importlib.import_module(f"dashboard.pages.{name}") for name in PAGES]
    app.layout = _shell
    # Dash declares the attribute as None; it takes a layout.
    app.validation_layout = html.Div(  # type: ignore[assignment]
        [_shell(), *[p.layout() for p in pages]]
    )
    silences = silences or AlertSilences(store)
    for name, page in zip(PAGES, pages, strict=True):
        page.register_callbacks(app, queries, silences if name == "alerts" else actions)

    # Live refresh pauses while the tab is hidden: every page's Interval is disabled
    # from the browser's visibility state, so a wall screen left in a drawer costs
    # the store nothing.
    app.clientside_callback(
        """function(_n) {
            if (!window._batchscopeVisibility) {
                window._batchscopeVisibility = true;
                document.addEventListener('visibilitychange', function () {
                    window.dash_clientside.set_props(
                        'SHELL_VISIBLE', {data: !document.hidden});
                });
            }
            return !document.hidden;
        }""".replace("SHELL_VISIBLE", Shell.VISIBLE),
        Output(Shell.VISIBLE, "data"),
        Input(Shell.ROOT, "id"),
    )  # type: ignore[no-untyped-call]
    for interval in LIVE_INTERVALS:
        app.clientside_callback(  # type: ignore[no-untyped-call]
            "function(visible) { return visible === false; }",
            Output(interval, "disabled"),
            Input(Shell.VISIBLE, "data"),
        )

    @app.callback(Output(Shell.ROOT, "className"), Input(Shell.THEME, "value"))
    def apply_theme(theme: str | None) -> str:
        return f"shell theme-{theme if theme in (DARK, LIGHT) else DARK}"

    return app


def waitress_options(ui: UiSettings | None) -> dict[str, Any]:
    """What waitress needs for ``ui``: with ``ui.trusted_proxies`` it keeps the
    proxies' X-Forwarded-* headers (which it drops by default) for the app's
    ``ProxyFix`` to read (``dashboard.auth``)."""
    return {"clear_untrusted_proxy_headers": False} if ui and ui.trusted_proxies else {}


def serve(
    store: Store,
    *,
    actions: ConfigActions | None = None,
    host: str = "127.0.0.1",
    port: int = 8050,
    refresh_s: float = DEFAULT_REFRESH_S,
    threads: int = 8,
    ui: UiSettings | None = None,
    slo_p95_ms: dict[str, float] | None = None,
) -> None:
    """Serve the dashboard over ``store`` with waitress (a production WSGI server)
    until stopped; the caller closes the store afterwards."""
    import waitress

    app = create_app(
        store, actions=actions, refresh_s=refresh_s, ui=ui, host=host, slo_p95_ms=slo_p95_ms
    )
    shown = f"[{host}]" if ":" in host else host
    print(f"batchscope dashboard on http://{shown}:{port}/", flush=True)
    waitress.serve(
        app.server,
        host=host,
        port=port,
        threads=threads,
        ident="batchscope",
        **waitress_options(ui),
    )
