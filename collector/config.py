"""Settings: one typed model, filled from defaults, a YAML file, ``BATCHSCOPE_*``
environment variables and the command line (later wins), validated once at start.

Every invalid value stops the start with one ``ConfigError`` whose message names the
field, e.g. ``invalid setting interval_s: must be a number > 0, got 'abc'``.

YAML file (all keys optional)::

    targets:                       # or a list of plain URLs
      - url: http://triton-a:8000  # Triton's HTTP endpoint
        metrics_url: http://triton-a:8002/metrics   # default: same host, port 8002
        name: triton-a             # default: host:port of url
    db_url: sqlite:///batchscope.db
    interval_s: 5
    duration_s: null               # run until stopped
    timeout_s: 3
    max_response_bytes: 16777216
    sources: [triton, nvml, host]
    backoff_max_s: 60
    jitter_s: 0.5
    analysis_every_s: 15           # detectors run this often
    slo_p95_ms: {resnet50: 40}     # latency objective per model (p95, ms)
    analysis: {queue_share: 0.5, sustain: 3}   # detector thresholds, see DetectorSettings
    retention: {raw_keep_s: 604800, rollup_keep_s: 7776000, rollup_bucket_s: 300,
                every_s: 300}
    recommend_every_s: 60          # `serve` stores a recommendation per model this often
    ui:                            # the web UI (`batchscope serve` / `dashboard`)
      admin_password: ...          # with either password set, login is required;
      viewer_password: ...         # only admin may apply a config change
      secret_key: ...              # signs session cookies (default: random per start)
      apply_verify_s: 30           # before/after windows of an Apply from the UI

Environment: ``BATCHSCOPE_TRITON`` (comma-separated URLs), ``BATCHSCOPE_METRICS_URL``
and ``BATCHSCOPE_<FIELD>`` for every scalar field above (``BATCHSCOPE_DB_URL``,
``BATCHSCOPE_INTERVAL_S`` ...), ``BATCHSCOPE_SOURCES`` comma-separated,
``BATCHSCOPE_RETENTION_<FIELD>`` for the retention fields, ``BATCHSCOPE_UI_<FIELD>`` for
the ui fields (``BATCHSCOPE_UI_ADMIN_PASSWORD`` ...). Passwords are never printed.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import yaml

from collector.errors import ConfigError

__all__ = [
    "RetentionSettings",
    "UiSettings",
    "Settings",
    "TargetSettings",
    "load_settings",
    "target_from_url",
]

DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 8002
ENV_PREFIX = "BATCHSCOPE_"


@dataclass(frozen=True)
class TargetSettings:
    """One Triton server: ``url`` is its HTTP endpoint, ``metrics_url`` its /metrics."""

    name: str
    url: str
    metrics_url: str


@dataclass(frozen=True)
class RetentionSettings:
    raw_keep_s: float = 7 * 24 * 3600.0  # raw per-scrape samples
    rollup_keep_s: float = 90 * 24 * 3600.0  # coarse buckets for long windows
    rollup_bucket_s: float = 300.0
    every_s: float = 300.0  # how often the retention job runs


@dataclass(frozen=True)
class UiSettings:
    """The web UI's access and actions. A password set means login is required."""

    admin_password: str | None = field(default=None, repr=False)
    viewer_password: str | None = field(default=None, repr=False)
    secret_key: str | None = field(default=None, repr=False)
    apply_verify_s: float = 30.0

    @property
    def login_required(self) -> bool:
        return bool(self.admin_password or self.viewer_password)


