"""Fixtures the store's unit tests share: each test on SQLite and on PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from collector.store import Store


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh store URL: a SQLite file, or a fresh PostgreSQL database (``pg_url``).
    A test module may define its own ``db_url`` instead (e.g. SQLite only)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'batchscope.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    yield s
    s.close()
