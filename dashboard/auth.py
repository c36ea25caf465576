"""Who may see the dashboard, and who may change a live config.

Two roles: ``admin`` (may apply a recommendation) and ``viewer`` (reads only). With
``ui.admin_password`` or ``ui.viewer_password`` set, every request needs a login: a
form at ``/login`` that sets a signed session cookie, or an ``Authorization: Bearer
<password>`` header for scripts. Without a password the dashboard is open, with the
role the bind address allows: ``admin`` on a loopback address (only this machine can
reach it), ``viewer`` anywhere else — an open dashboard on a network never applies.

Passwords are compared in constant time and never rendered; the login page is a
server-side template with autoescaping, and ``next`` only ever points inside the app.
Roles are checked on the server in every action, never trusted from the page.
"""

from __future__ import annotations

import hmac
import ipaddress
import secrets
from typing import Final
from urllib.parse import urlencode, urlsplit

import flask
from flask.typing import ResponseReturnValue

from collector.config import UiSettings

__all__ = [
    "ADMIN",
    "LOGIN_REQUIRED_KEY",
    "VIEWER",
    "current_role",
    "install_access",
    "is_admin",
    "open_role",
]

ADMIN: Final = "admin"
VIEWER: Final = "viewer"
_ROLE_KEY: Final = "batchscope_role"
_OPEN_ROLE_KEY: Final = "BATCHSCOPE_OPEN_ROLE"
LOGIN_REQUIRED_KEY: Final = "BATCHSCOPE_LOGIN_REQUIRED"
# Reachable without a login: the login form itself and the stylesheet it uses.
_PUBLIC_PREFIXES: Final = ("/login", "/assets/")

_LOGIN_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>batchscope · sign in</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/assets/style.css"></head>
<body><div class="shell theme-dark login-shell">
<form method="post" action="/login" class="login-form" id="login-form">
<h1>batchscope</h1>
<p class="muted">Sign in to see this dashboard.</p>
{% if error %}<p class="banner" id="login-error">{{ error }}</p>{% endif %}
<input type="hidden" name="next" value="{{ next }}">
<label>Password <input type="password" name="password" id="login-password"
 autocomplete="current-password" autofocus required></label>
<button type="submit" id="login-submit">Sign in</button>
</form></div></body></html>"""


def open_role(host: str) -> str:
    """The role of everyone when no password is set: admin only on loopback."""
    name = host.strip("[]")
    if name == "localhost":
        return ADMIN
    try:
        return ADMIN if ipaddress.ip_address(name).is_loopback else VIEWER
    except ValueError:
        return VIEWER


def _matches(given: bytes, password: str | None) -> bool:
    if not password:
        return False
    return hmac.compare_digest(given, password.encode())


def _role_for(password: str, ui: UiSettings) -> str | None:
    given = password.encode()
    # Both compared, whatever the first gave, so the time does not tell which matched.
    admin = _matches(given, ui.admin_password)
    viewer = _matches(given, ui.viewer_password)
    return ADMIN if admin else VIEWER if viewer else None


def _safe_next(value: str | None) -> str:
    """A path inside this app, or ``/`` (never another host: no open redirect)."""
    if not value:
        return "/"
    parts = urlsplit(value)
    if parts.scheme or parts.netloc or not value.startswith("/") or value.startswith("//"):
        return "/"
    return value


def current_role() -> str | None:
    """The role of the request being handled (None: not signed in)."""
    if not flask.current_app.config.get(LOGIN_REQUIRED_KEY):
        return str(flask.current_app.config.get(_OPEN_ROLE_KEY, VIEWER))
    role = flask.g.get("batchscope_bearer_role") or flask.session.get(_ROLE_KEY)
    return str(role) if role in (ADMIN, VIEWER) else None


def is_admin() -> bool:
    return flask.has_request_context() and current_role() == ADMIN


def install_access(server: flask.Flask, ui: UiSettings, *, host: str = "127.0.0.1") -> None:
    """Put the login gate, ``/login`` and ``/logout`` on the Flask ``server``."""
    server.secret_key = ui.secret_key or secrets.token_hex(32)
    server.config.update(SESSION_COOKIE_HTTPONLY=True, SESSION_COOKIE_SAMESITE="Lax")
    server.config[LOGIN_REQUIRED_KEY] = ui.login_required
    server.config[_OPEN_ROLE_KEY] = open_role(host)

    @server.before_request
    def gate() -> ResponseReturnValue | None:
        if not ui.login_required:
            return None
        header = flask.request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            role = _role_for(header[len("Bearer ") :], ui)
            if role is None:
                return flask.Response("invalid token\n", status=401, mimetype="text/plain")
            flask.g.batchscope_bearer_role = role
            return None
        path = flask.request.path
        if path.startswith(_PUBLIC_PREFIXES) or current_role() is not None:
            return None
        if path.startswith("/_dash-"):  # callbacks and layout: the page must sign in
            return flask.Response(
                '{"error": "sign in first"}', status=401, mimetype="application/json"
            )
        target = flask.request.full_path.rstrip("?")
        return flask.redirect(f"/login?{urlencode({'next': target})}")

    @server.route("/login", methods=["GET", "POST"])
    def login() -> ResponseReturnValue:
        if flask.request.method == "POST":
            next_path = _safe_next(flask.request.form.get("next"))
            role = _role_for(flask.request.form.get("password", ""), ui)
            if role is not None:
                flask.session.clear()
                flask.session[_ROLE_KEY] = role
                return flask.redirect(next_path)
            return flask.make_response(
                flask.render_template_string(_LOGIN_PAGE, error="Wrong password.", next=next_path),
                401,
            )
        return flask.render_template_string(
            _LOGIN_PAGE, error=None, next=_safe_next(flask.request.args.get("next"))
        )

    @server.route("/logout")
    def logout() -> ResponseReturnValue:
        flask.session.clear()
        return flask.redirect("/login" if ui.login_required else "/")