@dataclass(frozen=True)
class Settings:
    targets: tuple[TargetSettings, ...] = ()
    db_url: str = "sqlite:///batchscope.db"
    interval_s: float = 5.0
    duration_s: float | None = None
    timeout_s: float = 3.0
    max_response_bytes: int = 16 * 1024 * 1024
    sources: tuple[str, ...] = ("triton", "nvml", "host")
    backoff_max_s: float = 60.0
    jitter_s: float = 0.5
    analysis_every_s: float = 15.0
    # Latency objective per model name, in ms of p95; models without one may not get
    # more than 10 % slower at p95 from a recommendation.
    slo_p95_ms: dict[str, float] = field(default_factory=dict)
    # Detector thresholds (collector.analysis.detect.DetectorSettings), by field name.
    analysis: dict[str, object] = field(default_factory=dict)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    recommend_every_s: float = 60.0
    ui: UiSettings = field(default_factory=UiSettings)


_SCALAR_FIELDS = ("db_url", "interval_s", "duration_s", "timeout_s", "max_response_bytes",
                  "backoff_max_s", "jitter_s", "analysis_every_s", "recommend_every_s")


def target_from_url(url: str, metrics_url: str | None = None, name: str | None = None,
                    *, field_name: str = "targets") -> TargetSettings:
    """Build a target from Triton's HTTP URL; the metrics URL defaults to the same host
    on port 8002 with path ``/metrics``. A bare ``host:port`` means ``http://host:port``."""
    http = _normalise_url(url, field_name, default_port=DEFAULT_HTTP_PORT)
    parts = urlsplit(http)
    if metrics_url is None:
        metrics = urlunsplit((parts.scheme, f"{parts.hostname}:{DEFAULT_METRICS_PORT}",
                              "/metrics", "", ""))
    else:
        metrics = _normalise_url(metrics_url, "metrics_url", default_port=DEFAULT_METRICS_PORT)
        if urlsplit(metrics).path in ("", "/"):
            metrics = metrics.rstrip("/") + "/metrics"
    return TargetSettings(name=name or parts.netloc, url=http, metrics_url=metrics)


