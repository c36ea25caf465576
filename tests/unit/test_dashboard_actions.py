"""Apply from the UI refuses clearly before it changes anything."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import target_from_url
from collector.store import Store
from dashboard.actions import ActionRefused, ConfigActions
from tests.browser.seed import model_config, store_recommendation


def test_an_unknown_target_is_refused(tmp_path: Path) -> None:
    actions = ConfigActions([], f"sqlite:///{tmp_path}/a.db")
    assert not actions.knows("t")
    assert not actions.live_changes_allowed("t")
    with pytest.raises(ActionRefused, match="does not know where 't' is"):
        actions.start_apply("t", "m", 1)


def test_a_server_that_cannot_be_reached_takes_no_live_change(tmp_path: Path) -> None:
    # Port 9 (discard) on loopback: nothing listens, the probe fails fast.
    target = target_from_url("http://127.0.0.1:9")
    url = f"sqlite:///{tmp_path}/a.db"
    store = Store(url)
    rid = store_recommendation(store, target=target.name, config=model_config("m", batching=False),
                               qps=10.0, p95_ms=20.0, created_at=1.0)
    store.close()
    actions = ConfigActions([target], url)
    assert actions.knows(target.name)
    assert not actions.live_changes_allowed(target.name)
    with pytest.raises(ActionRefused, match="does not allow live config changes"):
        actions.start_apply(target.name, "m", rid)
