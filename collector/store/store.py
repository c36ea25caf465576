"""``Store``: the one place batchscope speaks SQL.

Every public method opens its own session and commits (or rolls back) before it
returns, so callers never hold a transaction and never see an ORM object: writes take
records from ``collector.records``, reads return those records wrapped in the rows of
``collector.store.rows``. Database errors other than a bad URL propagate as
``sqlalchemy.exc.SQLAlchemyError``: the scheduler's wrapper owns failure, and a failed
write leaves the store as it was (one transaction per call).

The methods live with their concern, one file each:

* ``engine``: the engine, sessions, and the schema's migrations on first use;
* ``targets``: up/down bookkeeping, transitions, host facts;
* ``samples``: raw model, server, device and process samples;
* ``rollups``: rollups and retention;
* ``findings``: findings, detector streaks, recommendations;
* ``alerts``: alert states, silences, the notification outbox;
* ``outages``: the store's own outages, as the collector's write buffer saw them.
"""

from __future__ import annotations

from collector.store.alerts import AlertsMixin
from collector.store.findings import FindingsMixin
from collector.store.outages import OutagesMixin
from collector.store.rollups import RollupsMixin
from collector.store.samples import SamplesMixin
from collector.store.windows import WindowsMixin

__all__ = ["Store"]


class Store(SamplesMixin, RollupsMixin, FindingsMixin, AlertsMixin, WindowsMixin, OutagesMixin):
    """Typed storage of everything batchscope collects and concludes; see
    ``collector.store.engine.Database`` for the URL and when the database is opened."""

    def __repr__(self) -> str:
        return f"Store({self.url!r})"

    def __enter__(self) -> Store:
        return self
