"""The store: the only part of batchscope that speaks SQL.

``Store`` writes the typed records of ``collector.records`` and reads them back,
wrapped in the rows of ``collector.store.rows``; ``collector.store.schema`` is the
SQLAlchemy schema behind it, for this package's use only; its migrations live in
``collector/store/migrations`` and run when a store is first used.
"""

from collector.analysis.health import HOST_KIND, PRIMARY_SOURCE, TRITON_KIND
from collector.store.rows import (
    RECOMMENDATION_OUTCOMES,
    RECOMMENDATION_STATUSES,
    DetectorStreak,
    DeviceRollup,
    ModelRollup,
    ProcessBucket,
    RetentionReport,
    StoredDevice,
    StoredFinding,
    StoredModelConfig,
    StoredProcess,
    StoredRecommendation,
    StoredServer,
    TargetState,
    TargetTransition,
)
from collector.store.store import Store

__all__ = [
    "RECOMMENDATION_OUTCOMES",
    "RECOMMENDATION_STATUSES",
    "HOST_KIND",
    "PRIMARY_SOURCE",
    "TRITON_KIND",
    "DetectorStreak",
    "DeviceRollup",
    "ModelRollup",
    "ProcessBucket",
    "RetentionReport",
    "Store",
    "StoredDevice",
    "StoredFinding",
    "StoredModelConfig",
    "StoredProcess",
    "StoredRecommendation",
    "StoredServer",
    "TargetState",
    "TargetTransition",
]
