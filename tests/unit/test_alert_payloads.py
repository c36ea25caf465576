"""The bodies each receiver kind gets: Alertmanager's webhook payload version 4 with
every field, Slack's text fallback and blocks with mrkdwn escaped, Alertmanager's API
array; and our signature as the standardwebhooks package computes it."""

from __future__ import annotations

import base64
import json
from dataclasses import replace
from datetime import UTC, datetime

from standardwebhooks.webhooks import Webhook

from alerts.payloads import alertmanager_body, rfc3339, slack_body, slack_escape, webhook_body
from alerts.signing import sign, signed_headers
from collector.store.alerts import AlertState

T0 = 1_800_000_000.0
ALERT = AlertState(
    fingerprint="0123456789abcdef",
    rule="queue_saturation",
    target="triton-a",
    subject="m",
    state="firing",
    severity="warning",
    active_since=T0,
    evaluated_at=T0 + 30,
    held_at=T0 + 30,
    fired_at=T0,
    labels={"alertname": "BatchscopeQueueSaturation", "severity": "warning", "model": "m"},
    annotations={
        "summary": "m <queues> & waits",
        "evidence": "time spent queued: 60%",
        "recommendation": "max_queue_delay_us: 0 -> 500",
        "config_diff": "-max_batch_size: 8\n+max_batch_size: 32\n",
        "link": "http://ui:8050/model?target=triton-a&model=m",
    },
)


def test_webhook_body_is_alertmanagers_version_4() -> None:
    doc = json.loads(webhook_body(ALERT, "firing", receiver="ops", external_url="http://ui:8050"))
    assert set(doc) == {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    assert (doc["version"], doc["status"], doc["receiver"], doc["truncatedAlerts"]) == (
        "4",
        "firing",
        "ops",
        0,
    )
    assert doc["groupLabels"] == {"alertname": "BatchscopeQueueSaturation"}
    assert doc["commonLabels"] == ALERT.labels and doc["commonAnnotations"] == ALERT.annotations
    [alert] = doc["alerts"]
    assert set(alert) == {
        "status",
        "labels",
        "annotations",
        "startsAt",
        "endsAt",
        "generatorURL",
        "fingerprint",
    }
    assert alert["startsAt"] == "2027-01-15T08:00:00.000Z"
    assert alert["endsAt"] == "0001-01-01T00:00:00Z"  # firing: no end, as Alertmanager says
    resolved = json.loads(
        webhook_body(
            replace(ALERT, state="resolved", resolved_at=T0 + 90),
            "resolved",
            receiver="ops",
            external_url="",
        )
    )
    assert resolved["alerts"][0]["endsAt"] == "2027-01-15T08:01:30.000Z"


def test_slack_body_has_a_fallback_and_blocks_with_mrkdwn_escaped() -> None:
    doc = json.loads(slack_body(ALERT, "firing"))
    assert doc["text"] == "[WARNING] BatchscopeQueueSaturation: m &lt;queues&gt; &amp; waits"
    kinds = [b["type"] for b in doc["blocks"]]
    assert kinds == ["header", "section", "section", "section", "section"]
    texts = [b["text"]["text"] for b in doc["blocks"][1:]]
    assert texts[0] == "*m &lt;queues&gt; &amp; waits*"
    assert "```-max_batch_size: 8\n+max_batch_size: 32\n```" in texts[2]
    assert texts[3] == "<http://ui:8050/model?target=triton-a&amp;model=m|Open in batchscope>"
    # Resolved: the fix is no longer offered.
    resolved = json.loads(slack_body(ALERT, "resolved"))
    assert resolved["text"].startswith("[RESOLVED]")
    assert not any("Recommended" in b["text"]["text"] for b in resolved["blocks"][1:])
    assert slack_escape("a&b<c>d") == "a&amp;b&lt;c&gt;d"


def test_alertmanager_body_is_the_api_array() -> None:
    [alert] = json.loads(alertmanager_body(ALERT, "firing", now=T0 + 30, resend_s=60))
    assert set(alert) == {"labels", "annotations", "startsAt", "endsAt", "generatorURL"}
    assert alert["labels"]["alertname"] == "BatchscopeQueueSaturation"
    assert alert["endsAt"] == rfc3339(T0 + 30 + 4 * 60)  # valid four re-sends ahead
    assert alert["generatorURL"] == ALERT.annotations["link"]


def test_our_signature_is_the_standard_webhooks_one() -> None:
    key = b"k" * 32
    secret = "whsec_" + base64.b64encode(key).decode()
    body = webhook_body(ALERT, "firing", receiver="ops", external_url="")
    at = int(datetime.now(UTC).timestamp())
    expected = Webhook(secret).sign("msg_1", datetime.fromtimestamp(at, UTC), body)
    assert sign(key, "msg_1", at, body) == expected
    headers = signed_headers(key, "msg_1", at, body)
    assert Webhook(secret).verify(body, headers)["status"] == "firing"
    assert "webhook-signature" not in signed_headers(None, "msg_1", at, body)
