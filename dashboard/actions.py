"""What the dashboard can change: apply a stored recommendation to a live Triton.

The one action there is runs ``collector.apply.apply_recommendation`` (load API,
before/after windows, rollback on a regression, a ``config_applied`` finding) in a
background thread, because verification takes two windows; the page polls
``ConfigActions.job``. Only targets the dashboard was given (``--triton`` or the
settings file) can be changed: the store knows a target's name, not where it lives.
The caller checks the role; this module checks everything about the target.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import requests

from collector.analysis.recommend import recommendation_from_dict
from collector.apply import ApplyRefused, ApplyResult, apply_recommendation
from collector.config import TargetSettings
from collector.errors import BatchscopeError
from collector.records import Recommendation
from collector.store import Store

__all__ = ["ActionRefused", "ApplyJob", "ConfigActions"]

log = logging.getLogger("batchscope.dashboard")

# Probe results are kept this long: a server's control mode changes only on restart.
_PROBE_TTL_S = 60.0


class ActionRefused(BatchscopeError):
    """The action cannot start; nothing was changed. The message says why."""


@dataclass(frozen=True)
class ApplyJob:
    """One Apply from the UI. ``state``: running, kept, rolled_back, refused, failed."""

    id: str
    target: str
    model: str
    recommendation_id: int
    started_at: float
    state: str = "running"
    messages: list[str] = field(default_factory=list)
    verdict: str | None = None
    finished_at: float | None = None
    before_qps: float | None = None
    after_qps: float | None = None
    before_p95_ms: float | None = None
    after_p95_ms: float | None = None

    @property
    def done(self) -> bool:
        return self.state != "running"


class ConfigActions:
    """Applies recommendations to the ``targets`` it knows, over the store at
    ``store_url``, verifying each for ``verify_s`` seconds before and after."""

    def __init__(self, targets: Sequence[TargetSettings], store_url: str, *,
                 verify_s: float = 30.0,
                 apply: Callable[..., ApplyResult] = apply_recommendation) -> None:
        self._targets = {t.name: t for t in targets}
        self._store_url = store_url
        self._verify_s = verify_s
        self._apply = apply
        self._jobs: dict[str, ApplyJob] = {}
        self._probes: dict[str, tuple[float, bool]] = {}
        self._lock = threading.Lock()

    def knows(self, target: str) -> bool:
        return target in self._targets

    def live_changes_allowed(self, target: str) -> bool:
        """Whether ``target`` takes config changes through the load API (explicit
        model control). Probed with an unload of a model name that cannot exist:
        a server in another mode refuses any load/unload request."""
        settings = self._targets.get(target)
        if settings is None:
            return False
        now = time.monotonic()
        with self._lock:
            cached = self._probes.get(target)
            if cached is not None and now - cached[0] < _PROBE_TTL_S:
                return cached[1]
        allowed = _explicit_mode(settings.url)
        with self._lock:
            self._probes[target] = (now, allowed)
        return allowed

    def job(self, job_id: str) -> ApplyJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def start_apply(self, target: str, model: str, recommendation_id: int) -> ApplyJob:
        """Start applying recommendation ``recommendation_id``; raises ``ActionRefused``
        when the target is unknown, does not allow live changes, has a change of this
        model already running, or the recommendation changes nothing."""
        settings = self._targets.get(target)
        if settings is None:
            raise ActionRefused(f"this dashboard does not know where {target!r} is: start it "
                                f"with --triton URL for that server to apply changes")
        with self._lock:
            if any(j.target == target and j.model == model and not j.done
                   for j in self._jobs.values()):
                raise ActionRefused(f"a change of {model!r} on {target!r} is already running")
        if not self.live_changes_allowed(target):
            raise ActionRefused(f"{target} does not allow live config changes: start "
                                f"tritonserver with --model-control-mode=explicit")
        store = Store(self._store_url)
        try:
            stored = next((r for r in store.recommendations(target=target, model=model)
                           if r.id == recommendation_id), None)
        finally:
            store.close()
        if stored is None:
            raise ActionRefused(f"no recommendation {recommendation_id} for {model!r}")
        rec = recommendation_from_dict(dict(stored.change))
        if not rec.changes:
            raise ActionRefused("this recommendation keeps the current config: nothing to apply")
        job = ApplyJob(id=uuid.uuid4().hex, target=target, model=model,
                       recommendation_id=recommendation_id, started_at=time.time())
        with self._lock:
            self._jobs[job.id] = job
        threading.Thread(target=self._run, args=(job.id, settings, rec),
                         name=f"apply-{model}", daemon=True).start()
        return job

    def _update(self, job_id: str, **changes: object) -> None:
        with self._lock:
            self._jobs[job_id] = replace(self._jobs[job_id], **changes)  # type: ignore[arg-type]

    def _say(self, job_id: str, message: str) -> None:
        with self._lock:
            job = self._jobs[job_id]
            self._jobs[job_id] = replace(job, messages=[*job.messages, message])

    def _run(self, job_id: str, settings: TargetSettings, rec: Recommendation) -> None:
        store = Store(self._store_url)
        try:
            result = self._apply(settings, rec, verify_s=self._verify_s, store=store,
                                 say=lambda m: self._say(job_id, m))
            job = self.job(job_id)
            assert job is not None
            status = "rolled_back" if result.rolled_back else "applied"
            store.record_recommendation_outcome(
                job.recommendation_id, status=status, applied_at=time.time(),
                verification={"verdict": result.verdict,
                              "before_qps": result.before.qps,
                              "after_qps": result.after.qps if result.after else None,
                              "before_p95_ms": result.before.p95_ms,
                              "after_p95_ms": result.after.p95_ms if result.after else None})
            self._update(job_id, state="rolled_back" if result.rolled_back else "kept",
                         verdict=result.verdict, finished_at=time.time(),
                         before_qps=result.before.qps,
                         after_qps=result.after.qps if result.after else None,
                         before_p95_ms=result.before.p95_ms,
                         after_p95_ms=result.after.p95_ms if result.after else None)
        except ApplyRefused as exc:
            self._update(job_id, state="refused", verdict=str(exc), finished_at=time.time())
        except Exception as exc:  # the page must learn the outcome, whatever it was
            log.exception("apply of %s failed", rec)
            self._update(job_id, state="failed", verdict=f"failed: {exc}",
                         finished_at=time.time())
        finally:
            store.close()


def _explicit_mode(url: str) -> bool:
    with requests.Session() as session:
        session.trust_env = False  # as collector.apply: talk to the server, not a proxy
        try:
            response = session.post(f"{url}/v2/repository/models/"
                                    f"batchscope-probe-{uuid.uuid4().hex[:8]}/unload",
                                    timeout=5.0)
        except requests.RequestException:
            return False
    if response.ok:
        return True
    text = response.text.lower()
    return not ("not allowed" in text or "polling is enabled" in text)
