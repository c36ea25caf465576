"""The latest recommendation of a model, read as one row.

The recommender stores a recommendation every pass (one a minute by default), so a
store's history of them grows for as long as it runs. The pages, the recommender's
reuse check and ``apply`` want only the latest; reading the whole history to keep its
last entry made each of them cost more, and hold more memory, the longer serve ran.
"""

from __future__ import annotations

import pytest

from collector.apply import stored_recommendation
from collector.store import Store, StoredRecommendation
from collector.synthetic import model_config, store_recommendation
from dashboard.queries import DashboardQueries
from dashboard.queries.model import latest_recommendation

T0 = 1_700_000_000.0
TARGET = "triton-a"


def _store(s: Store, model: str, created_at: float, qps: float) -> int:
    config = model_config(model, batching=False)
    return store_recommendation(
        s, target=TARGET, config=config, qps=qps, p95_ms=5, created_at=created_at
    )


def test_the_latest_is_the_last_that_recommendations_lists(store: Store) -> None:
    assert store.latest_recommendation(TARGET, "a") is None
    # Out of order, a tie in created_at that the later id breaks, another target.
    _store(store, "a", T0 + 60, 2.0)
    _store(store, "a", T0, 1.0)
    _store(store, "b", T0, 3.0)
    tied = _store(store, "b", T0, 4.0)
    config = model_config("a", batching=False)
    store_recommendation(store, target="other", config=config, qps=9, p95_ms=5, created_at=T0 + 99)

    for model in ("a", "b"):
        latest = store.latest_recommendation(TARGET, model)
        assert latest is not None
        assert latest == store.recommendations(target=TARGET, model=model)[-1]
    b = store.latest_recommendation(TARGET, "b")
    assert b is not None and b.id == tied and b.recommendation.current.qps == 4.0
    assert store.latest_recommendation(TARGET, "c") is None


def test_pages_and_apply_read_no_history(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a long history stored, the recommendations page, the model page and
    ``apply`` show the latest of each model without listing the history."""
    for i in range(50):
        for model in ("a", "b"):
            _store(store, model, T0 + 60 * i, float(i))
    expected = {m: store.recommendations(target=TARGET, model=m)[-1] for m in ("a", "b")}

    def history(*args: object, **kwargs: object) -> list[StoredRecommendation]:
        raise AssertionError("the whole history of recommendations was read")

    monkeypatch.setattr(store, "recommendations", history)
    views, error = DashboardQueries(store).recommendations()
    assert error is None
    assert sorted((v.stored.model, v.stored.id) for v in views) == sorted(
        (m, r.id) for m, r in expected.items()
    )
    for model, latest in expected.items():
        view = latest_recommendation(store, TARGET, model)
        assert view is not None and view.stored.id == latest.id
        assert stored_recommendation(store, TARGET, model) == (latest.id, latest.recommendation)
