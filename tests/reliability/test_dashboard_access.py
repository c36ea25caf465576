"""Who can reach the dashboard and press Apply: raw HTTP against the real app served
by waitress on 127.0.0.1, the Apply callback posted to ``/_dash-update-component``
as Dash's renderer posts it.

Apply's target is a witness: a socket on 127.0.0.1 that counts the connections made
to it. An Apply that gets past the access checks probes the target before anything
else (``ConfigActions.live_change_refusal``), so a refused Apply leaves the count at 0
and one that runs answers "could not reach" (the witness hangs up at once) with the
count at 1. The probe's answer is cached for a minute, so each test makes its refused
posts before the one it lets through.
"""

from __future__ import annotations

import base64
import hashlib
import http.client
import inspect
import json
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from dash import Dash

from bench.load import callback_body
from collector.cli import build_parser
from collector.config import TargetSettings, UiSettings, load_settings, target_from_url
from collector.errors import ConfigError
from collector.exporter.cli import DEFAULT_LISTEN, parse_listen
from collector.serve import Service
from collector.store import Store
from collector.wsgi_server import BackgroundWsgiServer
from dashboard import app as dashboard_app
from dashboard.actions import ConfigActions
from dashboard.app import create_app, serve
from dashboard.ids import Recs
from dashboard.queries import DashboardQueries, to_json
from tests.reliability.conftest import FaultLedger
from tests.unit.test_apply_flow import recommendation

ADMIN_PW = "admin-pw-for-access-Tq4"
VIEWER_PW = "viewer-pw-for-access-Wz8"
PASSWORDS = UiSettings(admin_password=ADMIN_PW, viewer_password=VIEWER_PW)
PAGES = ("/", "/recommendations", "/findings", "/alerts", "/devices", "/model?name=m")
RAN = "could not reach"  # Apply ran: it probed the witness, which hung up
VIEWER_REFUSED = "Only an admin can apply a change."
FOREIGN_HOSTS = (
    "evil.example",
    "evil.example:{port}",
    "127.0.0.1.nip.example:{port}",
    "localhost.evil.example:{port}",
    "10.0.0.5:{port}",
    "",  # no Host at all
)


class Witness:
    """A TCP listener on 127.0.0.1 that counts connections and hangs up on each."""

    def __init__(self) -> None:
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.1)
        self.port = int(self._sock.getsockname()[1])
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, name="witness", daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()


@dataclass
class Reply:
    status: int
    headers: http.client.HTTPMessage
    text: str


@dataclass
class RunningUi:
    app: Dash
    store: Store
    port: int
    witness: Witness
    target: TargetSettings

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def origin(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: dict[str, str] | None = None,
        body: bytes | None = None,
        source: str = "127.0.0.1",
    ) -> Reply:
        """One raw HTTP request; ``Host`` is 127.0.0.1:port unless ``headers`` has one
        (an empty one: none is sent)."""
        sent = {"Host": self.host, **(headers or {})}
        conn = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=30, source_address=(source, 0)
        )
        try:
            conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            for name, value in sent.items():
                if not (name == "Host" and value == ""):
                    conn.putheader(name, value)
            if body is not None:
                conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            response = conn.getresponse()
            return Reply(response.status, response.headers, response.read().decode())
        finally:
            conn.close()

    def apply_body(self) -> bytes:
        """The Apply callback (the confirmation's submit), with the page's state, as
        the renderer posts it."""
        key = next(
            k
            for k, spec in self.app.callback_map.items()
            if any(i["id"] == Recs.APPLY_CONFIRM for i in spec["inputs"])
        )
        recs, error = DashboardQueries(self.store).recommendations()
        assert error is None and recs
        body = callback_body(
            key,
            [{"id": Recs.APPLY_CONFIRM, "property": "submit_n_clicks", "value": 1}],
            [
                {
                    "id": Recs.DATA,
                    "property": "data",
                    "value": {"recs": [to_json(r) for r in recs], "error": None},
                },
                {
                    "id": Recs.QUERY,
                    "property": "data",
                    "value": {"target": self.target.name, "model": "m"},
                },
            ],
            [f"{Recs.APPLY_CONFIRM}.submit_n_clicks"],
        )
        return json.dumps(body).encode()

    def apply(self, headers: dict[str, str] | None = None) -> Reply:
        return self.request(
            "POST",
            "/_dash-update-component",
            headers={"Content-Type": "application/json", **(headers or {})},
            body=self.apply_body(),
        )

    def sign_in(self, password: str, *, source: str = "127.0.0.1") -> Reply:
        return self.request(
            "POST",
            "/login",
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": self.origin,
                "Sec-Fetch-Site": "same-origin",
            },
            body=urlencode({"password": password, "next": "/"}).encode(),
            source=source,
        )

    def session(self, password: str) -> dict[str, str]:
        """The Cookie header of a session signed in with ``password``."""
        reply = self.sign_in(password)
        assert reply.status == 302, reply.text
        cookie = reply.headers["Set-Cookie"].split(";", 1)[0]
        return {"Cookie": cookie}

    def applied(self) -> bool:
        [stored] = self.store.recommendations(model="m")
        return stored.applied_at is not None


