"""Secrets never appear in what batchscope prints, serves or raises.

The secrets are known strings: the UI's admin and viewer passwords (the admin one also
sent as a bearer token), the session signing key, a webhook's ``whsec_`` secret, a
Slack URL's token and a PostgreSQL password. Every output of runs that hold them is
searched for each: here, the messages of settings that are wrong in ways that touch a
secret (in-process, the ``ConfigError`` and its whole formatted traceback).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import traceback
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import pytest
import requests
import yaml
from sqlalchemy.engine import make_url

from bench.load import callback_body
from collector.cli import build_parser
from collector.config import load_settings
from collector.errors import ConfigError
from tests.alert_support import Receiver
from tests.reliability.conftest import FaultLedger
from tests.support import free_port, start_process, stop_process, wait_until

ADMIN_PASSWORD = "adm1n-pw-Qx7Zr4T2"
VIEWER_PASSWORD = "v1ewer-pw-Lm3Kd8W5"
SESSION_KEY = "sess1on-key-Hc9Vb2N6"
WEBHOOK_KEY_B64 = base64.b64encode(b"webhook-signing-key-Pz4Jt7").decode()
WEBHOOK_SECRET = "whsec_" + WEBHOOK_KEY_B64
SLACK_TOKEN = "sl4ck-t0ken-Fy6Gs1E9"
PG_PASSWORD = "pg-pw-Ru5Yw3X8"
SECRETS = (
    ADMIN_PASSWORD,
    VIEWER_PASSWORD,
    SESSION_KEY,
    WEBHOOK_SECRET,
    WEBHOOK_KEY_B64,
    SLACK_TOKEN,
    PG_PASSWORD,
)


def leaked(text: str) -> list[str]:
    """The secrets found in ``text``."""
    return [secret for secret in SECRETS if secret in text]


# Settings wrong in a way that puts a secret next to the mistake: each must be a
# ConfigError naming the field without the secret.
_BAD_SETTINGS: dict[str, str] = {
    "a group given as the password": f"ui: {ADMIN_PASSWORD}\n",
    "a group given as a list": f"ui: [{ADMIN_PASSWORD}]\n",
    "alerts given as a string": f"alerts: {WEBHOOK_SECRET}\n",
    "the same password twice": (
        f"ui: {{admin_password: {ADMIN_PASSWORD}, viewer_password: {ADMIN_PASSWORD}}}\n"
    ),
    "a password that is a number": "ui: {admin_password: 12345, secret_key: " + SESSION_KEY + "}\n",
    "a webhook secret without whsec_": (
        "alerts: {receivers: [{name: a, webhook: {url: 'http://h/', "
        f"secret: '{WEBHOOK_KEY_B64}'}}}}]}}\n"
    ),
    "a webhook secret that is not base64": (
        "alerts: {receivers: [{name: a, webhook: {url: 'http://h/', "
        f"secret: '{WEBHOOK_SECRET}!!'}}}}]}}\n"
    ),
    "a receiver given as a string": f"alerts: {{receivers: [{WEBHOOK_SECRET}]}}\n",
    "a Slack URL that is not http": (
        f"alerts: {{receivers: [{{name: a, slack: {{url: 'ftp://h/{SLACK_TOKEN}'}}}}]}}\n"
    ),
    "a database URL with a bad port": (
        f"db_url: 'postgresql+psycopg://postgres:{PG_PASSWORD}@127.0.0.1:nope/test'\n"
    ),
    "a database URL that is no URL": f"db_url: ':{PG_PASSWORD}'\n",
    "a Triton URL with a password and a bad port": (
        f"targets: ['http://user:{PG_PASSWORD}@triton:nope']\n"
    ),
    "a Prometheus URL with a password and a bad scheme": (
        f"prometheus_url: 'ftp://user:{PG_PASSWORD}@prometheus'\n"
    ),
    "a dashboard URL with a password and a bad port": (
        f"alerts: {{dashboard_url: 'http://user:{PG_PASSWORD}@h:nope'}}\n"
    ),
    "a YAML error on the password's line": f'ui: {{admin_password: "{ADMIN_PASSWORD}}}\n',
    "a YAML error after the password": (
        f"ui:\n  admin_password: {ADMIN_PASSWORD}\n   viewer_password: {VIEWER_PASSWORD}\n"
    ),
}
_BAD_ENVIRONMENTS: dict[str, dict[str, str]] = {
    "a database URL with a bad port": {
        "BATCHSCOPE_DB_URL": f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:nope/test"
    },
    "the UI group as JSON with the same password twice": {
        "BATCHSCOPE_UI": f'{{"admin_password": "{ADMIN_PASSWORD}", '
        f'"viewer_password": "{ADMIN_PASSWORD}"}}'
    },
    "receivers as JSON with a bad secret": {
        "BATCHSCOPE_ALERTS_RECEIVERS": '[{"name": "a", "webhook": {"url": "http://h/", '
        f'"secret": "{WEBHOOK_SECRET}!"}}}}]'
    },
    "receivers that are not JSON": {"BATCHSCOPE_ALERTS_RECEIVERS": f"[{WEBHOOK_SECRET}"},
}


def test_settings_errors_never_echo_a_secret(tmp_path: Path, fault_ledger: FaultLedger) -> None:
    messages: list[str] = []
    for name, text in _BAD_SETTINGS.items():
        path = tmp_path / "batchscope.yaml"
        path.write_text(text)
        with pytest.raises(ConfigError) as caught:
            load_settings(config_file=path, env={})
        messages.append(f"{name}: " + "".join(traceback.format_exception(caught.value)))
    for name, env in _BAD_ENVIRONMENTS.items():
        with pytest.raises(ConfigError) as caught:
            load_settings(env=env)
        messages.append(f"{name}: " + "".join(traceback.format_exception(caught.value)))
    for message in messages:
        assert not leaked(message), message
    fault_ledger.record(
        area="secrets",
        fault="settings wrong next to a secret (a group given as its password, a bad "
        "webhook secret, a database/Triton/Prometheus URL with a password, a YAML error "
        "on a password's line), from the file and the environment",
        tries=len(messages),
        outcome=f"{len(messages)} ConfigErrors; no secret in any message or formatted traceback",
    )


def test_settings_repr_hides_secrets(tmp_path: Path) -> None:
    path = tmp_path / "batchscope.yaml"
    path.write_text(
        f"db_url: 'postgresql+psycopg://postgres:{PG_PASSWORD}@127.0.0.1:5432/test'\n"
        f"ui: {{admin_password: {ADMIN_PASSWORD}, viewer_password: {VIEWER_PASSWORD}, "
        f"secret_key: {SESSION_KEY}}}\n"
        "alerts: {receivers: [{name: a, webhook: {url: 'http://h/', "
        f"secret: '{WEBHOOK_SECRET}'}}}}, "
        f"{{name: b, slack: {{url: 'https://hooks.example.com/{SLACK_TOKEN}'}}}}]}}\n"
    )
    settings = load_settings(config_file=path, env={})
    assert not leaked(repr(settings)), repr(settings)
    assert not leaked(str(settings))


# --------------------------------------------------------------------------- runs

PAGES = ("/", "/recommendations", "/findings", "/alerts", "/devices")
RUN_TIMEOUT_S = 60.0


@dataclass
class Outputs:
    """Every text a run produced, by where it came from."""

    texts: dict[str, str] = field(default_factory=dict)

    def add(self, where: str, text: str | bytes) -> None:
        if isinstance(text, bytes):
            text = text.decode("utf-8", "replace")
        self.texts[where] = self.texts.get(where, "") + text

    def add_response(self, where: str, response: requests.Response) -> None:
        headers = "".join(f"{k}: {v}\n" for k, v in response.headers.items())
        self.add(where, f"{response.status_code}\n{headers}\n{response.text}")
        # The session cookie's payload (base64 JSON before its signature), decoded.
        for cookie in response.cookies:
            value = cookie.value or ""
            payload = value.lstrip(".").split(".")[0]
            with contextlib.suppress(ValueError, zlib.error):
                raw = base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
                self.add(
                    where + " (cookie)",
                    zlib.decompress(raw) if value.startswith(".") else raw,
                )

    def leaks(self) -> dict[str, list[str]]:
        """Where a secret was found: the lines that hold one, by output."""
        return {
            where: [line for line in text.splitlines() if leaked(line)][:5]
            for where, text in self.texts.items()
            if leaked(text)
        }


# Each command's stdout and stderr, in files: a pipe nothing reads until the end (a
# serve -v logging at debug) would fill and block the command.
_OUTPUT_FILES: dict[subprocess.Popen[bytes], tuple[IO[bytes], IO[bytes]]] = {}


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    # Closed by _finish, which reads them.
    out, err = tempfile.TemporaryFile(), tempfile.TemporaryFile()  # noqa: SIM115
    proc = start_process(
        [sys.executable, "-m", "collector.cli", *args],
        stdout=out,
        stderr=err,
        env={**os.environ, **(env or {})},
    )
    _OUTPUT_FILES[proc] = (out, err)
    return proc


def _finish(outputs: Outputs, name: str, proc: subprocess.Popen[bytes]) -> int:
    """Wait for a command (bounded) and keep its stdout and stderr."""
    try:
        proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        stop_process(proc)
    out, err = _OUTPUT_FILES.pop(proc)
    with out, err:
        out.seek(0)
        err.seek(0)
        outputs.add(f"{name}: stdout", out.read())
        outputs.add(f"{name}: stderr", err.read())
    return proc.returncode


def _with_password(url: str, password: str) -> str:
    return make_url(url).set(password=password).render_as_string(hide_password=False)


def _dead_slack_url() -> str:
    return f"http://127.0.0.1:{free_port()}/services/T1/B1/{SLACK_TOKEN}"


def _settings_file(path: Path, db_url: str, dead_triton: str, hook: str, chat: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "targets": [dead_triton],
                "db_url": db_url,
                "interval_s": 1,
                "timeout_s": 1,
                "sources": ["triton", "host"],
                "analysis_every_s": 1,
                "ui": {
                    "admin_password": ADMIN_PASSWORD,
                    "viewer_password": VIEWER_PASSWORD,
                    "secret_key": SESSION_KEY,
                },
                "alerts": {
                    "receivers": [
                        {"name": "hook", "webhook": {"url": hook, "secret": WEBHOOK_SECRET}},
                        {"name": "chat", "slack": {"url": chat}},
                        # Nothing listens there: every delivery is refused.
                        {"name": "gone", "slack": {"url": _dead_slack_url()}},
                    ],
                    "rules": {"target_down": {"for_s": 0}},
                    "backoff_s": 0.2,
                    "backoff_max_s": 0.5,
                    "max_attempts": 3,
                    "deliver_every_s": 0.5,
                    "timeout_s": 2,
                },
            }
        )
    )
    return path


def _callback_requests(dependencies: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request body per Dash callback (and per page for those that read the path)."""
    bodies = []
    for dep in dependencies:
        reads_path = any(i["property"] == "pathname" for i in dep["inputs"])
        for page in PAGES if reads_path else (None,):

            def value(item: dict[str, Any], page: str | None = page) -> dict[str, Any]:
                v = page if item["property"] == "pathname" else None
                return {**item, "value": v}

            bodies.append(
                callback_body(
                    dep["output"],
                    [value(i) for i in dep["inputs"]],
                    [value(s) for s in dep.get("state", [])],
                    [f"{_id_text(i['id'])}.{i['property']}" for i in dep["inputs"]][:1],
                )
            )
    return bodies


