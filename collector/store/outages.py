"""Store outages as the collector saw them: how long the store could not take its
writes, how many it held in memory meanwhile, wrote later and dropped over the bound
(``collector.store.buffer``). One row per outage, written once the store is back."""

from __future__ import annotations

from sqlalchemy import Index, insert, select
from sqlalchemy.orm import Mapped, mapped_column

from collector.store.engine import Database
from collector.store.mapping import columns, record_from, record_values
from collector.store.rows import StoreOutage
from collector.store.schema import ID, Base

__all__ = ["OutagesMixin", "StoreOutageRow"]


class StoreOutageRow(Base):
    __tablename__ = "store_outages"
    __table_args__ = (Index(None, "ended_at"),)

    id: Mapped[int] = mapped_column(ID, primary_key=True)
    started_at: Mapped[float]
    ended_at: Mapped[float]
    held: Mapped[int]
    written: Mapped[int]
    dropped: Mapped[int]
    reason: Mapped[str]


class OutagesMixin(Database):
    """``Store`` methods about the store's own outages."""

    def record_store_outage(self, outage: StoreOutage) -> None:
        """Keep one outage the collector lived through (once the store is back)."""
        with self._write() as session:
            session.execute(insert(StoreOutageRow), [record_values(outage)])

    def store_outages(self, *, since: float | None = None) -> list[StoreOutage]:
        """The outages that ended at or after ``since`` (every one when None), oldest
        first."""
        stmt = select(*columns(StoreOutageRow)).order_by(StoreOutageRow.ended_at)
        if since is not None:
            stmt = stmt.where(StoreOutageRow.ended_at >= since)
        with self._read() as session:
            return [record_from(StoreOutage, r) for r in session.execute(stmt).mappings()]
