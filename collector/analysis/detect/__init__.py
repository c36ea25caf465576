"""Detectors: idle capacity, queue-delay saturation, and batching left on the table.

Three layers, each testable on its own, each a module of this package:

1. ``windows.read_window(store, settings, now=...)`` reads the last ``window_s``
   seconds from the store (through its methods; no SQL here) and reduces them to
   typed windows per subject: a ``ModelWindow`` per (target, model), a
   ``DeviceWindow`` per GPU or MIG instance.
2. The detectors (module ``detectors``) ``idle_capacity``, ``queue_saturation``,
   ``batching_off`` and ``batch_below_preferred`` are pure functions
   ``(DetectionWindow, DetectorSettings) -> list[Finding]``: a *candidate* finding
   says "the condition holds in this window", with the numbers behind it in
   ``evidence`` (units in the keys).
3. ``hysteresis.run_detectors(store, settings, now=...)`` evaluates them all once and
   applies hysteresis against the store: a condition opens a finding only after holding for
   ``sustain`` consecutive evaluations, refreshes it while it holds, and resolves it
   after ``clear_after`` consecutive clear evaluations, so a finding does not flap.

Severity rules (``Finding.severity``):

* ``idle_capacity`` — ``warning`` when the subject serves traffic (capacity is paid
  for and not used under load), ``info`` when it has none or its traffic is unknown
  (a consolidation opportunity, not a problem).
* ``queue_saturation`` — ``critical`` when queue share exceeds
  ``queue_share_critical`` or the queue policy rejects requests (clients are already
  failing or waiting far longer than compute takes); otherwise ``warning``.
* ``batching_off`` — ``warning``; ``critical`` when queue share also exceeds
  ``queue_share_critical``.
* ``batch_below_preferred`` — ``info``; ``warning`` when queue share also exceeds
  ``queue_share`` (requests wait, yet batches stay small).

Hysteresis state (the per-(kind, target, subject) streak counters) lives in the store
(``Store.detector_streaks``), not in the caller: a restarted collector, or a one-shot
``batchscope`` command, continues the count instead of starting over, and the
scheduler only has to call ``run_detectors`` once per analysis tick.

Thresholds and hysteresis settings are ``settings.DetectorSettings``.
"""

from __future__ import annotations

from collector.analysis.detect.detectors import (
    BATCH_BELOW_PREFERRED,
    BATCHING_OFF,
    DETECTOR_KINDS,
    IDLE_CAPACITY,
    QUEUE_SATURATION,
    batch_below_preferred,
    batching_off,
    detect,
    evaluated_keys,
    idle_capacity,
    queue_saturation,
)
from collector.analysis.detect.hysteresis import detector_job, run_detectors
from collector.analysis.detect.settings import DetectorSettings, detector_settings
from collector.analysis.detect.windows import (
    DetectionWindow,
    DeviceWindow,
    ModelWindow,
    read_window,
)

__all__ = [
    "BATCHING_OFF",
    "BATCH_BELOW_PREFERRED",
    "DETECTOR_KINDS",
    "IDLE_CAPACITY",
    "QUEUE_SATURATION",
    "DetectionWindow",
    "DetectorSettings",
    "DeviceWindow",
    "ModelWindow",
    "batch_below_preferred",
    "batching_off",
    "detect",
    "detector_job",
    "detector_settings",
    "evaluated_keys",
    "idle_capacity",
    "queue_saturation",
    "read_window",
    "run_detectors",
]
