"""The ``triton`` source: one Triton server's metrics, statistics and model configs.

Three steps, each testable alone, each in its own module:

1. *fetch* (``collector.sources.http_fetch.HttpFetcher``): one bounded HTTP GET --
   connect and read timeouts, a total deadline, a cap on the body -- that turns every
   failure into a ``collector.errors.CollectError``;
2. *parse* (``collector.sources.exposition.parse_exposition``, ``json.loads``);
3. *map* (``collector.sources.triton_metrics.map_metrics``,
   ``collector.sources.triton_json.map_model_stats`` and ``map_model_config``): pure
   functions from parsed documents to ``collector.records``.

This module holds the source itself: which endpoints it reads and the config cache.
Endpoints read per ``collect()``: the metrics URL, and ``GET /v2/models/stats`` when
``statistics_interval_s`` has passed since it was last read (a failure of either fails
the collection, so they are the liveness check); ``GET /v2``
(the server version) only when it may have changed -- the first collection, the one
after a failure, and one where a counter went down (a restart); ``GET
/v2/models/NAME/config`` only for a model whose config may have changed (see
``TritonSource``).
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Sequence
from typing import TypeVar
from urllib.parse import quote

import requests

from collector.config import TargetSettings
from collector.errors import CollectError, ParseError
from collector.records import ModelConfig, ModelStats, TritonSnapshot
from collector.sources.base import SourceSpec, register_source
from collector.sources.http_fetch import MIB, HttpFetcher
from collector.sources.triton_json import (
    ModelStatsParser,
    map_model_config,
    map_model_stats,
    parse_model_config,
    parse_model_stats,
    parse_server_version,
)
from collector.sources.triton_metrics import (
    REQUEST_SUMMARY,
    TritonMetrics,
    TritonMetricsParser,
    map_metrics,
    parse_metrics,
)

# The parsers are imported from here by callers that predate the split into modules.
__all__ = [
    "REQUEST_SUMMARY",
    "TritonMetrics",
    "TritonSource",
    "map_metrics",
    "map_model_config",
    "map_model_stats",
    "parse_metrics",
    "parse_model_config",
    "parse_model_stats",
    "parse_server_version",
]

_T = TypeVar("_T")


class TritonSource:
    """Reads one Triton target per ``collect()`` into one ``TritonSnapshot``.

    Model configs change only when a model is (re)loaded, so they are cached per model
    and fetched again when a counter of the model went down or its set of versions
    changed (both mean a reload), after a failed fetch, and, as a safety net for a
    reload that left no trace in the counters, once between ``config_refresh_s`` and
    1.5 x ``config_refresh_s`` after the last fetch (spread over that span by model, so
    a target's models are not all refetched in one collection). A config that fails
    to fetch or parse is reported in ``partial_errors`` under ``"config:NAME"``; the
    rest of the snapshot stands.

    The server version is read on the first collection, after a failed one, and when
    a counter of any model went down (a restart); otherwise the last one read is
    reported. A failure of the metrics or statistics request (or of the version when
    it is read) fails the whole collection.

    The statistics are read on the first collection, after a failed one, and then once
    ``statistics_interval_s`` has passed since they were last read (0: every
    collection); a collection between reports no ``model_stats`` and the configs last
    read. Their counters are cumulative, so the analyses pair each reading with the one
    before it (``rates.stats_pair``) and lose nothing but resolution.

    ``session`` is owned by the source from then on: ``close()`` closes it.
    ``clock`` (Unix seconds) stamps ``collected_at`` and times the config cache.
    """

    name = "triton"

    def __init__(
        self,
        target: TargetSettings,
        *,
        timeout_s: float = 3.0,
        max_response_bytes: int = 16 * MIB,
        session: requests.Session | None = None,
        clock: Callable[[], float] = time.time,
        config_refresh_s: float = 600.0,
        statistics_interval_s: float = 0.0,
    ) -> None:
        self.target = target.name
        self._settings = target
        self._base_url = target.url.rstrip("/")
        self._http = HttpFetcher(
            timeout_s=timeout_s, max_response_bytes=max_response_bytes, session=session
        )
        self._clock = clock
        self._config_refresh_s = config_refresh_s
        # model -> (config, when it is due again)
        self._configs: dict[str, tuple[ModelConfig, float]] = {}
        self._last_stats: dict[str, tuple[ModelStats, ...]] = {}
        self._metrics_parser = TritonMetricsParser()
        self._stats_parser = ModelStatsParser()
        self._version_url = f"{self._base_url}/v2"
        self._stats_url = f"{self._base_url}/v2/models/stats"
        self._server_version: str | None = None
        self._version_stale = True
        self._statistics_interval_s = statistics_interval_s
        self._statistics_due_at: float | None = None  # None: at the next collection

    # ------------------------------------------------------------------ protocol

    def collect(self) -> list[TritonSnapshot]:
        try:
            return [self._collect()]
        except BaseException:
            # Down, or replaced by another server: read its version and statistics again.
            self._version_stale = True
            self._statistics_due_at = None
            raise

    def _collect(self) -> TritonSnapshot:
        collected_at = self._clock()
        if self._version_stale:
            self._read_version()
        metrics_url = self._settings.metrics_url
        metrics = self._parsed(metrics_url, "metrics", self._metrics_parser.parse)
        due_at = self._statistics_due_at
        if due_at is None or collected_at >= due_at:
            stats = self._parsed(self._stats_url, "model statistics", self._stats_parser.parse)
            # A tenth early: collections come every interval_s, give or take a little,
            # and one that falls just short should not wait a whole interval more.
            self._statistics_due_at = collected_at + 0.9 * self._statistics_interval_s
            configs, partial_errors, reloaded = self._model_configs(stats)
        else:
            stats = ()
            configs, partial_errors, reloaded = self._cached_configs(), {}, False
        if reloaded and not self._version_stale:
            self._read_version()
        self._version_stale = False
        return TritonSnapshot(
            target=self.target,
            collected_at=collected_at,
            server_version=self._server_version,
            model_metrics=metrics.models,
            model_stats=stats,
            model_configs=configs,
            gpus=metrics.gpus,
            server=metrics.server,
            partial_errors=partial_errors,
        )

    def _read_version(self) -> None:
        self._server_version = self._parsed(
            self._version_url, "server metadata", parse_server_version
        )

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ configs

    def _model_configs(
        self, stats: Sequence[ModelStats]
    ) -> tuple[tuple[ModelConfig, ...], dict[str, str], bool]:
        """The configs of the models in ``stats``, the configs that failed, and whether
        a model was reloaded (a counter went down or its set of versions changed): the
        server may have restarted or been replaced, so its version is read again."""
        by_model: dict[str, tuple[ModelStats, ...]] = {}
        for s in stats:
            by_model[s.model] = (*by_model.get(s.model, ()), s)
        now = self._clock()
        configs: list[ModelConfig] = []
        errors: dict[str, str] = {}
        any_reloaded = False
        for model in sorted(by_model):
            current = by_model[model]
            cached = self._configs.get(model)
            reloaded = _reloaded(self._last_stats.get(model), current)
            any_reloaded = any_reloaded or bool(reloaded)
            if cached is None or now >= cached[1] or reloaded:
                self._configs.pop(model, None)
                try:
                    config = self._fetch_config(model)
                except CollectError as exc:
                    # Left out of the cache, so the next collection tries again.
                    errors[f"config:{model}"] = str(exc)
                    continue
                cached = (config, now + self._refresh_after(model))
                self._configs[model] = cached
            configs.append(cached[0])
        # Models that left the statistics were unloaded: forget them.
        if len(self._configs) > len(configs):
            for gone in set(self._configs) - set(by_model):
                del self._configs[gone]
        self._last_stats = by_model
        return tuple(configs), errors, any_reloaded

    def _cached_configs(self) -> tuple[ModelConfig, ...]:
        """The configs of the models in the statistics last read, as last fetched."""
        return tuple(self._configs[model][0] for model in sorted(self._configs))

    def _refresh_after(self, model: str) -> float:
        """``config_refresh_s`` plus up to half of it, fixed per model and target."""
        spread = zlib.crc32(f"{self.target}/{model}".encode()) / 2**32
        return self._config_refresh_s * (1.0 + 0.5 * spread)

    def _fetch_config(self, model: str) -> ModelConfig:
        url = f"{self._base_url}/v2/models/{quote(model, safe='')}/config"

        def parse(body: bytes) -> ModelConfig:
            return parse_model_config(_utf8(body), model)

        return self._parsed(url, "model config", parse)

    # ------------------------------------------------------------------ HTTP

    def _parsed(self, url: str, what: str, parse: Callable[[bytes], _T]) -> _T:
        """GET ``url`` and parse its body; a ``ParseError`` gains the URL and target."""
        who = f"target {self.target!r}"
        body = self._http.get(url, who)
        try:
            return parse(body)
        except ParseError as exc:
            raise ParseError(f"unparseable {what}: GET {url} ({who}): {exc}") from exc


_VERSIONS_CHANGED = 1
_COUNTER_DOWN = 2


def _reloaded(previous: Sequence[ModelStats] | None, current: Sequence[ModelStats]) -> int:
    """Non-zero when ``current`` cannot follow ``previous`` without a model reload:
    ``_VERSIONS_CHANGED`` when the set of versions changed, ``_COUNTER_DOWN`` when a
    cumulative counter of some version went down; 0 otherwise."""
    if previous is None:
        return 0
    before = {s.version: s for s in previous}
    after = {s.version: s for s in current}
    if before.keys() != after.keys():
        return _VERSIONS_CHANGED
    for version, now in after.items():
        then = before[version]
        if (
            now.execution_count < then.execution_count
            or now.inference_count < then.inference_count
            or now.success.count < then.success.count
        ):
            return _COUNTER_DOWN
    return 0


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc}") from exc


register_source(SourceSpec("triton", lambda settings, target: TritonSource(target, timeout_s=settings.timeout_s, max_response_bytes=settings.max_response_bytes, statistics_interval_s=settings.statistics_interval_s), per_target=True))  # noqa: E501  # fmt: skip
