"""What the dashboard can change: apply a stored recommendation to a live Triton, and
silence alerts.

Apply runs ``collector.apply.apply_recommendation`` (load API, before/after windows,
rollback on a regression, the outcome recorded in the store) in a background thread,
because verification takes two windows; the page polls ``ConfigActions.job``. Only
targets the dashboard was given (``--triton`` or the settings file) can be changed:
the store knows a target's name, not where it lives. ``AlertSilences`` adds and ends
silences in the store (the ones ``batchscope alerts silence`` manages). The caller
checks the role; this module checks everything else.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any

import requests
from sqlalchemy.exc import SQLAlchemyError

from alerts.rules import RULE_NAMES
from collector.apply import (
    ApplyInterrupted,
    ApplyRefused,
    ApplyResult,
    TargetUnreachable,
    apply_recommendation,
    check_live_changes,
    stored_recommendation,
)
from collector.config import ApplySettings, TargetSettings
from collector.errors import BatchscopeError, ConfigError
from collector.records import Recommendation
from collector.settings_fields import parse_duration_s
from collector.store import Store
from collector.store.alerts import Silence

__all__ = ["MAX_SILENCE_S", "ActionRefused", "AlertSilences", "ApplyJob", "ConfigActions"]

log = logging.getLogger("batchscope.dashboard")

# Probe results are kept this long: a server's control mode changes only on restart.
_PROBE_TTL_S = 60.0
#: The longest silence the dashboard sets: a longer one is a rule to switch off in the
#: settings (``alerts.rules.<rule>.enabled``), and a typo such as 200d is caught.
MAX_SILENCE_S = 30 * 86400.0
_MAX_COMMENT_CHARS = 500


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
    result: ApplyResult | None = None  # once verified

    @property
    def done(self) -> bool:
        return self.state != "running"

    @property
    def before_qps(self) -> float | None:
        return self.result.before.rates.requests_per_s if self.result else None

    @property
    def after_qps(self) -> float | None:
        after = self.result.after if self.result else None
        return after.rates.requests_per_s if after else None

    @property
    def before_p95_ms(self) -> float | None:
        return self.result.before.p95_ms if self.result else None

    @property
    def after_p95_ms(self) -> float | None:
        after = self.result.after if self.result else None
        return after.p95_ms if after else None


class ConfigActions:
    """Applies recommendations from ``store`` to the ``targets`` it knows, through
    ``http`` (default: a session of its own, closed by ``close()``), with the windows
    and thresholds of ``apply``."""

    def __init__(
        self,
        store: Store,
        targets: Sequence[TargetSettings],
        *,
        http: requests.Session | None = None,
        apply: ApplySettings | None = None,
    ) -> None:
        self._store = store
        self._targets = {t.name: t for t in targets}
        self._own_http = http is None
        if http is None:
            http = requests.Session()
            http.trust_env = False  # talk to the server the settings name, not a proxy
        self._http = http
        self._apply = apply or ApplySettings()
        self._jobs: dict[str, ApplyJob] = {}
        self._probes: dict[str, tuple[float, str | None]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()  # close() stops running applies (they roll back)
        self._threads: list[threading.Thread] = []

    def knows(self, target: str) -> bool:
        return target in self._targets

    def live_change_refusal(self, target: str) -> str | None:
        """Why ``target`` cannot take a config change now (unknown, unreachable, not in
        explicit model control mode), or None when it can. Cached for a minute."""
        settings = self._targets.get(target)
        if settings is None:
            return (
                f"this dashboard does not know where {target!r} is: start it with "
                f"--triton URL for that server to apply changes"
            )
        now = time.monotonic()
        with self._lock:
            cached = self._probes.get(target)
            if cached is not None and now - cached[0] < _PROBE_TTL_S:
                return cached[1]
        try:
            check_live_changes(self._http, settings.url)
            refusal = None
        except (ApplyRefused, TargetUnreachable) as exc:
            refusal = str(exc)
        with self._lock:
            self._probes[target] = (now, refusal)
        return refusal

    def live_changes_allowed(self, target: str) -> bool:
        return self.live_change_refusal(target) is None

    def job(self, job_id: str) -> ApplyJob | None:
        with self._lock:
            return self._jobs.get(job_id)

    def start_apply(self, target: str, model: str, recommendation_id: int) -> ApplyJob:
        """Start applying recommendation ``recommendation_id``; raises ``ActionRefused``
        when the target is unknown, unreachable or does not allow live changes, has a
        change of this model already running, or the recommendation changes nothing."""
        settings = self._targets.get(target)
        if settings is None:
            raise ActionRefused(str(self.live_change_refusal(target)))
        with self._lock:
            if any(
                j.target == target and j.model == model and not j.done for j in self._jobs.values()
            ):
                raise ActionRefused(f"a change of {model!r} on {target!r} is already running")
        refusal = self.live_change_refusal(target)
        if refusal is not None:
            raise ActionRefused(refusal)
        found = stored_recommendation(self._store, target, model, recommendation_id)
        if found is None:
            raise ActionRefused(f"no recommendation {recommendation_id} for {model!r}")
        _, rec = found
        if not rec.changes:
            raise ActionRefused("this recommendation keeps the current config: nothing to apply")
        job = ApplyJob(
            id=uuid.uuid4().hex,
            target=target,
            model=model,
            recommendation_id=recommendation_id,
            started_at=time.time(),
        )
        with self._lock:
            self._jobs[job.id] = job
        thread = threading.Thread(
            target=self._run, args=(job.id, settings, rec), name=f"apply-{model}", daemon=True
        )
        self._threads.append(thread)
        thread.start()
        return job

    def close(self) -> None:
        """Stop running applies and wait for their rollback (a change not yet verified
        is not kept), then close the session this object opened. The caller closes the
        store afterwards."""
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=self._apply.load_timeout_s)
        if self._own_http:
            self._http.close()

    def _update(self, job_id: str, **changes: Any) -> None:
        with self._lock:
            self._jobs[job_id] = replace(self._jobs[job_id], **changes)

    def _say(self, job_id: str, message: str) -> None:
        with self._lock:
            job = self._jobs[job_id]
            self._jobs[job_id] = replace(job, messages=[*job.messages, message])

    def _run(self, job_id: str, settings: TargetSettings, rec: Recommendation) -> None:
        job = self.job(job_id)
        assert job is not None
        try:
            result = apply_recommendation(
                settings,
                rec,
                store=self._store,
                http=self._http,
                settings=self._apply,
                recommendation_id=job.recommendation_id,
                wait=self._stop.wait,
                say=lambda m: self._say(job_id, m),
            )
            self._update(
                job_id,
                state="rolled_back" if result.rolled_back else "kept",
                verdict=result.verdict.summary,
                finished_at=time.time(),
                result=result,
            )
        except (ApplyRefused, ApplyInterrupted) as exc:  # nothing was changed
            self._update(job_id, state="refused", verdict=str(exc), finished_at=time.time())
        except Exception as exc:  # the page must learn the outcome, whatever it was
            if not isinstance(exc, TargetUnreachable):
                log.exception("apply of %s failed", rec)
            self._update(job_id, state="failed", verdict=f"failed: {exc}", finished_at=time.time())


class AlertSilences:
    """Silences set from the dashboard, in ``store``: ``add`` one for a duration from
    now, ``end`` one now. Everything given is checked here and refused with
    ``ActionRefused`` (nothing stored); the caller checks the role."""

    def __init__(self, store: Store, *, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    def add(
        self,
        *,
        rule: str | None,
        target: str | None,
        subject: str | None,
        duration: str,
        comment: str = "",
        created_by: str = "",
    ) -> Silence:
        """Silence alerts of ``rule`` on ``target`` for ``subject`` (a model or device;
        ``None`` matches any, but not all three) for ``duration`` (``90s``, ``30m``,
        ``2h``, ``1d``) from now."""
        if rule is not None and rule not in RULE_NAMES:
            raise ActionRefused(f"unknown rule {rule!r}; known: {', '.join(RULE_NAMES)}")
        if rule is None and target is None and subject is None:
            raise ActionRefused("choose a rule, a target or a model: a silence of everything")
        try:
            seconds = parse_duration_s(duration)
        except ConfigError:
            raise ActionRefused(
                f"the duration must be such as 90s, 30m, 2h or 1d; got {duration!r}"
            ) from None
        if seconds > MAX_SILENCE_S:
            raise ActionRefused("a silence lasts at most 30 days; switch the rule off instead")
        if len(comment) > _MAX_COMMENT_CHARS:
            raise ActionRefused(f"the comment is longer than {_MAX_COMMENT_CHARS} characters")
        now = self._clock()
        with _store_errors_refused():
            return self._store.add_silence(
                starts_at=now,
                ends_at=now + seconds,
                rule=rule,
                target=target,
                subject=subject,
                created_by=created_by,
                comment=comment,
            )

    def end(self, silence_id: int) -> None:
        """End silence ``silence_id`` now; refused when it is not in force."""
        now = self._clock()
        with _store_errors_refused():
            if not any(s.id == silence_id for s in self._store.silences(active_at=now)):
                raise ActionRefused(f"silence #{silence_id} is not in force")
            self._store.end_silence(silence_id, now)


@contextmanager
def _store_errors_refused() -> Iterator[None]:
    """A store that cannot be read or written refuses the action in one line (the
    page shows it) instead of failing the callback."""
    try:
        yield
    except (ConfigError, SQLAlchemyError, OSError) as exc:
        log.warning("dashboard: a silence could not be stored: %s", exc, exc_info=True)
        text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        raise ActionRefused(
            f"the store could not be written: {(text[0] if text else type(exc).__name__)[:200]}"
        ) from None
