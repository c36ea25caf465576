"""The alerts inside a process that analyses: ``batchscope serve``, ``collect`` and the
exporter evaluate the rules after each analysis pass and deliver the outbox, as
``batchscope alerts run`` does on its own.

``AlertsInProcess(store, settings)`` holds both halves:

* ``jobs``: the scheduler analyses to run after the detectors (and the recommender,
  so that a firing alert carries this pass's recommendation): the rule evaluation
  (``alerts.engine.alert_job``, which evaluates only while this process holds the
  store's evaluator lease, so two processes on one store never notify twice) and,
  once an hour, forgetting what is over for longer than ``alerts.keep_s``;
* ``start()`` / ``stop()``: the delivery thread (``alerts.delivery.DeliveryWorker``),
  run only when the settings name a receiver: without one no notification is ever
  put in the outbox, and the thread would only ask the store every second for none.
  ``stop()`` also hands the evaluator lease back, so a restarted process (or an
  ``alerts run`` standing by) evaluates at its next pass, not when the lease runs out.

The states are evaluated with or without receivers: the UI, ``batchscope alerts`` and
the exporter's ``batchscope_alert`` show them either way.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from alerts.delivery import DeliveryWorker
from alerts.engine import alert_job, new_evaluator_id
from collector.config import Settings
from collector.store import Store

__all__ = ["PRUNE_EVERY_S", "AlertsInProcess", "prune_job"]

log = logging.getLogger("batchscope.alerts")

#: How often what is older than ``alerts.keep_s`` is forgotten.
PRUNE_EVERY_S = 3600.0

AnalysisJob = Callable[[Store, float], object]


def prune_job(keep_s: float, every_s: float = PRUNE_EVERY_S) -> AnalysisJob:
    """A scheduler analysis that forgets, at most once per ``every_s``, the alerts'
    rows that are over and older than ``keep_s`` (``Store.prune_alerts``); the first
    call prunes. Returns how many rows went (``None`` when not due)."""
    last = [-float("inf")]

    def prune_alerts_job(store: Store, now: float) -> int | None:
        if now - last[0] < every_s:
            return None
        last[0] = now
        return store.prune_alerts(now - keep_s)

    return prune_alerts_job


class AlertsInProcess:
    """The rule evaluation (``jobs``, for ``CollectorService(analyses=...)``) and the
    outbox's delivery (``start()``/``stop()``, or ``with``) of one process's store."""

    def __init__(self, store: Store, settings: Settings) -> None:
        self._store = store
        self.holder = new_evaluator_id()
        self.jobs: list[AnalysisJob] = [
            alert_job(settings, holder=self.holder),
            prune_job(settings.alerts.keep_s),
        ]
        self.receivers = tuple(r.name for r in settings.alerts.receivers)
        self.delivery = (
            DeliveryWorker(store, settings.alerts) if settings.alerts.receivers else None
        )

    def start(self) -> None:
        if self.delivery is not None:
            self.delivery.start()
            log.info("delivering alerts to %s", ", ".join(self.receivers))

    def stop(self) -> None:
        """Stop delivering and hand the evaluator lease back; call it once the
        analyses have stopped (what is left pending stays in the outbox)."""
        if self.delivery is not None:
            self.delivery.stop()
        try:
            self._store.release_alert_evaluation(self.holder)
        except Exception:  # the store is gone: the lease runs out on its own
            log.exception("handing back the alert evaluator lease failed")

    def __enter__(self) -> AlertsInProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
