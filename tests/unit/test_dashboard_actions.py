"""Apply from the UI refuses clearly before it changes anything."""

from __future__ import annotations

import socket
from dataclasses import replace
from pathlib import Path

import pytest

from collector.config import target_from_url
from collector.store import Store
from dashboard.actions import ActionRefused, ConfigActions
from tests.unit.test_apply_flow import recommendation


def test_an_unknown_target_is_refused(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/a.db")
    actions = ConfigActions(store, [])
    try:
        assert not actions.knows("t")
        assert not actions.live_changes_allowed("t")
        with pytest.raises(ActionRefused, match="does not know where 't' is"):
            actions.start_apply("t", "m", 1)
    finally:
        actions.close()
        store.close()


def test_a_server_that_cannot_be_reached_is_refused_as_unreachable(tmp_path: Path) -> None:
    # A port just closed on loopback: nothing listens, the probe fails fast.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    target = target_from_url(f"http://127.0.0.1:{port}")
    store = Store(f"sqlite:///{tmp_path}/a.db")
    rid = store.add_recommendation(replace(recommendation(), target=target.name))
    actions = ConfigActions(store, [target])
    try:
        assert actions.knows(target.name)
        assert not actions.live_changes_allowed(target.name)
        refusal = actions.live_change_refusal(target.name)
        assert refusal is not None and "could not reach" in refusal
        # Unreachable is not "closed to live changes": the operator must not restart
        # a Triton that is merely down or mistyped.
        with pytest.raises(ActionRefused, match="could not reach") as err:
            actions.start_apply(target.name, "m", rid)
        assert "does not allow live config changes" not in str(err.value)
        [stored] = store.recommendations(model="m")
        assert stored.applied_at is None  # nothing was recorded as applied
    finally:
        actions.close()
        store.close()