def _normalise_url(value: object, field_name: str, *, default_port: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(field_name, f"must be a URL such as http://host:{default_port}, "
                                      f"got {value!r}")
    text = value.strip()
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ConfigError(field_name, f"scheme must be http or https, got {value!r}")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(field_name, f"port is not a number in {value!r}") from None
    if not parts.hostname:
        raise ConfigError(field_name, f"has no host: {value!r}")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    netloc = f"{host}:{port or default_port}"
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def _number(value: object, field_name: str, *, minimum: float = 0.0, allow_none: bool = False,
            integer: bool = False) -> Any:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none", "null")):
        if allow_none:
            return None
        raise ConfigError(field_name, "is required")
    if isinstance(value, bool):
        raise ConfigError(field_name, f"must be a number, got {value!r}")
    try:
        number = float(value) if not integer else int(str(value).strip())
    except (TypeError, ValueError):
        kind = "an integer" if integer else "a number"
        raise ConfigError(field_name, f"must be {kind} > {minimum:g}, got {value!r}") from None
    if math.isnan(number) or math.isinf(number) or number <= minimum:
        raise ConfigError(field_name, f"must be > {minimum:g}, got {value!r}")
    return number


def _check_db_url(value: object) -> str:
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if not isinstance(value, str) or not value.strip():
        raise ConfigError("db_url", f"must be an SQLAlchemy URL, got {value!r}")
    try:
        make_url(value.strip())
    except ArgumentError as exc:
        raise ConfigError("db_url", f"is not an SQLAlchemy URL ({exc})") from None
    return value.strip()


def _parse_targets(raw: object) -> tuple[TargetSettings, ...]:
    if raw is None:
        return ()
    if isinstance(raw, str):
        raw = [part for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list):
        raise ConfigError("targets", f"must be a list, got {type(raw).__name__}")
    targets: list[TargetSettings] = []
    for i, item in enumerate(raw):
        where = f"targets[{i}]"
        if isinstance(item, str):
            targets.append(target_from_url(item, field_name=where))
        elif isinstance(item, Mapping):
            unknown = set(item) - {"url", "metrics_url", "name"}
            if unknown:
                raise ConfigError(f"{where}.{sorted(unknown)[0]}", "unknown key")
            if "url" not in item:
                raise ConfigError(f"{where}.url", "is required")
            targets.append(target_from_url(item["url"], item.get("metrics_url"),
                                           item.get("name"), field_name=f"{where}.url"))
        else:
            raise ConfigError(where, f"must be a URL or a mapping, got {item!r}")
    names = [t.name for t in targets]
    for name in names:
        if names.count(name) > 1:
            raise ConfigError("targets", f"target name {name!r} appears twice")
    return tuple(targets)


def _parse_sources(raw: object, known: set[str] | None) -> tuple[str, ...]:
    if isinstance(raw, str):
        raw = [part.strip() for part in raw.split(",") if part.strip()]
    if not isinstance(raw, list | tuple) or not all(isinstance(s, str) for s in raw):
        raise ConfigError("sources", f"must be a list of source names, got {raw!r}")
    if known is not None:
        for name in raw:
            if name not in known:
                raise ConfigError("sources", f"unknown source {name!r}; known: "
                                             f"{', '.join(sorted(known))}")
    return tuple(raw)


def _parse_retention(raw: object) -> RetentionSettings:
    if raw is None:
        return RetentionSettings()
    if not isinstance(raw, Mapping):
        raise ConfigError("retention", f"must be a mapping, got {raw!r}")
    names = {f.name for f in fields(RetentionSettings)}
    values: dict[str, float] = {}
    for key, value in raw.items():
        if key not in names:
            raise ConfigError(f"retention.{key}", "unknown key")
        values[key] = _number(value, f"retention.{key}")
    return RetentionSettings(**values)


def _parse_ui(raw: object, base: UiSettings) -> UiSettings:
    if not isinstance(raw, Mapping):
        raise ConfigError("ui", f"must be a mapping, got {raw!r}")
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key in ("admin_password", "viewer_password", "secret_key"):
            if value is not None and (not isinstance(value, str) or not value):
                # The value itself is a secret: never echo it.
                raise ConfigError(f"ui.{key}", "must be a non-empty string")
            values[key] = value
        elif key == "apply_verify_s":
            values[key] = _number(value, "ui.apply_verify_s")
        else:
            raise ConfigError(f"ui.{key}", "unknown key")
    ui = replace(base, **values)
    if ui.admin_password and ui.admin_password == ui.viewer_password:
        raise ConfigError("ui.viewer_password", "must differ from ui.admin_password")
    return ui


def _parse_slos(raw: object) -> dict[str, float]:
    if not isinstance(raw, Mapping):
        raise ConfigError("slo_p95_ms", f"must map model names to milliseconds, got {raw!r}")
    return {str(model): _number(value, f"slo_p95_ms.{model}") for model, value in raw.items()}


def _read_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping at the top level")
    return data


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    raw: dict[str, Any] = {}
    for key in _SCALAR_FIELDS:
        value = env.get(ENV_PREFIX + key.upper())
        if value is not None:
            raw[key] = value
    if ENV_PREFIX + "TRITON" in env:
        raw["triton"] = [u for u in env[ENV_PREFIX + "TRITON"].split(",") if u.strip()]
    if ENV_PREFIX + "METRICS_URL" in env:
        raw["metrics_url"] = [u for u in env[ENV_PREFIX + "METRICS_URL"].split(",") if u.strip()]
    if ENV_PREFIX + "SOURCES" in env:
        raw["sources"] = env[ENV_PREFIX + "SOURCES"]
    retention = {f.name: env[ENV_PREFIX + "RETENTION_" + f.name.upper()]
                 for f in fields(RetentionSettings)
                 if ENV_PREFIX + "RETENTION_" + f.name.upper() in env}
    if retention:
        raw["retention"] = retention
    ui = {f.name: env[ENV_PREFIX + "UI_" + f.name.upper()] for f in fields(UiSettings)
          if ENV_PREFIX + "UI_" + f.name.upper() in env}
    if ui:
        raw["ui"] = ui
    return raw


def _targets_from_urls(urls: list[str], metrics_urls: list[str] | None,
                       source: str) -> tuple[TargetSettings, ...]:
    if metrics_urls and len(metrics_urls) != len(urls):
        raise ConfigError("metrics_url", f"{len(metrics_urls)} metrics URL(s) given for "
                                         f"{len(urls)} Triton target(s) ({source}); give one "
                                         "per target or none")
    targets = tuple(
        target_from_url(url, metrics_urls[i] if metrics_urls else None, field_name="triton")
        for i, url in enumerate(urls))
    return _parse_targets([{"url": t.url, "metrics_url": t.metrics_url, "name": t.name}
                           for t in targets])


def load_settings(*, config_file: str | Path | None = None,
                  env: Mapping[str, str] | None = None,
                  overrides: Mapping[str, Any] | None = None,
                  known_sources: set[str] | None = None) -> Settings:
    """Merge defaults < YAML file < environment < ``overrides`` (the CLI) and validate.

    ``overrides`` takes the same keys as the YAML file, plus ``triton`` and
    ``metrics_url`` (lists of URLs, the CLI's ``--triton``/``--metrics-url``).
    """
    env = os.environ if env is None else env
    layers: list[tuple[str, dict[str, Any]]] = []
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = env[ENV_PREFIX + "CONFIG"]
    if config_file is not None:
        layers.append((f"file {config_file}", _read_file(Path(config_file))))
    layers.append(("environment", _from_env(env)))
    layers.append(("command line", {k: v for k, v in (overrides or {}).items()
                                    if v is not None}))

    allowed = set(_SCALAR_FIELDS) | {"targets", "sources", "retention", "triton", "metrics_url",
                                     "slo_p95_ms", "analysis", "ui"}
    settings = Settings()
    for origin, layer in layers:
        for key in layer:
            if key not in allowed:
                raise ConfigError(key, f"unknown setting (from {origin})")
        changes: dict[str, Any] = {}
        if "targets" in layer:
            changes["targets"] = _parse_targets(layer["targets"])
        if layer.get("triton"):
            changes["targets"] = _targets_from_urls(list(layer["triton"]),
                                                    list(layer.get("metrics_url") or []), origin)
        elif layer.get("metrics_url"):
            raise ConfigError("metrics_url", f"given without a Triton URL ({origin})")
        if "db_url" in layer:
            changes["db_url"] = _check_db_url(layer["db_url"])
        for key in ("interval_s", "timeout_s", "backoff_max_s", "analysis_every_s",
                    "recommend_every_s"):
            if key in layer:
                changes[key] = _number(layer[key], key)
        if "jitter_s" in layer:
            changes["jitter_s"] = _number(layer["jitter_s"], "jitter_s", minimum=-1e-12)
        if "duration_s" in layer:
            changes["duration_s"] = _number(layer["duration_s"], "duration_s", allow_none=True)
        if "max_response_bytes" in layer:
            changes["max_response_bytes"] = _number(layer["max_response_bytes"],
                                                    "max_response_bytes", integer=True)
        if "sources" in layer:
            changes["sources"] = _parse_sources(layer["sources"], known_sources)
        if "retention" in layer:
            changes["retention"] = _parse_retention(layer["retention"])
        if "analysis" in layer:
            if not isinstance(layer["analysis"], Mapping):
                raise ConfigError("analysis", f"must be a mapping, got {layer['analysis']!r}")
            changes["analysis"] = dict(layer["analysis"])
        if "slo_p95_ms" in layer:
            changes["slo_p95_ms"] = _parse_slos(layer["slo_p95_ms"])
        if "ui" in layer:
            changes["ui"] = _parse_ui(layer["ui"], settings.ui)
        settings = replace(settings, **changes)
    if known_sources is not None:
        _parse_sources(list(settings.sources), known_sources)
    if settings.timeout_s > settings.interval_s * 10:
        raise ConfigError("timeout_s", f"{settings.timeout_s:g} s is more than ten scrape "
                                       f"intervals ({settings.interval_s:g} s)")
    return settings
