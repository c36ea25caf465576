"""Who may see the dashboard, and who may change a live config.

Two roles: ``admin`` (may apply a recommendation) and ``viewer`` (reads only). With
``ui.admin_password`` or ``ui.viewer_password`` set, every request needs a login: a
form at ``/login`` that sets a signed session cookie, or an ``Authorization: Bearer
<password>`` header for scripts. Without a password the dashboard is open, with the
role the bind address allows: ``admin`` on a loopback address (only this machine can
reach it), ``viewer`` anywhere else — an open dashboard on a network never applies.

Every request passes, in order:

- the Host check: on a loopback bind (or whenever ``ui.allowed_hosts`` is set) only
  a request whose ``Host`` is a loopback name (``localhost``, ``127.0.0.1``, ``::1``),
  the bind address or an allowed host is served; any other gets 421. A web page
  whose name was re-pointed at 127.0.0.1 (DNS rebinding) is not answered.
- the cross-site check: a request that changes state (any method but GET and HEAD,
  and ``/logout``) is refused (403) when the browser says it comes from another site
  (``Sec-Fetch-Site``) or its ``Origin`` is not the ``Host`` (or an allowed host).
  Scripts, which send neither header, are not affected.
- the login gate, the login form's limit (``ui.login_attempts`` failed sign-ins per
  client address per ``ui.login_window_s``, form and bearer token together, then 429
  with ``Retry-After`` — a right password included — until the window has passed).

Every response carries a Content-Security-Policy (scripts from the app only, plus
the hashes of Dash's inline scripts; ``frame-ancestors 'none'``), ``X-Frame-Options:
DENY``, ``X-Content-Type-Options: nosniff`` and ``Referrer-Policy: same-origin``. The
session cookie is ``HttpOnly``, ``SameSite=Lax``, and ``Secure`` with
``ui.cookie_secure`` or when the request came over https (with
``ui.trusted_proxies``, as the proxy's ``X-Forwarded-Proto`` says).

Passwords are compared in constant time and never rendered; the login page is a
server-side template with autoescaping, and ``next`` only ever points inside the app.
Roles are checked on the server in every action, never trusted from the page.
"""

from __future__ import annotations

import hmac
import ipaddress
import math
import secrets
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from typing import Final
from urllib.parse import urlencode, urlsplit

import flask
from flask.sessions import SecureCookieSessionInterface
from flask.typing import ResponseReturnValue
from pydantic import SecretStr
from werkzeug.middleware.proxy_fix import ProxyFix

from collector.config import UiSettings

__all__ = [
    "ADMIN",
    "LOGIN_REQUIRED_KEY",
    "LOOPBACK_NAMES",
    "VIEWER",
    "LoginLimiter",
    "current_role",
    "host_of",
    "install_access",
    "is_admin",
    "open_role",
    "served_hosts",
]

ADMIN: Final = "admin"
VIEWER: Final = "viewer"
_ROLE_KEY: Final = "batchscope_role"
_OPEN_ROLE_KEY: Final = "BATCHSCOPE_OPEN_ROLE"
LOGIN_REQUIRED_KEY: Final = "BATCHSCOPE_LOGIN_REQUIRED"
# Reachable without a login: the login form itself and the stylesheet it uses (the
# path itself: "/login-x" is a page of the app, which needs a login).
_PUBLIC_PATHS: Final = frozenset({"/login"})
_PUBLIC_PREFIXES: Final = ("/assets/",)
#: The names of this machine a browser may use for a loopback-bound UI.
LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
_SAME_SITE: Final = frozenset({"same-origin", "none"})
_DEFAULT_PORTS: Final = {"http": 80, "https": 443}

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