def _helps(parser: argparse.ArgumentParser, name: str) -> dict[str, str]:
    """``--help`` of a command and of each of its subcommands, at every depth."""
    found = {f"{name} --help": parser.format_help()}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                found.update(_helps(sub, f"{name} {sub_name}"))
    return found


def _id_text(ident: Any) -> str:
    return ident if isinstance(ident, str) else json.dumps(ident, separators=(",", ":"))


def _read_ui(outputs: Outputs, base: str) -> tuple[int, int, int]:
    """Every page and callback of the UI, signed out, with a wrong password, signed in
    by form and by bearer token: the requests made, the callback requests, and how many
    of those were answered 200."""
    made = 0

    def keep(name: str, response: requests.Response) -> None:
        nonlocal made
        made += 1
        outputs.add_response(f"UI {name}", response)

    anonymous = requests.Session()
    for page in (*PAGES, "/_dash-layout", "/_dash-dependencies", "/login"):
        keep(
            f"GET {page} signed out", anonymous.get(base + page, timeout=10, allow_redirects=False)
        )
    wrong = anonymous.post(
        base + "/login",
        data={"password": VIEWER_PASSWORD + "-wrong", "next": "/"},
        timeout=10,
        allow_redirects=False,
    )
    assert wrong.status_code == 401
    keep("POST /login wrong password", wrong)
    keep(
        "GET / wrong bearer",
        requests.get(
            base + "/", headers={"Authorization": f"Bearer {ADMIN_PASSWORD}x"}, timeout=10
        ),
    )
    for role, password in (("viewer", VIEWER_PASSWORD), ("admin", ADMIN_PASSWORD)):
        session = requests.Session()
        signed_in = session.post(
            base + "/login",
            data={"password": password, "next": "/"},
            timeout=10,
            allow_redirects=False,
        )
        assert signed_in.status_code == 302, signed_in.text
        keep(f"POST /login {role}", signed_in)
        for page in PAGES:
            keep(f"GET {page} as {role}", session.get(base + page, timeout=10))
    bearer = requests.Session()
    bearer.headers["Authorization"] = f"Bearer {ADMIN_PASSWORD}"
    dependencies = bearer.get(base + "/_dash-dependencies", timeout=10)
    assert dependencies.status_code == 200
    keep("GET /_dash-dependencies bearer", dependencies)
    keep("GET /_dash-layout bearer", bearer.get(base + "/_dash-layout", timeout=10))
    bodies = _callback_requests(dependencies.json())
    assert len(bodies) >= 5, "the UI's callbacks were not found"
    answered = 0
    for i, body in enumerate(bodies):
        response = bearer.post(base + "/_dash-update-component", json=body, timeout=30)
        answered += response.status_code == 200
        keep(f"POST /_dash-update-component #{i} {body['output']}", response)
        refused = anonymous.post(base + "/_dash-update-component", json=body, timeout=10)
        assert refused.status_code in (401, 403), refused.status_code
        keep(f"POST /_dash-update-component #{i} signed out", refused)
    # The page callbacks rendered their pages (the rest need inputs only a click gives).
    assert answered >= len(PAGES), f"only {answered} of {len(bodies)} callbacks answered"
    return made, len(bodies), answered