@contextmanager
def running_ui(tmp_path: Path, ui: UiSettings, *, bind: str = "127.0.0.1") -> Iterator[RunningUi]:
    """The dashboard (as bound to ``bind``, which decides the open role and the Host
    check) served by waitress on 127.0.0.1, with one recommendation for the witness."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    witness = Witness()
    store = Store(f"sqlite:///{tmp_path / 'access.db'}")
    target = target_from_url(f"http://127.0.0.1:{witness.port}")
    store.add_recommendation(replace(recommendation(), target=target.name))
    actions = ConfigActions(store, [target])
    server: BackgroundWsgiServer | None = None
    try:
        app = create_app(store, actions=actions, ui=ui, host=bind)
        # What `serve` passes waitress: only a trusted proxy changes it (and the module
        # is read here, so that this file also runs against a dashboard without it).
        options = (
            dashboard_app.waitress_options(ui) if "trusted_proxies" in ui.model_fields_set else {}
        )
        server = BackgroundWsgiServer(
            app.server, host="127.0.0.1", port=0, threads=4, name="ui", **options
        )
        server.start()
        yield RunningUi(app, store, server.port, witness, target)
    finally:
        if server is not None:
            server.stop()
        actions.close()
        store.close()
        witness.close()


def _asset_path(ui: RunningUi) -> str:
    """A script the page loads from the app (a Dash component suite)."""
    page = ui.request("GET", "/")
    assert page.status == 200
    found = re.search(r'<script src="(/_dash-component-suites/[^"]+)"', page.text)
    assert found, "the page loads no script from the app"
    return found.group(1)


# ------------------------------------------------------------------ DNS rebinding


def test_without_a_password_only_the_loopback_names_are_served(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    """A page whose name is re-pointed at 127.0.0.1 (DNS rebinding) sends its own
    name as Host: every path, Apply included, is refused with 421 and a short reason,
    and Apply never runs. The loopback names are served and Apply runs from them."""
    with running_ui(tmp_path, UiSettings()) as ui:
        script = _asset_path(ui)
        paths = ["/", "/recommendations", "/_dash-layout", "/_dash-dependencies"]
        paths += ["/assets/style.css", script, "/login"]
        refused = 0
        for template in FOREIGN_HOSTS:
            host = {"Host": template.format(port=ui.port)}
            for path in paths:
                reply = ui.request("GET", path, headers=host)
                assert reply.status == 421, (template, path, reply.status)
                assert "ui.allowed_hosts" in reply.text and len(reply.text) < 300
                refused += 1
            reply = ui.apply(host)
            assert reply.status == 421, (template, reply.status, reply.text[:200])
            refused += 1
        assert ui.witness.connections == 0 and not ui.applied()

        for name in ("127.0.0.1", "localhost", "[::1]", "LOCALHOST"):
            host = {"Host": f"{name}:{ui.port}"}
            assert ui.request("GET", "/", headers=host).status == 200
            assert ui.request("GET", script, headers=host).status == 200
        ran = ui.apply({"Host": f"localhost:{ui.port}"})
        assert ran.status == 200 and RAN in ran.text
        assert ui.witness.connections == 1
    fault_ledger.record(
        area="access",
        fault="DNS rebinding: a foreign Host on a loopback UI without a password "
        f"({len(FOREIGN_HOSTS)} names incl. none, {len(paths)} paths and the Apply callback)",
        tries=refused,
        outcome=f"{refused}/{refused} refused with 421 naming ui.allowed_hosts; Apply's target "
        "contacted 0 times; from 127.0.0.1, localhost and [::1] pages served and Apply ran "
        "(target contacted once)",
    )


def test_allowed_hosts_admit_a_proxy_name_and_are_checked_at_start(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    settings = load_settings(env={"BATCHSCOPE_UI_ALLOWED_HOSTS": "Dash.Example.com"})
    assert settings.ui.allowed_hosts == ("dash.example.com",)
    wrong = ("https://dash.example.com", "dash.example.com:443", "dash example", "*.example")
    for value in wrong:
        with pytest.raises(ConfigError, match=r"ui\.allowed_hosts.*not a host name"):
            load_settings(env={"BATCHSCOPE_UI_ALLOWED_HOSTS": value})
    with running_ui(tmp_path, replace_ui(PASSWORDS, allowed_hosts=("dash.example.com",))) as ui:
        proxied = {"Host": "dash.example.com"}
        assert ui.request("GET", "/login", headers=proxied).status == 200
        assert ui.request("GET", "/login", headers={"Host": "evil.example"}).status == 421
        # A proxy that keeps the browser's Origin but sends the bind address as Host.
        cookie = ui.session(ADMIN_PW)
        behind = {**cookie, "Origin": "https://dash.example.com", "Sec-Fetch-Site": "same-origin"}
        ran = ui.apply(behind)
        assert ran.status == 200 and RAN in ran.text
    fault_ledger.record(
        area="access",
        fault="ui.allowed_hosts given as a URL, a name with a port, with a space, a wildcard",
        tries=len(wrong),
        outcome=f"{len(wrong)}/{len(wrong)} stopped at start with a ConfigError naming "
        "ui.allowed_hosts; a listed proxy name served, another name 421",
    )


def replace_ui(ui: UiSettings, **changes: Any) -> UiSettings:
    return UiSettings.model_validate({**ui.model_dump(), **changes})


def test_a_ui_bound_to_the_network_never_applies_without_a_login(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    """Bound to 0.0.0.0 with no password, everyone is a viewer: the Apply callback is
    refused on the server, whatever Host it names."""
    with running_ui(tmp_path, UiSettings(), bind="0.0.0.0") as ui:
        layout = ui.request("GET", "/_dash-layout", headers={"Host": "batch-host.lan:8050"})
        assert layout.status == 200 and '"viewer"' in layout.text
        for host in (ui.host, "batch-host.lan:8050", "10.0.0.5:8050"):
            reply = ui.apply({"Host": host})
            assert reply.status == 200 and VIEWER_REFUSED in reply.text
        assert ui.witness.connections == 0 and not ui.applied()
    fault_ledger.record(
        area="access",
        fault="Apply posted to a UI bound to 0.0.0.0 without a password (3 Host names)",
        tries=3,
        outcome="3/3 answered 'Only an admin can apply a change.' (role viewer); "
        "Apply's target contacted 0 times",
    )


# ----------------------------------------------------------- login on every path


def test_every_page_needs_a_login(tmp_path: Path, fault_ledger: FaultLedger) -> None:
    with running_ui(tmp_path, PASSWORDS) as ui:
        tries = 0
        for path in (*PAGES, "/loginx", "/login/../findings", "/login-page"):
            reply = ui.request("GET", path)
            assert reply.status == 302, (path, reply.status)
            assert reply.headers["Location"].startswith("/login?next=")
            tries += 1
        for path in ("/_dash-layout", "/_dash-dependencies"):
            assert ui.request("GET", path).status == 401, path
            tries += 1
    fault_ledger.record(
        area="access",
        fault="signed-out GET of every page (incl. /loginx, /login/../findings, /login-page), "
        "_dash-layout and _dash-dependencies",
        tries=tries,
        outcome=f"{tries}/{tries} refused: pages 302 to /login, Dash routes 401",
    )


def test_every_callback_needs_a_login_from_this_site(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    """Every callback of the app posted signed out is 401; Apply posted by a viewer is
    refused on the server; an admin's session posting Apply from another site or under
    another Host is refused before the callback runs."""
    with running_ui(tmp_path, PASSWORDS) as ui:
        dependencies = ui.request(
            "GET", "/_dash-dependencies", headers={"Authorization": f"Bearer {VIEWER_PW}"}
        )
        assert dependencies.status == 200
        callbacks = json.loads(dependencies.text)
        assert len(callbacks) >= 20
        for spec in callbacks:
            body = callback_body(spec["output"], [])
            reply = ui.request(
                "POST",
                "/_dash-update-component",
                headers={"Content-Type": "application/json"},
                body=json.dumps(body).encode(),
            )
            assert reply.status == 401, (spec["output"], reply.status)
        tries = len(callbacks)
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Cookie": "session=forged"}):
            reply = ui.apply(headers)
            assert reply.status == 401, (headers, reply.status)
            tries += 1
        # A viewer's session posting Apply is refused on the server.
        viewer = ui.session(VIEWER_PW)
        same_site = {"Origin": ui.origin, "Sec-Fetch-Site": "same-origin"}
        reply = ui.apply({**viewer, **same_site})
        assert reply.status == 200 and VIEWER_REFUSED in reply.text
        bearer = ui.apply({"Authorization": f"Bearer {VIEWER_PW}"})
        assert bearer.status == 200 and VIEWER_REFUSED in bearer.text
        tries += 2
        # An admin's session from another site, or under another Host: refused.
        admin = ui.session(ADMIN_PW)
        cross_site = ui.apply({**admin, "Origin": "http://evil.example"})
        assert cross_site.status == 403, (cross_site.status, cross_site.text[:200])
        rebound = ui.apply({**admin, "Host": f"evil.example:{ui.port}"})
        assert rebound.status == 421, (rebound.status, rebound.text[:200])
        tries += 2
        assert ui.witness.connections == 0 and not ui.applied()
        ran = ui.apply({**admin, **same_site})
        assert ran.status == 200 and RAN in ran.text and ui.witness.connections == 1
    fault_ledger.record(
        area="access",
        fault=f"each of the {len(callbacks)} callbacks posted signed out; Apply with a wrong "
        "token or forged cookie, by a viewer, and by an admin from another site or Host",
        tries=tries,
        outcome=f"{tries}/{tries} refused (signed out 401, viewer 'Only an admin', "
        "cross-site 403, foreign Host 421); Apply's target contacted 0 times until the "
        "admin's own post, which ran",
    )


# ---------------------------------------------------------------------- CSRF


def test_state_changes_from_another_site_are_refused(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    with running_ui(tmp_path, PASSWORDS) as ui:
        admin = ui.session(ADMIN_PW)
        cross = (
            {"Origin": "http://evil.example"},
            {"Origin": f"http://127.0.0.1:{ui.port + 1}"},
            {"Origin": f"http://127.0.0.1.evil.example:{ui.port}"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
            {"Sec-Fetch-Site": "same-site"},
            {"Sec-Fetch-Site": "cross-site", "Origin": ui.origin},
        )
        refused = 0
        for headers in cross:
            reply = ui.apply({**admin, **headers})
            assert reply.status == 403, (headers, reply.status)
            assert "another site" in reply.text
            refused += 1
        # Signing in and out from another site: refused, nothing changes.
        form = urlencode({"password": ADMIN_PW, "next": "/"}).encode()
        login = ui.request(
            "POST",
            "/login",
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "Origin": "http://evil.example",
            },
            body=form,
        )
        assert login.status == 403 and "Set-Cookie" not in login.headers
        for method, headers, status in (
            ("POST", {"Origin": "http://evil.example"}, 403),
            ("GET", {"Sec-Fetch-Site": "cross-site"}, 403),
            ("GET", {}, 200),  # a GET a browser sent without saying from where: a button
        ):
            reply = ui.request(method, "/logout", headers={**admin, **headers})
            assert reply.status == status, (method, headers, reply.status)
            if status == 403:
                assert "another site" in reply.text, reply.text[:200]
            else:
                assert 'action="/logout"' in reply.text, reply.text[:200]  # the button
            assert "Set-Cookie" not in reply.headers
            assert ui.request("GET", "/_dash-layout", headers=admin).status == 200
        refused += 4
        assert ui.witness.connections == 0 and not ui.applied()

        # The app's own page, and a script with a token, still work.
        same = ui.apply({**admin, "Origin": ui.origin, "Sec-Fetch-Site": "same-origin"})
        assert same.status == 200 and RAN in same.text and ui.witness.connections == 1
        script = ui.apply({"Authorization": f"Bearer {ADMIN_PW}"})
        assert script.status == 200 and RAN in script.text
        out = ui.request(
            "POST",
            "/logout",
            headers={**admin, "Origin": ui.origin, "Sec-Fetch-Site": "same-origin"},
        )
        assert out.status == 302 and "Set-Cookie" in out.headers
    fault_ledger.record(
        area="access",
        fault="state changes from another site: Apply with a foreign, other-port, look-alike "
        "or null Origin or a cross-/same-site Sec-Fetch-Site; sign-in and sign-out from "
        "another site",
        tries=refused,
        outcome=f"{refused}/{refused} refused (403, or the sign-out button for a GET); no "
        "cookie set or cleared; Apply's target contacted 0 times; same-origin and bearer "
        "posts ran",
    )


# -------------------------------------------------------------------- cookies


def _cookie_flags(set_cookie: str) -> set[str]:
    """The attributes of a Set-Cookie header, in lower case (``samesite=lax``)."""
    return {part.strip().lower() for part in set_cookie.split(";")[1:]}


def test_the_session_cookie_is_httponly_samesite_and_secure_behind_tls(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    with running_ui(tmp_path, PASSWORDS) as ui:
        plain = _cookie_flags(ui.sign_in(ADMIN_PW).headers["Set-Cookie"])
        assert {"httponly", "samesite=lax"} <= plain and "secure" not in plain
        # An X-Forwarded-Proto from nobody trusted is not believed.
        told = ui.request(
            "POST",
            "/login",
            headers={
                "Content-Type": "application/x-www-form-urlencoded",
                "X-Forwarded-Proto": "https",
            },
            body=urlencode({"password": ADMIN_PW}).encode(),
        )
        assert "secure" not in _cookie_flags(told.headers["Set-Cookie"])
    for ui_settings, headers in (
        (replace_ui(PASSWORDS, cookie_secure=True), {}),
        (replace_ui(PASSWORDS, trusted_proxies=1), {"X-Forwarded-Proto": "https"}),
    ):
        with running_ui(tmp_path / str(len(headers)), ui_settings) as ui:
            reply = ui.request(
                "POST",
                "/login",
                headers={"Content-Type": "application/x-www-form-urlencoded", **headers},
                body=urlencode({"password": ADMIN_PW}).encode(),
            )
            assert reply.status == 302
            flags = _cookie_flags(reply.headers["Set-Cookie"])
            assert {"httponly", "samesite=lax", "secure"} <= flags
    fault_ledger.record(
        area="access",
        fault="X-Forwarded-Proto: https sent straight to the UI, no proxy trusted",
        tries=1,
        outcome="not believed: cookie HttpOnly, SameSite=Lax, not Secure; Secure with "
        "ui.cookie_secure, and with ui.trusted_proxies 1 behind a proxy saying https",
    )


# ----------------------------------------------------------------- login limit


def test_failed_sign_ins_are_limited_per_client_address(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    window_s = 2.0
    limited = replace_ui(PASSWORDS, login_attempts=5, login_window_s=window_s)
    with running_ui(tmp_path, limited) as ui:
        first_failure = time.monotonic()
        for i in range(5):
            assert ui.sign_in(f"guess-{i}").status == 401
        blocked = ui.sign_in(ADMIN_PW)  # the right password, over the limit
        assert blocked.status == 429 and "Set-Cookie" not in blocked.headers
        retry_after = int(blocked.headers["Retry-After"])
        assert 1 <= retry_after <= window_s
        assert "Too many failed sign-ins" in blocked.text
        bearer = ui.request("GET", "/_dash-layout", headers={"Authorization": f"Bearer {ADMIN_PW}"})
        assert bearer.status == 429
        # Another client address is not held up.
        assert ui.sign_in(ADMIN_PW, source="127.0.0.2").status == 302
        # Wrong tokens count too.
        for i in range(5):
            wrong = ui.request(
                "GET",
                "/_dash-layout",
                headers={"Authorization": f"Bearer guess-{i}"},
                source="127.0.0.3",
            )
            assert wrong.status == 401
        assert ui.sign_in(ADMIN_PW, source="127.0.0.3").status == 429

        # Once the window has passed, the right password signs in.
        deadline = first_failure + window_s + 3.0
        while (status := ui.sign_in(ADMIN_PW).status) == 429 and time.monotonic() < deadline:
            time.sleep(0.1)
        waited_s = time.monotonic() - first_failure
        assert status == 302
        assert window_s <= waited_s <= window_s + 1.0
    fault_ledger.record(
        area="access",
        fault="password guessing: 5 wrong passwords by form, then the right one; 5 wrong "
        "bearer tokens from another address",
        tries=10,
        outcome=f"6th attempt 429 with Retry-After {retry_after} s (right password refused, "
        f"bearer too); another address signed in meanwhile; signed in {waited_s:.1f} s after "
        f"the first failure (window {window_s:g} s); wrong tokens counted alike",
    )


# --------------------------------------------------------------------- headers


def _directives(policy: str) -> dict[str, str]:
    found = {}
    for directive in policy.split(";"):
        name, _, value = directive.strip().partition(" ")
        found[name] = value
    return found


def _inline_script_hashes(page: str) -> set[str]:
    """The CSP hashes of the scripts written into ``page`` (not those in comments,
    such as Dash's message for Internet Explorer, nor JSON data)."""
    page = re.sub(r"<!--.*?-->", "", page, flags=re.S)
    scripts = re.findall(r"<script(?![^>]*\bsrc=)(?![^>]*json)[^>]*>(.*?)</script>", page, re.S)
    return {
        "'sha256-" + base64.b64encode(hashlib.sha256(s.encode()).digest()).decode() + "'"
        for s in scripts
    }


def test_every_response_forbids_framing_and_sniffing(
    tmp_path: Path, fault_ledger: FaultLedger
) -> None:
    with running_ui(tmp_path, PASSWORDS) as ui:
        admin = {"Authorization": f"Bearer {ADMIN_PW}"}
        script = _asset_path_signed_in(ui, admin)
        replies = {
            "page": ui.request("GET", "/recommendations", headers=admin),
            "login": ui.request("GET", "/login"),
            "layout": ui.request("GET", "/_dash-layout", headers=admin),
            "dependencies": ui.request("GET", "/_dash-dependencies", headers=admin),
            "stylesheet": ui.request("GET", "/assets/style.css"),
            "script": ui.request("GET", script, headers=admin),
            "callback": ui.apply(admin),
            "signed out": ui.apply(),
            "redirect": ui.request("GET", "/findings"),
            "foreign host": ui.request("GET", "/", headers={"Host": "evil.example"}),
            "not found": ui.request("GET", "/assets/nothing.css"),
        }
        expected_status = {"signed out": 401, "redirect": 302, "foreign host": 421}
        expected_status["not found"] = 404
        for name, reply in replies.items():
            assert reply.status == expected_status.get(name, 200), (name, reply.status)
            assert "Content-Security-Policy" in reply.headers, name
            directives = _directives(reply.headers["Content-Security-Policy"])
            assert directives["frame-ancestors"] == "'none'", name
            assert "'unsafe-inline'" not in directives["script-src"], name
            assert "'unsafe-eval'" not in directives["script-src"], name
            assert reply.headers["X-Frame-Options"] == "DENY", name
            assert reply.headers["X-Content-Type-Options"] == "nosniff", name
            assert reply.headers["Referrer-Policy"] == "same-origin", name
        page = replies["page"]
        inline = _inline_script_hashes(page.text)
        assert len(inline) >= 3
        allowed = _directives(page.headers["Content-Security-Policy"])["script-src"].split()
        assert inline <= set(allowed), "an inline script of the page is not allowed by the policy"
    fault_ledger.record(
        area="access",
        fault="framing and sniffing: security headers on pages, login, Dash routes, scripts, "
        "stylesheet, callbacks, 302, 401, 404, 421",
        tries=len(replies),
        outcome=f"{len(replies)}/{len(replies)} responses carry CSP frame-ancestors 'none' "
        "(scripts: self and the hashes of the page's "
        f"{len(inline)} inline scripts, no unsafe-inline/eval), X-Frame-Options DENY, "
        "nosniff, Referrer-Policy same-origin",
    )


def _asset_path_signed_in(ui: RunningUi, headers: dict[str, str]) -> str:
    page = ui.request("GET", "/", headers=headers)
    found = re.search(r'<script src="(/_dash-component-suites/[^"]+)"', page.text)
    assert found
    return found.group(1)


# -------------------------------------------------------------- listen defaults


def test_the_ui_and_the_exporter_listen_on_loopback_by_default() -> None:
    parser = build_parser()
    assert parser.parse_args(["dashboard"]).host == "127.0.0.1"
    assert parser.parse_args(["serve"]).host == "127.0.0.1"
    assert parse_listen(parser.parse_args(["exporter"]).listen)[0] == "127.0.0.1"
    assert DEFAULT_LISTEN.startswith("127.0.0.1:")
    for function in (create_app, serve, Service.__init__):
        assert inspect.signature(function).parameters["host"].default == "127.0.0.1", function
