"""The collector: every source scraped on its interval, plus the analyses, rollup and
retention, and the targets of file_sd files kept up to date.

Every scrape runs through ``CollectorService.run_source`` (node_exporter's
``execute()``): it times the call, catches every failure, records up/down and the
``error_kind`` in the store, turns counters into rates and writes the records. The
scrapes run on a bounded pool (``collector.scrape_loop``, ``scrape_workers`` threads
however many targets there are); a source whose previous scrape still runs skips
that tick, so a slow or dead target never delays another, and a failing one is
retried with exponential backoff up to ``backoff_max_s``.

Every write goes through a ``WriteBuffer`` (``collector.store.buffer``): while the
store cannot take writes (locked, disk full, database restarting), the scrapes' writes
are held in memory within ``store_buffer_max_writes`` and ``store_buffer_max_bytes``
and written in order once it is back; a store outage is not a scrape's failure.

With ``shard: i/n`` the collector scrapes only the targets whose CRC-32 of the name
mod n is i (``collector.discovery.in_shard``), and only shard 0 runs the store-wide
jobs (analyses, rollup, retention): n collectors over one store cover each target
once and do the store's work once.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from collector import records
from collector.analysis.health import HOST_KIND, TRITON_KIND, stale_after_s
from collector.analysis.rates import CounterTrack, rates_between
from collector.config import Settings, TargetSettings
from collector.discovery import (
    DISCOVERY_SETTINGS,
    FileSd,
    TargetFinder,
    in_shard,
    merge_targets,
)
from collector.errors import CollectError
from collector.scrape_loop import LoopCounts, PeriodicJob, ScrapeLoop
from collector.sources import SOURCES
from collector.sources.base import Record, Source
from collector.store import ScrapeRecord, Store, StoreOutage
from collector.store.buffer import BufferCounts, WriteBuffer, payload_bytes

__all__ = [
    "CollectorService",
    "SourceHealth",
    "build_sources",
    "collector_jobs",
    "store_pool_size",
    "target_sources",
]

log = logging.getLogger("batchscope.collector")
# Waiting at shutdown: for the scrapes in flight (past their own timeout), and for an
# analysis or housekeeping run in progress.
_SCRAPE_GRACE_S = 2.0
_SLOW_JOB_WAIT_S = 60.0


def target_sources(settings: Settings, target: TargetSettings) -> list[Source]:
    """The per-target sources of ``target`` (``triton``, ``host`` where enabled)."""
    return [
        SOURCES[name].factory(settings, target)
        for name in settings.sources
        if SOURCES[name].per_target
    ]


def build_sources(settings: Settings) -> list[Source]:
    """One source per enabled per-target source and target of this shard (the
    settings' own targets; file_sd's are the service's), one per host source."""
    sources: list[Source] = []
    for name in settings.sources:
        spec = SOURCES[name]
        if spec.per_target:
            sources.extend(
                spec.factory(settings, target)
                for target in settings.targets
                if in_shard(target.name, settings.shard_of)
            )
        else:
            sources.append(spec.factory(settings, None))
    return sources


def _runs_store_jobs(settings: Settings) -> bool:
    shard = settings.shard_of
    return shard is None or shard[0] == 0


def collector_jobs(settings: Settings, *, analyses: bool) -> list[str]:
    """The periodic jobs a collector with ``settings`` runs beside its scrapes, each on
    a thread of its own: the analyses (when it has some) and housekeeping where the
    store-wide jobs run (``CollectorService.runs_store_jobs``), the file_sd refresh
    where file_sd files are read."""
    jobs = []
    if _runs_store_jobs(settings):
        jobs += ["analysis"] if analyses else []
        jobs.append("housekeeping")
    jobs += [setting for setting in DISCOVERY_SETTINGS if getattr(settings, setting)]
    return jobs


def target_finders(settings: Settings) -> list[TargetFinder]:
    """Where this collector's discovered targets come from: the file_sd files, then the
    DNS SRV names (a target both list is file_sd's)."""
    finders: list[TargetFinder] = []
    if settings.file_sd:
        finders.append(FileSd(settings.file_sd))
    if settings.dns_sd:
        from collector.dns_sd import DnsSd  # dnspython, only where SRV names are looked up

        finders.append(
            DnsSd(
                settings.dns_sd,
                nameserver=settings.dns_sd_nameserver,
                metrics_port=settings.dns_sd_metrics_port_number,
            )
        )
    return finders


def store_pool_size(settings: Settings, *, analyses: bool = True, other_threads: int = 0) -> int:
    """How many connections the store of a collector with ``settings`` keeps: one for
    each thread that may use it at once (every scrape worker, every job of
    ``collector_jobs``, and the caller's ``other_threads``: a UI's, an exporter's), so
    no scrape's write waits for a connection."""
    return (
        settings.scrape_workers + len(collector_jobs(settings, analyses=analyses)) + other_threads
    )


@dataclass
class SourceHealth:
    attempts: int = 0
    consecutive_failures: int = 0
    next_attempt_at: float = 0.0
    last_error_kind: str | None = None


class CollectorService:
    """Runs the sources on a schedule and writes what they return to the store."""

    def __init__(
        self,
        settings: Settings,
        store: Store,
        sources: Sequence[Source],
        *,
        analyses: Sequence[Callable[[Store, float], object]] = (),
        clock: Callable[[], float] = time.time,
        source_factory: Callable[[TargetSettings], list[Source]] | None = None,
    ) -> None:
        """``sources`` run from start; the targets of ``settings.file_sd`` (read now: a
        ``ConfigError`` when a file is invalid) and ``settings.dns_sd`` (looked up now)
        get theirs from ``source_factory`` (default: ``target_sources``) as they come
        and go."""
        self.settings = settings
        self.store = store
        self.sources = list(sources)
        self._source_factory = source_factory or (lambda t: target_sources(settings, t))
        # Where each target is scraped: the settings' own, then discovered ones as they come.
        self._endpoints: dict[str, TargetSettings] = {t.name: t for t in settings.targets}
        self._discovered: dict[str, tuple[TargetSettings, list[Source]]] = {}
        self._finders = target_finders(settings)
        # One refresh at a time: the file_sd and dns_sd jobs each make the whole list.
        self._refresh_lock = threading.Lock()
        self._targets_lock = threading.Lock()
        self._loop: ScrapeLoop | None = None
        self._stopped = False  # shut down: no target starts any more
        self._jobs: list[PeriodicJob] = []
        # Run every ``analysis_every_s`` over what the store holds (detectors, ...).
        self.analyses = list(analyses)
        self._clock = clock
        self._health: dict[tuple[str, str], SourceHealth] = {}
        # The previous counter sample of each series, for per-scrape rates.
        self._previous: dict[tuple[str, str, str], records.ModelSample] = {}
        # What the rates remember of each series across its pairs (``judge_pair``).
        self._tracks: dict[tuple[str, str, str], CounterTrack] = {}
        # Fleet targets' scrape intervals (their samples' stale horizon), and when
        # stale samples are next looked for (``forget_stale``).
        self._intervals: dict[str, float] = {}
        # Each target's latest snapshot: when it came, and its collected_at.
        self._seen: dict[str, tuple[float, float]] = {}
        self._forget_at = 0.0
        # Sources of targets file_sd dropped or changed, until closed (by id).
        self._retired: dict[int, Source] = {}
        self._lock = threading.Lock()
        # The store's writes, held while it is out (see the module docstring).
        self._writes = WriteBuffer(
            max_writes=settings.store_buffer_max_writes,
            max_bytes=settings.store_buffer_max_bytes,
            on_outage=self._keep_outage,
        )
        if self._finders:
            for finder in self._finders:
                finder.load()
            self.update_targets(self._found())

    # ------------------------------------------------------------------ one scrape

    def run_source(self, source: Source) -> bool:
        """Collect once from ``source`` and store the result; never raises.
        Returns False when the attempt was skipped (backoff) or failed."""
        key = (source.name, source.target)
        health = self._health.setdefault(key, SourceHealth())
        started = self._clock()
        if started < health.next_attempt_at:
            return False
        kind = TRITON_KIND if SOURCES[source.name].per_target else HOST_KIND
        health.attempts += 1
        first_in_run = health.attempts == 1
        if first_in_run and kind == TRITON_KIND:
            self._record_endpoints(source.target)
        t0 = time.perf_counter()
        error_kind: str | None = None
        error: str | None = None
        recorded = False
        try:
            collected = source.collect()
            self._note_seen(collected, started)
            snapshot = _own_snapshot(source, kind, collected)
            if snapshot is None:
                self._persist(source.target, collected)
            else:
                # A Triton scrape's samples and its record: one transaction.
                rates = self._rates_for(snapshot)
                scrape = ScrapeRecord(
                    source.target, source.name, kind, started, time.perf_counter() - t0,
                    interval_s=self.settings.interval_s, first_in_run=first_in_run,
                )  # fmt: skip
                self._submit(
                    f"scrape of {source.target} at {started:.3f}",
                    self.store.write_scrape,
                    snapshot,
                    rates,
                    scrape,
                )
                recorded = True
        except CollectError as exc:
            error_kind, error = exc.error_kind, str(exc)
        except Exception as exc:  # a bug or a surprise must not stop the loop
            error_kind, error = "internal", f"{type(exc).__name__}: {exc}"
            log.exception("%s/%s: unexpected failure", source.name, source.target)
        duration = time.perf_counter() - t0
        if not recorded:
            self._record_scrape(source, kind, started, duration, error_kind, error, first_in_run)
        self._update_health(source, health, error_kind, error, started)
        if started >= self._forget_at:  # a look every stale horizon, for every source
            self._forget_at = started + stale_after_s(self.settings.interval_s)
            self.forget_stale(started)
        return error_kind is None

    def _record_scrape(
        self,
        source: Source,
        kind: str,
        started: float,
        duration: float,
        error_kind: str | None,
        error: str | None,
        first_in_run: bool,
    ) -> None:
        """Record a scrape that ``Store.write_scrape`` did not: a failed one, or one of
        a source that brings no snapshot of its own target (host, fleet mode)."""
        try:
            self._submit(
                f"{source.name} scrape record of {source.target} at {started:.3f}",
                self.store.record_scrape,
                source.target,
                source.name,
                kind=kind,
                started_at=started,
                duration_s=duration,
                error_kind=error_kind,
                error=error,
                interval_s=self.settings.interval_s,
                first_in_run=first_in_run,
                sized=(error,),
            )
        except Exception:
            log.exception("%s/%s: could not record the scrape result", source.name, source.target)

    def _record_endpoints(self, target: str) -> None:
        """Write down where ``target`` is scraped, once a run (see ``Store.record_endpoints``);
        a failure is logged, and the scrape goes on."""
        t = self._endpoints.get(target)
        if t is None:
            return
        try:
            self._submit(
                f"endpoints of {target}",
                self.store.record_endpoints,
                target,
                url=t.url,
                metrics_url=t.metrics_url,
                sized=(t,),
            )
        except Exception:
            log.exception("%s: could not record where it is scraped", target)

    def health(self, source: Source) -> SourceHealth:
        """The retry state of one source (a copy)."""
        return replace(self._health.get((source.name, source.target), SourceHealth()))

    def _update_health(
        self,
        source: Source,
        health: SourceHealth,
        error_kind: str | None,
        error: str | None,
        now: float,
    ) -> None:
        if error_kind is None:
            if health.consecutive_failures:
                log.info(
                    "%s/%s: back up after %d failed attempt(s)",
                    source.name,
                    source.target,
                    health.consecutive_failures,
                )
            health.consecutive_failures = 0
            health.next_attempt_at = 0.0
            health.last_error_kind = None
            return
        health.consecutive_failures += 1
        backoff = min(
            self.settings.interval_s * 2 ** (health.consecutive_failures - 1),
            self.settings.backoff_max_s,
        )
        health.next_attempt_at = now + backoff - self.settings.interval_s / 2
        if error_kind != health.last_error_kind:
            # Said once per kind of failure, not once per attempt.
            log.warning(
                "%s/%s: %s (retrying with backoff up to %.0f s)",
                source.name,
                source.target,
                error,
                self.settings.backoff_max_s,
            )
        health.last_error_kind = error_kind

    def _persist(self, target: str, collected: Sequence[Record]) -> None:
        now = self._clock()
        devices = [r for r in collected if isinstance(r, records.DeviceSample)]
        processes = [r for r in collected if isinstance(r, records.ProcessSample)]
        first_error: Exception | None = None
        for record in collected:
            try:
                self._write_record(target, record)
            except Exception as exc:  # the other records are still written
                log.warning("%s: could not write a %s: %s", target, type(record).__name__, exc)
                first_error = first_error or exc
        if devices:
            self._submit(
                f"device readings of {target}", self.store.write_devices, target, now, devices
            )
        if processes:
            self._submit(
                f"process readings of {target}", self.store.write_processes, target, now, processes
            )
        if first_error is not None:  # the scrape failed with it
            raise first_error

    def _submit(
        self,
        what: str,
        write: Callable[..., object],
        *args: object,
        sized: tuple[object, ...] | None = None,
        **kwargs: object,
    ) -> None:
        """``write(*args, **kwargs)`` through the write buffer, counted as the size of
        ``sized`` (default: ``args``), measured only if it is held."""
        self._writes.submit(
            functools.partial(write, *args, **kwargs),
            what=what,
            size=functools.partial(payload_bytes, *(args if sized is None else sized)),
        )

    def _write_record(self, target: str, record: Record) -> None:
        if isinstance(record, records.TritonSnapshot):
            # The per-scrape rates stored here are what every reader uses.
            rates = self._rates_for(record)
            what = f"snapshot of {record.target} at {record.collected_at:.3f}"
            self._submit(what, self.store.write_triton, record, rates)
        elif isinstance(record, records.HostFacts):
            self._submit(f"host facts of {target}", self.store.write_host_facts, target, record)
        elif isinstance(record, records.ScrapeHealth):  # fleet mode: Prometheus's `up`
            self._submit(
                f"scrape record of {record.target} at {record.scraped_at:.3f}",
                self.store.record_scrape, record.target, record.source, kind=TRITON_KIND,
                started_at=record.scraped_at, duration_s=record.duration_s,
                error_kind=None if record.up else "down", error=record.error,
                interval_s=record.interval_s, sized=(record,),
            )  # fmt: skip

    def _rates_for(
        self, snapshot: records.TritonSnapshot
    ) -> dict[tuple[str, str], records.ModelRates]:
        stats = {(s.model, s.version): s for s in snapshot.model_stats}
        instances = {c.model: c.instance_count for c in snapshot.model_configs}
        rates: dict[tuple[str, str], records.ModelRates] = {}
        with self._lock:
            for metrics in snapshot.model_metrics:
                series = (metrics.model, metrics.version)
                current = records.build_record(
                    records.ModelSample,
                    {
                        "target": snapshot.target,
                        "collected_at": snapshot.collected_at,
                        "metrics": metrics,
                        "stats": stats.get(series),
                        "rates": None,
                    },
                )
                key = (snapshot.target, *series)
                previous = self._previous.get(key)
                if previous is None:
                    self._tracks[key] = CounterTrack()
                elif current.collected_at > previous.collected_at:
                    rates[series] = rates_between(
                        previous,
                        current,
                        instance_count=instances.get(metrics.model),
                        # Made with the series' first sample, dropped with its last.
                        track=self._tracks[key],
                    )
                self._previous[key] = current
        return rates

    # ------------------------------------------------------------------ housekeeping

    def run_housekeeping(self) -> None:
        """Roll raw samples up into coarse buckets, then drop what retention allows."""
        retention = self.settings.retention
        now = self._clock()
        try:
            self.store.rollup(now, bucket_s=retention.rollup_bucket_s)
            self.store.apply_retention(
                now, raw_keep_s=retention.raw_keep_s, rollup_keep_s=retention.rollup_keep_s
            )
        except Exception:
            log.exception("housekeeping failed; raw samples are kept until the next run")

    def run_analyses(self) -> None:
        now = self._clock()
        for analysis in self.analyses:
            try:
                analysis(self.store, now)
            except Exception:
                log.exception(
                    "analysis %s failed; it runs again next time",
                    getattr(analysis, "__name__", analysis),
                )

    # ------------------------------------------------------------------ targets

    @property
    def targets(self) -> list[TargetSettings]:
        """The targets this collector scrapes now: its shard of the settings' own and
        of those the file_sd files and DNS SRV names list."""
        shard = self.settings.shard_of
        own = [t for t in self.settings.targets if in_shard(t.name, shard)]
        with self._targets_lock:
            return own + [t for t, _ in self._discovered.values()]

    def refresh_targets(self, setting: str | None = None) -> None:
        """Look at the file_sd files (a stat each when nothing changed) and the DNS SRV
        names again, or only those of ``setting`` ("file_sd", "dns_sd")."""
        with self._refresh_lock:
            changed = False
            for finder in self._finders:
                if setting in (None, finder.setting) and finder.refresh() is not None:
                    changed = True
            if changed:
                self.update_targets(self._found())

    def _found(self) -> list[TargetSettings]:
        """Every finder's targets, each name once (the first finder's wins)."""
        return merge_targets(finder.targets() for finder in self._finders)

    def update_targets(self, found: Sequence[TargetSettings]) -> None:
        """Make ``found`` (file_sd's and dns_sd's targets) the discovered targets: those of this
        shard not yet scraped start, those gone stop and their sources are closed. A
        target the settings name themselves keeps the settings' endpoints. A target
        whose sources cannot be made is logged and left out; the others change."""
        shard = self.settings.shard_of
        static = {t.name for t in self.settings.targets}
        wanted = {t.name: t for t in found if t.name not in static and in_shard(t.name, shard)}
        with self._targets_lock:
            if self._stopped:
                return
            known = dict(self._discovered)
        gone = [n for n, (t, _) in known.items() if wanted.get(n) != t]
        built: dict[str, tuple[TargetSettings, list[Source]]] = {}
        for name, target in wanted.items():
            if name in known and name not in gone:
                continue
            try:  # every new source first: a failure changes nothing else
                built[name] = (target, self._source_factory(target))
            except Exception:
                log.exception("discovery: cannot scrape target %s; left out", name)
        with self._targets_lock:
            # The loop read once, and sources added under the lock that shutdown
            # takes to end it: none starts on a stopped loop and stays unclosed.
            loop = self._loop
            if self._stopped:  # shut down meanwhile: what was made is closed unused
                for _, sources in built.values():
                    for source in sources:
                        self._close(source)
                return
            stopped = [source for name in gone for source in self._discovered.pop(name)[1]]
            started = [source for _, sources in built.values() for source in sources]
            self._discovered.update(built)
            for name in gone:
                self._endpoints.pop(name, None)
            self._endpoints.update((name, target) for name, (target, _) in built.items())
            self.sources = [s for s in self.sources if s not in stopped] + started
            for source in stopped:
                # A changed target's new sources start afresh; a dropped target's
                # state goes once no scrape of it runs (``_close_source``).
                self._retired[id(source)] = source
                if source.target in built:
                    self._health.pop((source.name, source.target), None)
            if loop is not None:
                for source in started:
                    loop.add(source)
        for source in stopped:  # closed now, or when its scrape ends (or by loop.stop)
            if loop is not None:
                loop.remove(source)
            else:
                self._close_source(source)
        if gone or built:
            log.info(
                "discovery: %d target(s) started, %d stopped; %d discovered in all",
                len(built),
                len(gone),
                len(self._discovered),
            )

    def forget_stale(self, now: float) -> None:
        """Drop the counter samples that are stale (``stale_after_s`` of the target's
        interval): all of a target that no scrape brought since (gone from Prometheus,
        a pod replaced), and a series its target's newer snapshots no longer hold (a
        model unloaded). Each age on one clock: the collector's since the target was
        last seen, the target's own between its snapshots."""
        interval = self.settings.interval_s
        with self._lock:
            seen, intervals = self._seen, self._intervals
            horizon = {t: stale_after_s(max(interval, intervals.get(t, 0.0))) for t in seen}
            gone = {t for t, (at, _) in seen.items() if now - at > horizon[t]}
            old = [
                key
                for key, sample in self._previous.items()
                if key[0] in gone
                or (key[0] in seen and seen[key[0]][1] - sample.collected_at > horizon[key[0]])
            ]
            for key in old:
                del self._previous[key]
                self._tracks.pop(key, None)
            for target in gone:
                del seen[target]
                intervals.pop(target, None)

    def _note_seen(self, collected: Sequence[Record], now: float) -> None:
        """Keep when each target's snapshot came (now, and its own time) and each fleet
        target's scrape interval (as Prometheus scrapes it), for ``forget_stale``."""
        snapshots = [r for r in collected if isinstance(r, records.TritonSnapshot)]
        intervals = [r for r in collected if isinstance(r, records.ScrapeHealth)]
        if snapshots or intervals:
            with self._lock:
                for snapshot in snapshots:
                    self._seen[snapshot.target] = (now, snapshot.collected_at)
                for health in intervals:
                    if health.interval_s:
                        self._intervals[health.target] = health.interval_s

    # ------------------------------------------------------------------ scheduling

    @property
    def runs_store_jobs(self) -> bool:
        """Whether the store-wide jobs (analyses, rollup, retention) run here: in the
        only collector, or in shard 0 of several."""
        return _runs_store_jobs(self.settings)

    def start(self) -> None:
        settings = self.settings
        self._stopped = False
        self._writes.start()
        self._loop = ScrapeLoop(
            self.run_source,
            interval_s=settings.interval_s,
            workers=settings.scrape_workers,
            jitter_s=settings.jitter_s,
            ready=self._due,
            close=self._close_source,
        )
        with self._targets_lock:
            sources = list(self.sources)
        for source in sources:
            self._loop.add(source)
        runs: dict[str, tuple[float, Callable[[], object]]] = {
            "analysis": (settings.analysis_every_s, self.run_analyses),
            "housekeeping": (settings.retention.every_s, self.run_housekeeping),
            **{
                setting: (
                    getattr(settings, f"{setting}_refresh_s"),
                    functools.partial(self.refresh_targets, setting),
                )
                for setting in DISCOVERY_SETTINGS
            },
        }
        self._jobs = [
            PeriodicJob(name, *runs[name])
            for name in collector_jobs(settings, analyses=bool(self.analyses))
        ]
        self._loop.start()
        for job in self._jobs:
            job.start()

    def _due(self, source: Source) -> bool:
        """Not in backoff (read on the loop's thread; ``run_source`` checks again)."""
        health = self._health.get((source.name, source.target))
        return health is None or self._clock() >= health.next_attempt_at

    @staticmethod
    def _close(source: Source) -> None:
        try:
            source.close()
        except Exception:
            log.exception("%s/%s: close failed", source.name, source.target)

    def _close_source(self, source: Source) -> None:
        """Close ``source`` (no scrape of it runs now); when file_sd dropped its target,
        the target's retry state and counter samples go too (unless it came back), and
        what the store keeps in memory about it once none of its sources is left."""
        self._close(source)
        if self._retired.pop(id(source), None) is None:
            return
        with self._targets_lock:
            if source.target in self._endpoints:  # still or again scraped
                return
        self._health.pop((source.name, source.target), None)
        with self._lock:
            for key in [k for k in self._previous if k[0] == source.target]:
                del self._previous[key]
                self._tracks.pop(key, None)
            self._seen.pop(source.target, None)
            self._intervals.pop(source.target, None)
        # Once its last source is closed, the store's write cache lets it go too.
        if not any(s.target == source.target for s in list(self._retired.values())):
            self.store.forget_target(source.target)

    def counts(self) -> LoopCounts:
        """What the scrape loop did since start (zeros before)."""
        return self._loop.counts() if self._loop is not None else LoopCounts(0, 0, 0)

    def skipped_ticks(self, source: Source) -> int:
        """Ticks of ``source`` skipped because its previous scrape still ran."""
        return self._loop.skipped(source) if self._loop is not None else 0

    @property
    def running(self) -> bool:
        """Whether the scrapes and analyses run (started, not stopped)."""
        return self._loop is not None and self._loop.running

    def shutdown(self) -> None:
        """Stop ticking, wait for the scrapes in flight (their timeout and a little
        more) and for an analysis in progress, then close every source."""
        for job in self._jobs:
            job.stop()
        for job in self._jobs:  # no target change after this
            if job.name in DISCOVERY_SETTINGS and not job.join(_SLOW_JOB_WAIT_S):
                log.warning("%s still running at shutdown; not waited for", job.name)
        with self._targets_lock:  # update_targets adds sources under it
            loop, self._loop = self._loop, None
            self._stopped = True
        if loop is not None:
            loop.stop(self.settings.timeout_s + _SCRAPE_GRACE_S)  # closes what it ran
        else:
            with self._targets_lock:
                sources = list(self.sources)
            for source in sources:
                self._close(source)
        for job in self._jobs:
            if not job.join(_SLOW_JOB_WAIT_S):
                log.warning("%s still running at shutdown; not waited for", job.name)
        self._jobs = []
        # The last scrape submitted its writes: one more try at what is held.
        self._writes.stop(_SLOW_JOB_WAIT_S)

    def _keep_outage(self, outage: StoreOutage) -> None:
        """An outage of the store, over: kept in it (held too, should it fail again)."""
        self._submit("the record of a store outage", self.store.record_store_outage, outage)

    def store_buffer(self) -> BufferCounts:
        """What the write buffer holds now and did since start (held while the store
        was out, written later, dropped over the bound)."""
        return self._writes.counts()

    def run(self, duration_s: float | None, stop: threading.Event | None = None) -> None:
        """Collect until ``duration_s`` has passed or ``stop`` is set."""
        stop = stop or threading.Event()
        self.start()
        try:
            stop.wait(duration_s)
        finally:
            self.shutdown()


def _own_snapshot(
    source: Source, kind: str, collected: Sequence[Record]
) -> records.TritonSnapshot | None:
    """The snapshot of the Triton target ``source`` scrapes, when it is all the scrape
    brought (a ``triton`` source's scrape), for ``Store.write_scrape``; else None."""
    if kind != TRITON_KIND or len(collected) != 1:
        return None
    record = collected[0]
    if isinstance(record, records.TritonSnapshot) and record.target == source.target:
        return record
    return None