_LOGOUT_PAGE: Final = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>batchscope · sign out</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="/assets/style.css"></head>
<body><div class="shell theme-dark login-shell">
<form method="post" action="/logout" class="login-form" id="logout-form">
<h1>batchscope</h1>
<button type="submit" id="logout-submit">Sign out</button>
</form></div></body></html>"""


def open_role(host: str) -> str:
    """The role of everyone when no password is set: admin only on loopback."""
    return ADMIN if _is_loopback(host) else VIEWER


def _is_loopback(host: str) -> bool:
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _normal_name(name: str) -> str:
    """A host name in lower case, an IP address in its short form."""
    name = name.strip().lower()
    try:
        return ipaddress.ip_address(name.strip("[]")).compressed
    except ValueError:
        return name


def host_of(header: str | None) -> tuple[str, int | None] | None:
    """The name and port of a ``Host`` header (``name``, ``name:port``,
    ``[v6]:port``); None when it is missing or not one."""
    # Not werkzeug's host_is_trusted: it cuts a trusted name at its first colon (so
    # "[::1]" can never match) and compares case-sensitively.
    text = (header or "").strip()
    if not text:
        return None
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            return None
        name, rest = text[1:end], text[end + 1 :]
        if rest and not rest.startswith(":"):
            return None
        port_text = rest[1:] if rest else ""
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return None
    else:
        name, sep, port_text = text.rpartition(":")
        if not sep:
            name, port_text = text, ""
        elif ":" in name:
            return None  # an IPv6 address without brackets
    if port_text and not (port_text.isascii() and port_text.isdigit() and len(port_text) <= 5):
        return None
    if not name or any(c in name for c in "/\\@ \t"):
        return None
    return _normal_name(name), int(port_text) if port_text else None


def served_hosts(bind_host: str, allowed_hosts: Iterable[str] = ()) -> frozenset[str] | None:
    """The ``Host`` names the UI answers to; None: any (a non-loopback bind without
    ``ui.allowed_hosts``, where the names it is reached by are not known)."""
    allowed = {_normal_name(h) for h in allowed_hosts}
    if not allowed and not _is_loopback(bind_host):
        return None
    names = set(LOOPBACK_NAMES) | allowed
    bind = _normal_name(bind_host)
    if bind not in ("0.0.0.0", "::", ""):
        names.add(bind)
    return frozenset(names)


class LoginLimiter:
    """At most ``attempts`` failed sign-ins per client in any ``window_s`` seconds.
    A client over the limit may not try (a right password included) until its oldest
    failure in the window is ``window_s`` old; a success forgets its failures. At most
    ``max_clients`` clients are remembered (the longest quiet ones are dropped)."""

    # Not the ``limits`` package's moving window: its windows are whole seconds, its
    # memory storage keeps a quiet client until some later hit, and it reads the
    # wall clock, which a test cannot step.

    def __init__(
        self,
        attempts: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_clients: int = 10_000,
    ) -> None:
        self.attempts, self.window_s = attempts, window_s
        self._clock, self._max = clock, max_clients
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()
        self._lock = threading.Lock()

    def retry_after(self, client: str) -> float | None:
        """Seconds until ``client`` may try again; None when it may now."""
        now = self._clock()
        with self._lock:
            failures = self._recent(client, now)
            if failures is None or len(failures) < self.attempts:
                return None
            return max(failures[0] + self.window_s - now, 0.001)

    def failed(self, client: str) -> None:
        now = self._clock()
        with self._lock:
            failures = self._recent(client, now)
            if failures is None:
                failures = self._failures[client] = deque()
            failures.append(now)
            self._failures.move_to_end(client)
            while len(self._failures) > self._max:
                self._failures.popitem(last=False)

    def succeeded(self, client: str) -> None:
        with self._lock:
            self._failures.pop(client, None)

    def _recent(self, client: str, now: float) -> deque[float] | None:
        failures = self._failures.get(client)
        if failures is None:
            return None
        while failures and failures[0] <= now - self.window_s:
            failures.popleft()
        if not failures:
            del self._failures[client]
            return None
        return failures


def _matches(given: bytes, password: SecretStr | None) -> bool:
    if not password:
        return False
    return hmac.compare_digest(given, password.get_secret_value().encode())


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


def _same_origin(origin: str, host_header: str | None, allowed: frozenset[str]) -> bool:
    """Whether the ``Origin`` of a request is the site it was sent to: its ``Host``,
    or one of ``ui.allowed_hosts`` (a proxy that sends the UI another Host)."""
    parts = urlsplit(origin.strip())
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return False  # "null" (a sandboxed frame, a redirect from elsewhere), or garbage
    try:
        origin_port = parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError:
        return False
    origin_name = _normal_name(parts.hostname)
    if origin_name in allowed:
        return True
    host = host_of(host_header)
    if host is None:
        return False
    return host[0] == origin_name and (host[1] or _DEFAULT_PORTS[parts.scheme]) == origin_port


class _SessionCookies(SecureCookieSessionInterface):
    """The signed session cookie, ``Secure`` also when the request came over https."""

    def get_cookie_secure(self, app: flask.Flask) -> bool:
        return bool(app.config["SESSION_COOKIE_SECURE"]) or (
            flask.has_request_context() and flask.request.is_secure
        )


def _text(status: int, body: str) -> flask.Response:
    return flask.Response(body + "\n", status=status, mimetype="text/plain")


def _content_security_policy(script_hashes: Sequence[str]) -> str:
    return "; ".join(
        [
            "default-src 'self'",
            " ".join(["script-src 'self'", *dict.fromkeys(script_hashes)]),
            # Plotly and Dash's components set styles inline.
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data: blob:",
            "font-src 'self' data:",
            "connect-src 'self'",
            "object-src 'none'",
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def install_access(
    server: flask.Flask,
    ui: UiSettings,
    *,
    host: str = "127.0.0.1",
    inline_script_hashes: Callable[[], Sequence[str]] = tuple,
) -> None:
    """Put the Host and cross-site checks, the login gate, ``/login``, ``/logout``
    and the security headers on the Flask ``server``. ``host`` is the bind address;
    ``inline_script_hashes`` gives the CSP hashes of the page's inline scripts."""
    server.secret_key = ui.secret_key.get_secret_value() if ui.secret_key else secrets.token_hex(32)
    server.session_interface = _SessionCookies()
    server.config.update(
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Lax",
        SESSION_COOKIE_SECURE=ui.cookie_secure,
    )
    server.config[LOGIN_REQUIRED_KEY] = ui.login_required
    server.config[_OPEN_ROLE_KEY] = open_role(host)
    if ui.trusted_proxies:
        n = ui.trusted_proxies
        # The proxies' X-Forwarded-For and -Proto are believed; never X-Forwarded-Host.
        server.wsgi_app = ProxyFix(  # type: ignore[method-assign]
            server.wsgi_app, x_for=n, x_proto=n, x_host=0, x_port=0, x_prefix=0
        )
    served = served_hosts(host, ui.allowed_hosts)
    allowed = frozenset(_normal_name(h) for h in ui.allowed_hosts)
    limiter = LoginLimiter(ui.login_attempts, ui.login_window_s)
    refused_host = (
        "batchscope: this dashboard is not served under that name. It answers to "
        f"{', '.join(sorted(served or ()))}; list another name in ui.allowed_hosts."
    )

    def too_many(wait_s: float, response: flask.Response) -> flask.Response:
        response.status_code = 429
        response.headers["Retry-After"] = str(math.ceil(wait_s))
        return response

    def client() -> str:
        return flask.request.remote_addr or "unknown"

    @server.before_request
    def check_host() -> ResponseReturnValue | None:
        if served is None:
            return None
        found = host_of(flask.request.environ.get("HTTP_HOST"))
        if found is None or found[0] not in served:
            return _text(421, refused_host)
        return None

    @server.before_request
    def check_site() -> ResponseReturnValue | None:
        request = flask.request
        if request.method in _SAFE_METHODS and request.path != "/logout":
            return None
        site = request.headers.get("Sec-Fetch-Site")
        origin = request.headers.get("Origin")
        if site is not None and site.strip().lower() not in _SAME_SITE:
            return _text(403, "batchscope: refused a request sent from another site")
        if origin is not None and not _same_origin(
            origin, request.environ.get("HTTP_HOST"), allowed
        ):
            return _text(403, "batchscope: refused a request whose Origin is another site")
        return None

    @server.before_request
    def gate() -> ResponseReturnValue | None:
        if not ui.login_required:
            return None
        header = flask.request.headers.get("Authorization", "")
        if header.startswith("Bearer "):
            wait_s = limiter.retry_after(client())
            if wait_s is not None:
                return too_many(wait_s, _text(429, "too many failed sign-ins; try again later"))
            role = _role_for(header[len("Bearer ") :], ui)
            if role is None:
                limiter.failed(client())
                return _text(401, "invalid token")
            flask.g.batchscope_bearer_role = role
            return None
        path = flask.request.path
        if path in _PUBLIC_PATHS or path.startswith(_PUBLIC_PREFIXES):
            return None
        if current_role() is not None:
            return None
        if path.startswith("/_dash-"):  # callbacks and layout: the page must sign in
            return flask.Response(
                '{"error": "sign in first"}', status=401, mimetype="application/json"
            )
        target = flask.request.full_path.rstrip("?")
        return flask.redirect(f"/login?{urlencode({'next': target})}")

    @server.after_request
    def security_headers(response: flask.Response) -> flask.Response:
        headers = response.headers
        # The page's inline scripts are allowed by their hashes, in pages only.
        hashes = inline_script_hashes() if response.mimetype == "text/html" else ()
        headers["Content-Security-Policy"] = _content_security_policy(hashes)
        headers["X-Frame-Options"] = "DENY"
        headers["X-Content-Type-Options"] = "nosniff"
        headers["Referrer-Policy"] = "same-origin"
        return response

    @server.route("/login", methods=["GET", "POST"])
    def login() -> ResponseReturnValue:
        if flask.request.method == "POST":
            next_path = _safe_next(flask.request.form.get("next"))
            wait_s = limiter.retry_after(client())
            if wait_s is not None:
                error = f"Too many failed sign-ins; try again in {math.ceil(wait_s)} s."
                page = flask.render_template_string(_LOGIN_PAGE, error=error, next=next_path)
                return too_many(wait_s, flask.make_response(page))
            role = _role_for(flask.request.form.get("password", ""), ui)
            if role is not None:
                limiter.succeeded(client())
                flask.session.clear()
                flask.session[_ROLE_KEY] = role
                return flask.redirect(next_path)
            limiter.failed(client())
            return flask.make_response(
                flask.render_template_string(_LOGIN_PAGE, error="Wrong password.", next=next_path),
                401,
            )
        return flask.render_template_string(
            _LOGIN_PAGE, error=None, next=_safe_next(flask.request.args.get("next"))
        )

    @server.route("/logout", methods=["GET", "POST"])
    def logout() -> ResponseReturnValue:
        # A GET signs out only when the browser says it is not from another page
        # (typed, or this app's own); otherwise it offers the sign-out button.
        request = flask.request
        if request.method == "GET" and request.headers.get("Sec-Fetch-Site") is None:
            return flask.render_template_string(_LOGOUT_PAGE)
        flask.session.clear()
        return flask.redirect("/login" if ui.login_required else "/")
