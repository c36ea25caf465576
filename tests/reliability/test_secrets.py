"""Secrets never appear in what batchscope prints, serves or raises.

The secrets are known strings: the UI's admin and viewer passwords (the admin one also
sent as a bearer token), the session signing key, a webhook's ``whsec_`` secret, a
Slack URL's token and a PostgreSQL password. Every output of runs that hold them is
searched for each: here, the messages of settings that are wrong in ways that touch a
secret (in-process, the ``ConfigError`` and its whole formatted traceback).
"""

from __future__ import annotations

import base64
import traceback
from pathlib import Path

import pytest

from collector.config import load_settings
from collector.errors import ConfigError
from tests.reliability.conftest import FaultLedger

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
        outcome=f"{len(messages)} ConfigErrors, each naming its field; no secret in any "
        "message or formatted traceback",
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
