"""The ``alerts`` settings: receivers, routes and rules read from the file and the
environment; every bad value stops the start with a ConfigError naming the field, and
no secret (a webhook secret, a Slack URL) is ever shown."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import pytest

from collector.config import load_settings, signing_key
from collector.errors import ConfigError

KEY = b"0123456789abcdef0123456789abcdef"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
SLACK_URL = "https://hooks.slack.com/services/T000/B000/tokentokentoken"


def _alerts(alerts: dict[str, Any], env: dict[str, str] | None = None) -> Any:
    return load_settings(env=env or {}, overrides={"alerts": alerts}).alerts


def test_receivers_routes_and_rules_from_the_file(tmp_path: Path) -> None:
    secret_file = tmp_path / "hook.secret"
    secret_file.write_text(SECRET + "\n")
    cfg = tmp_path / "bs.yaml"
    cfg.write_text(
        "alerts:\n"
        "  receivers:\n"
        f"    - {{name: ops, webhook: {{url: 'https://hooks.example.com/a?x=1', "
        f"secret_file: '{secret_file}'}}}}\n"
        f"    - {{name: chat, slack: {{url: '{SLACK_URL}'}}}}\n"
        "    - {name: am, alertmanager: {url: 'http://am:9093', resend_s: 30}}\n"
        "  routes:\n"
        "    - {match: {target: a}, severity: [critical], receivers: [ops, am]}\n"
        "    - {receivers: [chat]}\n"
        "  dashboard_url: http://batchscope:8050\n"
        "  rules: {queue_saturation: {for_s: 60, severity: critical}}\n"
    )
    alerts = load_settings(config_file=cfg, env={}).alerts
    assert [r.kind for r in alerts.receivers] == ["webhook", "slack", "alertmanager"]
    ops = alerts.receiver("ops")
    assert ops.webhook is not None and ops.webhook.url == "https://hooks.example.com/a?x=1"
    assert ops.webhook.key == KEY
    assert alerts.receiver("am").alertmanager.resend_s == 30.0  # type: ignore[union-attr]
    assert alerts.rules["queue_saturation"].for_s == 60.0
    # Routes: union of every matching route, in order; severity must be one listed.
    assert alerts.receivers_for({"target": "a", "severity": "critical"}) == ("ops", "am", "chat")
    assert alerts.receivers_for({"target": "a", "severity": "warning"}) == ("chat",)
    # Secrets never show: not in repr, not in str.
    shown = repr(alerts) + str(alerts)
    assert SECRET not in shown and "tokentokentoken" not in shown


def test_without_routes_every_alert_goes_to_every_receiver() -> None:
    alerts = _alerts(
        {
            "receivers": [
                {"name": "a", "webhook": {"url": "http://127.0.0.1:9/x"}},
                {"name": "b", "alertmanager": {"url": "http://127.0.0.1:9"}},
            ]
        }
    )
    assert alerts.receivers_for({"severity": "info"}) == ("a", "b")
    assert alerts.receiver("a").webhook.key is None  # type: ignore[union-attr]  # unsigned


def test_a_secret_from_an_environment_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOOK_SECRET", SECRET)
    alerts = _alerts(
        {
            "receivers": [
                {"name": "a", "webhook": {"url": "http://h/x", "secret_env": "HOOK_SECRET"}}
            ]
        }
    )
    assert alerts.receiver("a").webhook.key == KEY  # type: ignore[union-attr]


def test_the_whole_group_from_the_environment() -> None:
    env = {
        "BATCHSCOPE_ALERTS_DASHBOARD_URL": "http://ui:8050",
        "BATCHSCOPE_ALERTS_RECEIVERS": '[{"name": "a", "webhook": {"url": "http://h/x"}}]',
        "BATCHSCOPE_ALERTS_MAX_ATTEMPTS": "3",
    }
    alerts = load_settings(env=env).alerts
    assert (alerts.dashboard_url, alerts.max_attempts, alerts.receivers[0].name) == (
        "http://ui:8050",
        3,
        "a",
    )


BAD = [
    # an unknown receiver kind
    (
        {"receivers": [{"name": "a", "pagerduty": {"url": "http://h"}}]},
        "alerts.receivers[0]",
        "unknown receiver kind 'pagerduty'",
    ),
    # two kinds, or none
    (
        {
            "receivers": [
                {"name": "a", "webhook": {"url": "http://h"}, "slack": {"url": "http://h"}}
            ]
        },
        "alerts.receivers[0]",
        "exactly one of webhook, slack, alertmanager",
    ),
    ({"receivers": [{"name": "a"}]}, "alerts.receivers[0]", "exactly one"),
    # a route to a receiver that does not exist
    (
        {
            "receivers": [{"name": "a", "webhook": {"url": "http://h"}}],
            "routes": [{"receivers": ["a"]}, {"receivers": ["b"]}],
        },
        "alerts.routes[1].receivers",
        "no receiver named 'b'",
    ),
    # malformed URLs
    (
        {"receivers": [{"name": "a", "webhook": {"url": "ftp://h/x"}}]},
        "alerts.receivers[0].webhook.url",
        "http:// or https://",
    ),
    (
        {"receivers": [{"name": "a", "alertmanager": {"url": "http://:9093"}}]},
        "alerts.receivers[0].alertmanager.url",
        "has no host",
    ),
    (
        {"receivers": [{"name": "a", "slack": {"url": "hooks.slack.com/x y"}}]},
        "alerts.receivers[0].slack.url",
        "must be a URL",
    ),
    ({"dashboard_url": "localhost:8050"}, "alerts.dashboard_url", "http:// or https://"),
    # a secret that is not whsec_ base64
    (
        {"receivers": [{"name": "a", "webhook": {"url": "http://h", "secret": "s3cr3t"}}]},
        "alerts.receivers[0].webhook.secret",
        "whsec_",
    ),
    (
        {"receivers": [{"name": "a", "webhook": {"url": "http://h", "secret": "whsec_%%%%"}}]},
        "alerts.receivers[0].webhook.secret",
        "not valid base64",
    ),
    # names, rules, numbers
    (
        {
            "receivers": [
                {"name": "a", "webhook": {"url": "http://h"}},
                {"name": "a", "slack": {"url": "http://h"}},
            ]
        },
        "alerts.receivers",
        "appears twice",
    ),
    ({"rules": {"gpu_on_fire": {}}}, "alerts.rules.gpu_on_fire", "unknown rule"),
    ({"max_attempts": 0}, "alerts.max_attempts", "greater than 0"),
    ({"routes": [{"severity": ["urgent"], "receivers": []}]}, "alerts.routes[0]", ""),
]


@pytest.mark.parametrize(("alerts", "field", "words"), BAD)
def test_bad_configuration_stops_the_start_naming_the_field(
    alerts: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _alerts(alerts)
    assert caught.value.field.startswith(field)
    assert words in str(caught.value)


def test_a_bad_secret_file_names_the_file_and_never_shows_a_secret(tmp_path: Path) -> None:
    wrong = tmp_path / "wrong.secret"
    wrong.write_text("not-a-whsec-secret")
    with pytest.raises(ConfigError) as caught:
        _alerts(
            {
                "receivers": [
                    {"name": "a", "webhook": {"url": "http://h", "secret_file": str(wrong)}}
                ]
            }
        )
    assert "secret_file" in str(caught.value) and "not-a-whsec-secret" not in str(caught.value)
    with pytest.raises(ConfigError) as missing:
        _alerts(
            {
                "receivers": [
                    {"name": "a", "webhook": {"url": "http://h", "secret_env": "NO_SUCH_VAR"}}
                ]
            }
        )
    assert "NO_SUCH_VAR is not set" in str(missing.value)
    # A receiver's error never echoes what was given: it holds the secret or the token.
    for given in ({"secret": "s3cr3t-value"}, {"secret": SECRET, "secret_env": "X"}):
        with pytest.raises(ConfigError) as caught:
            _alerts({"receivers": [{"name": "a", "webhook": {"url": "http://h", **given}}]})
        assert "s3cr3t-value" not in str(caught.value) and SECRET not in str(caught.value)
    with pytest.raises(ConfigError) as slack:
        _alerts({"receivers": [{"name": "a", "slack": {"url": SLACK_URL + " x"}}]})
    assert "tokentokentoken" not in str(slack.value)


def test_signing_key_is_the_base64_part_of_the_secret() -> None:
    assert signing_key(SECRET) == KEY
    for bad in ("", "whsec_", "whsec_***", KEY.decode()):
        with pytest.raises(ValueError):
            signing_key(bad)
