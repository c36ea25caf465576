"""The store: the only part of batchscope that speaks SQL.

``Store`` writes the typed records of ``collector.records`` and reads them back,
wrapped in the rows of ``collector.store.rows``; ``collector.store.schema`` is the
SQLAlchemy schema behind it, for this package's use only; its migrations live in
``collector/store/migrations`` and run when a store is first used.
"""

from collector.store import rows
from collector.store.rows import *  # noqa: F403 (the rows, as listed in rows.__all__)
from collector.store.store import Store

__all__ = ["Store"]
__all__ += rows.__all__