@pytest.mark.postgres
def test_no_secret_in_any_output_of_a_run(
    tmp_path: Path, pg_url: str, fault_ledger: FaultLedger
) -> None:
    """``serve`` (debug logs), its UI, ``status``, ``alerts``, ``exporter`` and the
    error paths of ``collect`` and of wrong settings, all with known secrets."""
    outputs = Outputs()
    db_url = _with_password(pg_url, PG_PASSWORD)
    dead_triton = f"http://127.0.0.1:{free_port()}"
    with (
        Receiver(secret=WEBHOOK_SECRET, script=[(500, {})] * 50) as hook,
        Receiver(script=[(503, {})] * 50) as chat,
    ):
        chat_url = f"{chat.url}/services/T0/B0/{SLACK_TOKEN}"
        config = _settings_file(
            tmp_path / "bs.yaml", db_url, dead_triton, hook.url + "/hook", chat_url
        )
        port = free_port()
        base = f"http://127.0.0.1:{port}"

        serve = _cli("-v", "serve", "--config", str(config), "--port", str(port))
        try:
            wait_until(
                lambda: requests.get(base + "/login", timeout=2).status_code == 200,
                RUN_TIMEOUT_S,
                "the UI of batchscope serve",
            )
            # The target is down: its alert fires and both receivers fail, twice each.
            wait_until(
                lambda: len(hook.received) >= 2 and len(chat.received) >= 2,
                RUN_TIMEOUT_S,
                "two failed deliveries to each receiver",
                every_s=0.2,
            )
            ui_requests, callbacks, answered = _read_ui(outputs, base)
        finally:
            stop_process(serve)
        assert _finish(outputs, "serve -v", serve) == 0
        for received in (*hook.received, *chat.received):
            outputs.add(
                f"receiver {received.path[:9]} request",
                json.dumps(received.headers) + received.body,
            )
        assert all(r.verified for r in hook.received), "webhooks must be signed"

        listen = f"127.0.0.1:{free_port()}"
        exporter = _cli(
            "-v", "exporter", "--config", str(config), "--db", db_url, "--listen", listen
        )
        try:
            wait_until(
                lambda: requests.get(f"http://{listen}/metrics", timeout=2).status_code == 200,
                RUN_TIMEOUT_S,
                "the exporter's /metrics",
            )
            for path in ("/metrics", "/", "/healthz", "/readyz"):
                outputs.add_response(
                    f"exporter GET {path}", requests.get(f"http://{listen}{path}", timeout=10)
                )
        finally:
            stop_process(exporter)
        assert _finish(outputs, "exporter -v", exporter) == 0

        bad_ui = tmp_path / "bad_ui.yaml"
        bad_ui.write_text(f"ui: {ADMIN_PASSWORD}\n")
        bad_yaml = tmp_path / "bad_yaml.yaml"
        bad_yaml.write_text(f'ui: {{admin_password: "{ADMIN_PASSWORD}}}\n')
        unreachable_db = _with_password(
            f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/test", PG_PASSWORD
        )
        missing_db = _with_password(
            "postgresql+psycopg://postgres@127.0.0.1:5432/bs_no_such_db", PG_PASSWORD
        )
        commands = {  # name: (arguments, environment, expected exit status)
            "status": (["status", "--config", str(config)], None, 0),
            "status --json": (["status", "--json", "--config", str(config)], None, 0),
            "alerts": (["alerts", "--config", str(config)], None, 0),
            "alerts --json": (["alerts", "--json", "--config", str(config)], None, 0),
            "alerts test (receiver failing)": (
                ["alerts", "test", "--receiver", "chat", "--config", str(config)],
                None,
                1,
            ),
            "alerts test (receiver down)": (
                ["alerts", "test", "--receiver", "gone", "--config", str(config)],
                None,
                1,
            ),
            "collect (database unreachable)": (
                ["collect", "--triton", dead_triton, "--db", unreachable_db, "--duration", "1"],
                None,
                2,
            ),
            "collect (no such database)": (
                ["collect", "--triton", dead_triton, "--db", missing_db, "--duration", "1"],
                None,
                2,
            ),
            "serve (ui given as its password)": (["serve", "--config", str(bad_ui)], None, 2),
            "serve (YAML error on the password's line)": (
                ["serve", "--config", str(bad_yaml)],
                None,
                2,
            ),
            "status (database URL with a bad port, environment)": (
                ["status"],
                {"BATCHSCOPE_DB_URL": f"postgresql://postgres:{PG_PASSWORD}@127.0.0.1:nope/test"},
                2,
            ),
        }
        running = {
            name: (_cli(*args, env=env), status) for name, (args, env, status) in commands.items()
        }
        for name, (proc, status) in running.items():
            assert _finish(outputs, name, proc) == status, outputs.texts[f"{name}: stderr"]

    helps = _helps(build_parser(), "batchscope")
    for name, text in helps.items():
        outputs.add(name, text)

    assert not outputs.leaks(), outputs.leaks()
    # The runs did what they are for: the secrets were in use.
    assert "cannot open database" in outputs.texts["collect (database unreachable): stderr"]
    assert "invalid setting ui" in outputs.texts["serve (ui given as its password): stderr"]
    fault_ledger.record(
        area="secrets",
        fault="a run with known secrets (UI admin/viewer passwords, bearer token, session "
        "key, whsec_ webhook secret, Slack URL token, PostgreSQL password): serve with "
        "debug logs, its UI and callbacks, the exporter, status, alerts, collect's and "
        "the settings' error paths, --help",
        tries=len(outputs.texts),
        outcome=f"{len(outputs.texts)} outputs searched ({ui_requests} UI requests incl. "
        f"{callbacks} callback requests, {answered} answered 200 signed in, every one "
        f"refused signed out; {len(hook.received) + len(chat.received)} "
        f"failed deliveries received, {len(commands) + 2} commands' stdout/stderr, "
        "/metrics and the exporter's pages, every --help): no secret in any",
    )
