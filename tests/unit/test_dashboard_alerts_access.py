"""Silences on the alerts page are an admin's: the callbacks are posted as raw HTTP to
``/_dash-update-component`` (as a page, or anyone, would post them), signed in with
each role's bearer token, on the real app over a real SQLite store. A viewer's post
is refused on the server and changes nothing, whatever the page showed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from flask.testing import FlaskClient

from bench.load import callback_body, callback_updates
from collector.config import UiSettings
from collector.store import Store
from collector.store.alerts import AlertState, NewNotification
from dashboard.app import create_app
from dashboard.ids import Alerts

ADMIN_PW = "an-admin-password-for-alerts"
VIEWER_PW = "a-viewer-password-for-alerts"
ADMIN = {"Authorization": f"Bearer {ADMIN_PW}"}
VIEWER = {"Authorization": f"Bearer {VIEWER_PW}"}
# The refusal the page shows (dashboard.pages.alerts.ADMIN_ONLY, which is importable
# only once an app exists).
ADMIN_ONLY = "Only an admin can silence alerts or end a silence."
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with Store(f"sqlite:///{tmp_path / 'alerts-access.db'}") as s:
        yield s


@pytest.fixture
def client(store: Store) -> FlaskClient:
    app = create_app(store, ui=UiSettings(admin_password=ADMIN_PW, viewer_password=VIEWER_PW))
    client = app.server.test_client()
    client.application.config["callback_map"] = app.callback_map  # for post_callback
    return client


def _callback_key(client: FlaskClient, input_id: str) -> str:
    """The registered output key of the callback fired by ``input_id``."""
    callback_map: dict[str, Any] = client.application.config["callback_map"]
    return next(
        key
        for key, spec in callback_map.items()
        if any(input_id in i["id"] for i in spec["inputs"]) and "alerts-result" in key
    )


def post_callback(
    client: FlaskClient,
    headers: dict[str, str],
    *,
    input_id: str,
    inputs: list[Any],
    state: list[dict[str, Any]],
    changed: str,
) -> Any:
    """Post one callback as the renderer would; the JSON answer (or the status code)."""
    key = _callback_key(client, input_id)
    response = client.post(
        "/_dash-update-component",
        headers=headers,
        json=callback_body(key, inputs, state, [changed]),
    )
    if response.status_code == 204:  # no_update everywhere
        return {}
    assert response.status_code == 200, response.get_data(as_text=True)
    return callback_updates(response.get_json())


def add_silence(client: FlaskClient, headers: dict[str, str], **fields: Any) -> Any:
    values = {"rule": None, "target": None, "subject": None, "duration": "2h", "comment": ""}
    values.update(fields)
    ids = {
        "rule": Alerts.RULE,
        "target": Alerts.TARGET,
        "subject": Alerts.SUBJECT,
        "duration": Alerts.DURATION,
        "comment": Alerts.COMMENT,
    }
    return post_callback(
        client,
        headers,
        input_id=Alerts.ADD,
        inputs=[{"id": Alerts.ADD, "property": "n_clicks", "value": 1}],
        state=[
            *({"id": ids[k], "property": "value", "value": v} for k, v in values.items()),
            {"id": Alerts.CHANGED, "property": "data", "value": 0},
        ],
        changed=f"{Alerts.ADD}.n_clicks",
    )


def end_silence(client: FlaskClient, headers: dict[str, str], silence_id: int) -> Any:
    button = {"index": silence_id, "type": Alerts.END}
    return post_callback(
        client,
        headers,
        input_id=Alerts.END,
        inputs=[[{"id": button, "property": "n_clicks", "value": 1}]],
        state=[{"id": Alerts.CHANGED, "property": "data", "value": 3}],
        changed=json.dumps(button, sort_keys=True, separators=(",", ":")) + ".n_clicks",
    )


def text_of(response: Any) -> str:
    return json.dumps(response)


def test_a_viewer_cannot_add_a_silence(client: FlaskClient, store: Store) -> None:
    answer = add_silence(client, VIEWER, rule="queue_saturation", target="triton-a")
    assert ADMIN_ONLY in text_of(answer)
    assert Alerts.CHANGED not in answer  # the page is not told anything changed
    assert store.silences() == []


def test_an_admin_adds_a_silence_and_the_page_reads_again(
    client: FlaskClient, store: Store
) -> None:
    answer = add_silence(
        client, ADMIN, rule="queue_saturation", subject="resnet50", duration="30m", comment="load"
    )
    [silence] = store.silences()
    assert (silence.rule, silence.target, silence.subject) == ("queue_saturation", None, "resnet50")
    assert silence.ends_at - silence.starts_at == 1800.0
    assert (silence.comment, silence.created_by) == ("load", "dashboard (admin)")
    assert f"Silence #{silence.id}" in text_of(answer)
    assert answer[Alerts.CHANGED]["data"] == 1


def test_an_admin_is_told_why_a_silence_is_refused(client: FlaskClient, store: Store) -> None:
    answer = add_silence(client, ADMIN, rule="queue_saturation", duration="soon")
    assert "such as 90s, 30m, 2h or 1d" in text_of(answer)
    assert "choose a rule" in text_of(add_silence(client, ADMIN))
    assert store.silences() == []


def test_a_viewer_cannot_end_a_silence_and_an_admin_can(client: FlaskClient, store: Store) -> None:
    silence = store.add_silence(starts_at=0.0, ends_at=4e9, target="triton-a")
    assert ADMIN_ONLY in text_of(end_silence(client, VIEWER, silence.id))
    assert store.silences(active_at=1e9) == [silence]

    answer = end_silence(client, ADMIN, silence.id)
    assert f"Silence #{silence.id} ended" in text_of(answer)
    assert store.silences(active_at=2e9) == []
    assert "not in force" in text_of(end_silence(client, ADMIN, silence.id))


def test_a_redrawn_list_ends_nothing(client: FlaskClient, store: Store) -> None:
    silence = store.add_silence(starts_at=0.0, ends_at=4e9, target="triton-a")
    button = {"index": silence.id, "type": Alerts.END}
    answer = post_callback(
        client,
        ADMIN,
        input_id=Alerts.END,
        inputs=[[{"id": button, "property": "n_clicks", "value": None}]],
        state=[{"id": Alerts.CHANGED, "property": "data", "value": 0}],
        changed=json.dumps(button, sort_keys=True, separators=(",", ":")) + ".n_clicks",
    )
    assert not answer  # nothing to update
    assert store.silences(active_at=1e9) == [silence]


def _render(client: FlaskClient, headers: dict[str, str], *, target: str | None = None) -> str:
    """The page as ``headers``' role gets it: the tick, then the panels drawn from it
    (``target``: the target already chosen in the silence form)."""
    tick = client.post(
        "/_dash-update-component",
        headers=headers,
        json={
            "output": f"{Alerts.DATA}.data",
            "outputs": {"id": Alerts.DATA, "property": "data"},
            "inputs": [
                {"id": Alerts.INTERVAL, "property": "n_intervals", "value": 0},
                {"id": Alerts.CHANGED, "property": "data", "value": 0},
            ],
            "state": [],
            "changedPropIds": [f"{Alerts.INTERVAL}.n_intervals"],
        },
    )
    assert tick.status_code == 200
    data = tick.get_json()["response"][Alerts.DATA]["data"]
    callback_map: dict[str, Any] = client.application.config["callback_map"]
    key = next(k for k in callback_map if f"{Alerts.STATES}.children" in k)
    outputs = [
        {"id": c, "property": p}
        for c, p in (part.rsplit(".", 1) for part in key.strip(".").split("..."))
    ]
    page = client.post(
        "/_dash-update-component",
        headers=headers,
        json={
            "output": key,
            "outputs": outputs,
            "inputs": [{"id": Alerts.DATA, "property": "data", "value": data}],
            "state": [
                {"id": Alerts.RULE, "property": "value", "value": None},
                {"id": Alerts.TARGET, "property": "value", "value": target},
                {"id": Alerts.SUBJECT, "property": "value", "value": None},
            ],
            "changedPropIds": [f"{Alerts.DATA}.data"],
        },
    )
    assert page.status_code == 200
    return json.dumps(tick.get_json()) + page.get_data(as_text=True)


def test_both_roles_see_alerts_only_an_admin_gets_silence_controls_and_no_body_is_sent(
    client: FlaskClient, store: Store
) -> None:
    state = AlertState(
        fingerprint="fp",
        rule="queue_saturation",
        target="triton-a",
        subject="resnet50",
        state="firing",
        severity="warning",
        active_since=1e9,
        evaluated_at=1e9,
        held_at=1e9,
        fired_at=1e9,
        labels={"model": "resnet50"},
        annotations={"summary": "resnet50 queues: 70% of request time queued"},
    )
    # A body holding what a receiver's settings might: the page never shows bodies.
    body = json.dumps({"secret": SECRET, "url": "https://user:pw@hooks.example.com/x"})
    other = replace(state, fingerprint="fp2", rule="failure_rate", annotations={})
    store.save_alert_evaluation(
        [state, other], notifications=[NewNotification("w1", "hook", "fp", "firing", body, 1e9)]
    )
    store.add_silence(starts_at=0.0, ends_at=4e9, rule="queue_saturation")
    for headers, buttons in ((ADMIN, True), (VIEWER, False)):
        shown = _render(client, headers)
        assert "resnet50 queues: 70% of request time queued" in shown
        assert "silenced by #1" in shown and '"hook"' in shown
        assert (Alerts.END in shown) is buttons
        # The unsilenced alert's link to a filled-in form, for an admin only.
        link = "alerts?rule=failure_rate&target=triton-a&model=resnet50"
        assert (link in shown) is buttons
        assert SECRET not in shown and "user:pw" not in shown


def test_a_chosen_target_stays_among_the_choices(client: FlaskClient, store: Store) -> None:
    # Chosen from a link before any alert names it: dropping it from the choices would
    # widen the silence to every target.
    shown = _render(client, ADMIN, target="triton-new")
    assert '{"label":"triton-new","value":"triton-new"}' in shown.replace(" ", "")


def _form_class(client: FlaskClient, headers: dict[str, str]) -> str:
    from dashboard.pages import alerts  # importable once an app exists

    with client.application.test_request_context("/alerts", headers=headers):
        client.application.preprocess_request()  # the login gate sets the role
        page = alerts.layout(target="triton-a")
    [form] = [c for c in _walk(page) if getattr(c, "id", None) == Alerts.FORM]
    return str(form.className)


def _walk(component: Any) -> Iterator[Any]:
    yield component
    children = getattr(component, "children", None)
    for child in children if isinstance(children, list) else [children]:
        if child is not None and not isinstance(child, str):
            yield from _walk(child)


def test_the_form_is_laid_out_for_an_admin_and_hidden_from_a_viewer(client: FlaskClient) -> None:
    assert "silence-form" in _form_class(client, ADMIN)
    assert _form_class(client, VIEWER) == "hidden"
