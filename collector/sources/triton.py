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
Endpoints read per ``collect()``: ``GET /v2`` (server version, and a cheap liveness
check), the metrics URL, ``GET /v2/models/stats``, and ``GET /v2/models/NAME/config``
for each model in the statistics. Configs are cached (see ``TritonSource``).
"""

from __future__ import annotations

import time
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
    map_model_config,
    map_model_stats,
    parse_model_config,
    parse_model_stats,
    parse_server_version,
)
from collector.sources.triton_metrics import (
    REQUEST_SUMMARY,
    TritonMetrics,
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
    and fetched again after ``config_refresh_s``, when a counter of the model went down
    or its set of versions changed (both mean a reload), and after a failed fetch. A
    config that fails to fetch or parse is reported in ``partial_errors`` under
    ``"config:NAME"``; the rest of the snapshot stands. A failure of the server
    metadata, metrics or statistics request fails the whole collection.

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
        config_refresh_s: float = 30.0,
    ) -> None:
        self.target = target.name
        self._settings = target
        self._base_url = target.url.rstrip("/")
        self._http = HttpFetcher(
            timeout_s=timeout_s, max_response_bytes=max_response_bytes, session=session
        )
        self._clock = clock
        self._config_refresh_s = config_refresh_s
        self._configs: dict[str, tuple[ModelConfig, float]] = {}
        self._last_stats: dict[str, tuple[ModelStats, ...]] = {}

    # ------------------------------------------------------------------ protocol

    def collect(self) -> list[TritonSnapshot]:
        collected_at = self._clock()
        version_url = f"{self._base_url}/v2"
        server_version = self._parsed(version_url, "server metadata", parse_server_version)
        metrics_url = self._settings.metrics_url
        metrics = self._parsed(metrics_url, "metrics", _parse_metrics_body)
        stats_url = f"{self._base_url}/v2/models/stats"
        stats = self._parsed(stats_url, "model statistics", parse_model_stats)

        configs, partial_errors = self._model_configs(stats)
        return [
            TritonSnapshot(
                target=self.target,
                collected_at=collected_at,
                server_version=server_version,
                model_metrics=metrics.models,
                model_stats=stats,
                model_configs=configs,
                gpus=metrics.gpus,
                server=metrics.server,
                partial_errors=partial_errors,
            )
        ]

    def close(self) -> None:
        self._http.close()

    # ------------------------------------------------------------------ configs

    def _model_configs(
        self, stats: Sequence[ModelStats]
    ) -> tuple[tuple[ModelConfig, ...], dict[str, str]]:
        by_model: dict[str, list[ModelStats]] = {}
        for s in stats:
            by_model.setdefault(s.model, []).append(s)
        now = self._clock()
        configs: list[ModelConfig] = []
        errors: dict[str, str] = {}
        for model in sorted(by_model):
            current = tuple(by_model[model])
            cached = self._configs.get(model)
            if (
                cached is None
                or now - cached[1] >= self._config_refresh_s
                or _reloaded(self._last_stats.get(model), current)
            ):
                self._configs.pop(model, None)
                try:
                    config = self._fetch_config(model)
                except CollectError as exc:
                    # Left out of the cache, so the next collection tries again.
                    errors[f"config:{model}"] = str(exc)
                    continue
                cached = (config, now)
                self._configs[model] = cached
            configs.append(cached[0])
        # Models that left the statistics were unloaded: forget them.
        for gone in set(self._configs) - set(by_model):
            del self._configs[gone]
        self._last_stats = {m: tuple(v) for m, v in by_model.items()}
        return tuple(configs), errors

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


def _reloaded(previous: Sequence[ModelStats] | None, current: Sequence[ModelStats]) -> bool:
    """True when ``current`` cannot follow ``previous`` without a model reload: the set
    of versions changed, or a cumulative counter of some version went down."""
    if previous is None:
        return False
    before = {s.version: s for s in previous}
    after = {s.version: s for s in current}
    if before.keys() != after.keys():
        return True
    for version, now in after.items():
        then = before[version]
        if (
            now.execution_count < then.execution_count
            or now.inference_count < then.inference_count
            or now.success.count < then.success.count
        ):
            return True
    return False


def _parse_metrics_body(body: bytes) -> TritonMetrics:
    return parse_metrics(_utf8(body))


def _utf8(body: bytes) -> str:
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ParseError(f"not UTF-8 text: {exc}") from exc


register_source(SourceSpec("triton", lambda settings, target: TritonSource(target, timeout_s=settings.timeout_s, max_response_bytes=settings.max_response_bytes), per_target=True))  # noqa: E501  # fmt: skip
