"""Settings: one typed model (pydantic-settings), filled from defaults, a YAML file,
``BATCHSCOPE_*`` environment variables and the command line (later wins), validated
once at start.

Every invalid value stops the start with one ``ConfigError`` whose message names the
field, e.g. ``invalid setting interval_s: must be a number, got 'abc'``.

YAML file (all keys optional)::

    targets:                       # or a list of plain URLs
      - url: http://triton-a:8000  # Triton's HTTP endpoint
        metrics_url: http://triton-a:8002/metrics   # default: same host, port 8002
        name: triton-a             # default: host:port of url
    db_url: sqlite:///batchscope.db
    interval_s: 5
    duration_s: null               # run until stopped
    timeout_s: 3
    statistics_interval_s: 5       # the statistics API at most this often (<= 30)
    max_response_bytes: 16777216
    sources: [triton, nvml, host]
    backoff_max_s: 60
    jitter_s: 0.5
    scrape_workers: 16             # scrapes that may run at once (threads start as needed)
    store_buffer_max_writes: 5000  # while the store is out, writes held in memory, at most
    store_buffer_max_bytes: 134217728   # ... and bytes; over either, the oldest are dropped
    file_sd: [targets/*.json]      # Prometheus file_sd files (globs), re-read on change
    file_sd_refresh_s: 5           # how often they are looked at
    dns_sd: [_http._tcp.triton.ml.svc.cluster.local]   # DNS SRV names listing more targets
    dns_sd_refresh_s: 30           # how often they are looked up
    dns_sd_nameserver: null        # "ADDRESS[:PORT]"; default: the system's resolv.conf
    dns_sd_metrics_port: 8002      # the discovered servers' metrics port ("same": SRV's)
    shard: 0/3                     # scrape only the targets whose hash falls to shard 0 of 3
    analysis_every_s: 15           # detectors run this often
    slo_p95_ms: {resnet50: 40}     # latency objective per model (p95, ms)
    analysis: {queue_share: 0.5, sustain: 3}   # detector thresholds, see DetectorSettings
    retention: {raw_keep_s: 604800, rollup_keep_s: 7776000, rollup_bucket_s: 300,
                every_s: 300}
    recommend_every_s: 60          # `serve` stores a recommendation per model this often
    apply:                         # applying a recommendation (`apply`, the UI's Apply)
      before_s: 30                 # measured before the change ...
      after_s: 30                  # ... and after it
      settle_s: 1                  # pause between the reload and the after window
      min_qps_ratio: 0.95          # kept only if after/before QPS is at least this
      max_p95_ratio: 1.10          # without an objective: rolled back when p95 grows more
    ui:                            # the web UI (`batchscope serve` / `dashboard`)
      admin_password: ...          # with either password set, login is required;
      viewer_password: ...         # only admin may apply a config change
      secret_key: ...              # signs session cookies (default: random per start)
      apply_verify_s: 30           # before/after windows of an Apply from the UI
                                   # (default: apply.before_s / apply.after_s)
    alerts:                        # alert rules and where their notifications go
      receivers:                   # each: a name and exactly one of webhook/slack/alertmanager
        - name: ops
          webhook:
            url: https://hooks.example.com/batchscope
            secret: whsec_...      # Standard Webhooks signing secret (base64 after whsec_);
                                   # or secret_file: /path, or secret_env: VARIABLE
        - name: chat
          slack: {url: https://hooks.slack.com/services/...}
        - name: am
          alertmanager: {url: http://alertmanager:9093, resend_s: 60}
      routes:                      # default: every alert to every receiver
        - match: {alertname: BatchscopeTargetDown}   # labels, all equal
          severity: [critical]     # any of these (empty: any severity)
          receivers: [ops, am]
      dashboard_url: http://batchscope:8050   # links in the alerts
      repeat_interval_s: 14400     # a firing alert is notified again this often
      max_attempts: 8              # delivery tries before a notification is dead
      backoff_s: 2                 # first retry after this, doubling (with jitter) ...
      backoff_max_s: 600           # ... up to this
      timeout_s: 10                # one delivery's HTTP timeout
      deliver_every_s: 1           # the outbox is looked at this often
      keep_s: 2592000              # sent notifications, resolved alerts kept this long
      failure_share: 0.05          # failed share of requests that fires failure_rate
      no_data_resolve_s: 900       # an alert without fresh data this long resolves
      rules: {queue_saturation: {for_s: 60, severity: critical}, batch_below_preferred:
              {enabled: false}}    # per rule: for_s, severity, enabled

Environment: ``BATCHSCOPE_CONFIG`` (the file), ``BATCHSCOPE_TRITON`` (comma-separated
URLs), ``BATCHSCOPE_METRICS_URL`` and ``BATCHSCOPE_<FIELD>`` for every field above
(``BATCHSCOPE_DB_URL``, ``BATCHSCOPE_INTERVAL_S`` ...; ``BATCHSCOPE_SOURCES`` and
``BATCHSCOPE_FILE_SD`` comma-separated), ``BATCHSCOPE_<GROUP>_<FIELD>`` for the fields
of retention, apply and ui and alerts (``BATCHSCOPE_UI_ADMIN_PASSWORD``,
``BATCHSCOPE_APPLY_AFTER_S``, ``BATCHSCOPE_ALERTS_DASHBOARD_URL``,
``BATCHSCOPE_ALERTS_RECEIVERS`` as JSON ...).
Passwords, webhook secrets and Slack URLs (which hold a token) are never printed.
"""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit, urlunsplit

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    InitSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    SettingsError,
)
from pydantic_settings.sources.utils import parse_env_vars

from collector.alert_settings import (
    RECEIVER_KINDS,
    AlertmanagerReceiver,
    AlertRuleSettings,
    AlertSettings,
    ReceiverSettings,
    RouteSettings,
    SlackReceiver,
    WebhookReceiver,
    signing_key,
)
from collector.errors import ConfigError
from collector.settings_fields import Positive, Seconds
from collector.settings_fields import not_bool as _not_bool

__all__ = [
    "RECEIVER_KINDS",
    "AlertRuleSettings",
    "AlertSettings",
    "AlertmanagerReceiver",
    "ApplySettings",
    "ReceiverSettings",
    "RouteSettings",
    "SlackReceiver",
    "WebhookReceiver",
    "RetentionSettings",
    "Settings",
    "TargetSettings",
    "UiSettings",
    "host_name_setting",
    "load_settings",
    "parse_shard",
    "scrub_url_passwords",
    "signing_key",
    "target_from_url",
]

DEFAULT_HTTP_PORT = 8000
DEFAULT_METRICS_PORT = 8002
ENV_PREFIX = "BATCHSCOPE_"
#: The longest ``statistics_interval_s`` allowed; readers that look for a series' newest
#: statistics look this much further back than for its newest metrics.
MAX_STATISTICS_INTERVAL_S = 30.0
# Never echoed in an error message: the value itself is the secret, or (a receiver,
# the groups, a database URL) may hold one (a webhook secret, a Slack URL with its
# token, a password).
_SECRETS = frozenset(
    {"admin_password", "viewer_password", "secret_key", "secret", "receivers", "db_url"}
)
# The password of a URL's user information (``scheme://user:password@host``).
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/@:]*:)[^\s/@]*@")


def _none_words(value: object) -> object:
    """An environment variable cannot be null: "", "none" and "null" stand for it."""
    text = value.strip().lower() if isinstance(value, str) else value
    return None if text in ("", "none", "null") else value


def _comma_list(value: object) -> object:
    """Environment variables and flags give lists as comma-separated text."""
    return [p.strip() for p in value.split(",") if p.strip()] if isinstance(value, str) else value


_DNS_PORT = 53
# A DNS name: dot-separated labels of letters, digits, '-' and '_' (SRV's _service and
# _proto), each 1..63 long, an optional final dot.
_DNS_NAME = re.compile(
    r"(?:[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.)*"
    r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?\.?"
)


def parse_nameserver(text: str) -> tuple[str, int]:
    """``(address, port)`` of ``"ADDRESS"`` or ``"ADDRESS:PORT"`` (an IPv6 address in
    brackets when a port follows); a ``ValueError`` saying what is wrong."""
    text = text.strip()
    host, port_text = text, ""
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        if rest and not rest.startswith(":"):
            raise ValueError(f"{text!r} is not ADDRESS or ADDRESS:PORT")
        port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    try:
        address = str(ipaddress.ip_address(host))
    except ValueError:
        raise ValueError(
            f"{text!r} is not an IP address (with an optional :PORT) of a nameserver"
        ) from None
    if port_text == "":
        return address, _DNS_PORT
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port must be 1..65535")
    return address, int(port_text)


def _normalise_url(value: str, *, default_port: int) -> str:
    """``http(s)://host:port/path`` with the port made explicit; a bare ``host:port``
    means ``http://host:port``. Raises ``ValueError`` saying what is wrong."""
    text = value.strip()
    if not text:
        raise ValueError(f"must be a URL such as http://host:{default_port}")
    if any(c.isspace() for c in text):
        raise ValueError(f"must be a URL such as http://host:{default_port} (no spaces)")
    if "://" not in text:
        text = "http://" + text
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("scheme must be http or https")
    try:
        port = parts.port
    except ValueError:
        raise ValueError("port is not a number") from None
    if not parts.hostname:
        raise ValueError("has no host")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return urlunsplit(
        (parts.scheme, f"{host}:{port or default_port}", parts.path.rstrip("/"), "", "")
    )


class TargetSettings(BaseModel):
    """One Triton server: ``url`` is its HTTP endpoint, ``metrics_url`` its /metrics
    (default: same host, port 8002), ``name`` how the store calls it (default host:port).
    A plain string is read as the ``url``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: str
    metrics_url: str = Field("", validate_default=True)
    name: str = Field("", validate_default=True)

    @model_validator(mode="before")
    @classmethod
    def _url_alone(cls, value: object) -> object:
        return {"url": value} if isinstance(value, str) else value

    @field_validator("url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        return _normalise_url(value, default_port=DEFAULT_HTTP_PORT)

    @field_validator("metrics_url")
    @classmethod
    def _metrics_url(cls, value: str, info: ValidationInfo) -> str:
        if value:
            metrics = _normalise_url(value, default_port=DEFAULT_METRICS_PORT)
            return metrics if urlsplit(metrics).path not in ("", "/") else metrics + "/metrics"
        if "url" not in info.data:  # the url is invalid and already reported
            return value
        parts = urlsplit(str(info.data["url"]))
        return urlunsplit(
            (parts.scheme, f"{parts.hostname}:{DEFAULT_METRICS_PORT}", "/metrics", "", "")
        )

    @field_validator("name")
    @classmethod
    def _name(cls, value: str, info: ValidationInfo) -> str:
        return value or (str(urlsplit(info.data["url"]).netloc) if "url" in info.data else value)


class RetentionSettings(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    raw_keep_s: Seconds = 7 * 24 * 3600.0  # raw per-scrape samples
    rollup_keep_s: Seconds = 90 * 24 * 3600.0  # coarse buckets for long windows
    rollup_bucket_s: Seconds = 300.0
    every_s: Seconds = 300.0  # how often the retention job runs


class ApplySettings(BaseModel):
    """How a recommendation is applied and judged (``collector.apply``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    before_s: Seconds = 30.0  # the window measured before the change
    after_s: Seconds = 30.0  # and after it
    settle_s: Annotated[float, Field(ge=0, allow_inf_nan=False)] = 1.0  # reload → after
    # Kept only when throughput after / before is at least this.
    min_qps_ratio: Annotated[Positive, Field(le=1)] = 0.95
    # Without a latency objective: rolled back when p95 after / before exceeds this.
    max_p95_ratio: Annotated[Positive, Field(ge=1)] = 1.10
    load_timeout_s: Seconds = 120.0  # Triton answers a load once the model is ready


_LABEL = r"[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}\Z){_LABEL}(\.{_LABEL})*")


def host_name_setting(text: str) -> str:
    """A host name or IP address as a browser sends it in ``Host`` (lower case; an
    address in its short form); ``ValueError`` for anything else (a URL, a port)."""
    name = str(text).strip().lower()
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        return ipaddress.ip_address(bare).compressed
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(name):
        raise ValueError(
            f"{text!r} is not a host name or address: give the name alone, as the "
            "browser's address bar shows it, without scheme, port or path "
            "(e.g. dash.example.com)"
        )
    return name


class UiSettings(BaseModel):
    """The web UI's access and actions. A password set means login is required."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # SecretStr: printed, dumped or put in an error, each shows as '**********'.
    admin_password: SecretStr | None = Field(default=None, repr=False, min_length=1)
    viewer_password: SecretStr | None = Field(default=None, repr=False, min_length=1)
    secret_key: SecretStr | None = Field(default=None, repr=False, min_length=1)
    # The before/after windows of an Apply from the UI; None: those of ``apply``.
    apply_verify_s: Annotated[Seconds | None, BeforeValidator(_none_words)] = None
    # More names the UI answers to (a reverse proxy's), besides its loopback names;
    # set, the Host of every request is checked whatever the bind address.
    allowed_hosts: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)] = ()
    # Mark the session cookie Secure (the UI is reached over https, through a proxy).
    cookie_secure: bool = False
    # How many reverse proxies in front of the UI to believe X-Forwarded-For and
    # X-Forwarded-Proto from (the client address of the login limit; https).
    trusted_proxies: Annotated[int, BeforeValidator(_not_bool), Field(ge=0, le=10)] = 0
    # Failed sign-ins (form or bearer token) one client address may make per window.
    login_attempts: Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=10_000)] = 5
    login_window_s: Seconds = 60.0

    @field_validator("allowed_hosts")
    @classmethod
    def _host_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(host_name_setting(name) for name in value)

    @field_validator("viewer_password")
    @classmethod
    def _differs_from_admin(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        admin = info.data.get("admin_password")
        if value and admin and value.get_secret_value() == admin.get_secret_value():
            raise ValueError("must differ from ui.admin_password")
        return value

    @property
    def login_required(self) -> bool:
        return bool(self.admin_password or self.viewer_password)


class Settings(BaseSettings):
    """Everything batchscope is told. ``Settings(...)`` takes the values as given;
    ``load_settings`` layers the file, the environment and the command line."""

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        env_prefix=ENV_PREFIX,
        env_nested_delimiter="_",
        env_nested_max_split=1,
    )

    targets: Annotated[tuple[TargetSettings, ...], NoDecode, BeforeValidator(_comma_list)] = ()
    db_url: str = Field(default="sqlite:///batchscope.db", repr=False)  # may hold a password
    interval_s: Seconds = 5.0
    duration_s: Annotated[Seconds | None, BeforeValidator(_none_words)] = None
    timeout_s: Seconds = 3.0
    # Triton's statistics API (batch sizes and their compute times) is read at most this
    # often, the metrics every interval_s: its document is most of a scrape's cost, and
    # its counters are cumulative, so a window loses nothing but its last seconds.
    statistics_interval_s: Seconds = 5.0
    max_response_bytes: Annotated[int, BeforeValidator(_not_bool), Field(gt=0)] = 16 * 1024**2
    sources: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)] = (
        "triton",
        "nvml",
        "host",
    )
    backoff_max_s: Seconds = 60.0
    jitter_s: Annotated[float, BeforeValidator(_not_bool), Field(ge=0)] = 0.5
    # Scrapes in flight at once: a bounded pool, however many targets there are.
    scrape_workers: Annotated[int, BeforeValidator(_not_bool), Field(ge=1, le=1024)] = 16
    # While the store cannot take writes (locked, disk full, database restarting), the
    # scrapes' writes are held in memory up to these bounds and written in order once
    # it is back; over either bound the oldest are dropped (collector.store.buffer).
    store_buffer_max_writes: Annotated[int, BeforeValidator(_not_bool), Field(ge=1)] = 5000
    store_buffer_max_bytes: Annotated[int, BeforeValidator(_not_bool), Field(ge=1024)] = (
        128 * 1024**2
    )
    # Prometheus file_sd files (paths or glob patterns) listing more targets
    # (collector.discovery), looked at every ``file_sd_refresh_s``.
    file_sd: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)] = ()
    file_sd_refresh_s: Seconds = 5.0
    # DNS SRV names whose records list more targets (collector.dns_sd), looked up
    # every ``dns_sd_refresh_s``: each record's host and port is a Triton server's HTTP
    # endpoint, its metrics on ``dns_sd_metrics_port`` of that host ("same": the
    # record's port). The nameserver is the system's unless ``dns_sd_nameserver``
    # ("ADDRESS" or "ADDRESS:PORT", e.g. Consul's 127.0.0.1:8600) says otherwise.
    dns_sd: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)] = ()
    dns_sd_refresh_s: Seconds = 30.0
    dns_sd_nameserver: Annotated[str | None, BeforeValidator(_none_words)] = None
    dns_sd_metrics_port: int | str = DEFAULT_METRICS_PORT
    # "i/n": this collector scrapes the targets whose stable hash mod n is i.
    shard: Annotated[str | None, BeforeValidator(_none_words)] = None
    analysis_every_s: Seconds = 15.0
    # Latency objective per model name, in ms of p95; models without one may not get
    # more than ``apply.max_p95_ratio`` slower at p95 from a recommendation.
    slo_p95_ms: dict[str, Seconds] = Field(default_factory=dict)
    # Detector thresholds (collector.analysis.detect.DetectorSettings), by field name.
    analysis: dict[str, object] = Field(default_factory=dict)
    retention: RetentionSettings = RetentionSettings()
    recommend_every_s: Seconds = 60.0
    apply: ApplySettings = ApplySettings()
    ui: UiSettings = UiSettings()
    alerts: AlertSettings = AlertSettings()
    # Fleet mode: the Prometheus (its base URL) whose Triton series the ``prometheus``
    # source reads, instead of scraping each server (collector.sources.prometheus).
    prometheus_url: str | None = None

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_base_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"{value!r} is not an http(s) URL of a Prometheus server")
        return value.strip().rstrip("/")

    @field_validator("file_sd")
    @classmethod
    def _file_sd_paths(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        if any(not path.strip() for path in value):
            raise ValueError("must be a list of file paths (or glob patterns)")
        return tuple(path.strip() for path in value)

    @field_validator("dns_sd")
    @classmethod
    def _dns_sd_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        names = tuple(name.strip() for name in value)
        for name in names:
            if not _DNS_NAME.fullmatch(name) or len(name.rstrip(".")) > 253:
                raise ValueError(
                    f"{name!r} is not a DNS name (such as _http._tcp.triton.example.com)"
                )
        return names

    @field_validator("dns_sd_nameserver")
    @classmethod
    def _dns_sd_nameserver(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parse_nameserver(value)
        return value.strip()

    @field_validator("dns_sd_metrics_port", mode="before")
    @classmethod
    def _dns_sd_metrics_port(cls, value: object) -> int | str:
        if isinstance(value, str) and value.strip().lower() == "same":
            return "same"
        text = str(value).strip() if isinstance(value, int | str) else ""
        if isinstance(value, bool) or not text.isdigit() or not 0 < int(text) < 65536:
            raise ValueError(f"must be a port 1..65535 or 'same', got {value!r}")
        return int(text)

    @property
    def dns_sd_metrics_port_number(self) -> int | None:
        """``dns_sd_metrics_port`` as a port; None for "same" (each record's port)."""
        port = self.dns_sd_metrics_port
        return port if isinstance(port, int) else None

    @field_validator("shard")
    @classmethod
    def _shard_i_of_n(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parse_shard(value)
        return value.strip()

    @property
    def shard_of(self) -> tuple[int, int] | None:
        """``(i, n)`` from ``shard``; None when this collector takes every target."""
        return None if self.shard is None else parse_shard(self.shard)

    @field_validator("targets", mode="after")
    @classmethod
    def _targets_unique(cls, value: tuple[TargetSettings, ...]) -> tuple[TargetSettings, ...]:
        names = [t.name for t in value]
        twice = [name for name in names if names.count(name) > 1]
        if twice:
            raise ValueError(f"target name {twice[0]!r} appears twice")
        return value

    @field_validator("db_url")
    @classmethod
    def _sqlalchemy_url(cls, value: str) -> str:
        from sqlalchemy.engine import make_url
        from sqlalchemy.exc import ArgumentError

        try:
            make_url(value.strip())
        except ArgumentError as exc:
            raise ValueError(f"is not an SQLAlchemy URL ({exc})") from None
        return value.strip()

    @field_validator("timeout_s")
    @classmethod
    def _timeout_within_ten_intervals(cls, value: float, info: ValidationInfo) -> float:
        interval = info.data.get("interval_s")
        if interval is not None and value > interval * 10:
            raise ValueError(f"{value:g} s is more than ten scrape intervals ({interval:g} s)")
        return value

    @field_validator("statistics_interval_s")
    @classmethod
    def _statistics_often_enough(cls, value: float) -> float:
        if value > MAX_STATISTICS_INTERVAL_S:
            raise ValueError(
                f"{value:g} s is more than {MAX_STATISTICS_INTERVAL_S:g} s: a minute's "
                f"window needs several readings of the statistics"
            )
        return value

    @field_validator("analysis")
    @classmethod
    def _detector_thresholds(cls, value: dict[str, object]) -> dict[str, object]:
        if value:
            # Raises ConfigError naming analysis.<field>; imported here, as the detectors
            # import the store and the store imports these settings.
            from collector.analysis.detect import detector_settings

            detector_settings(value)
        return value

    @property
    def ui_apply(self) -> ApplySettings:
        """``apply`` with the UI's own windows when ``ui.apply_verify_s`` is set."""
        verify_s = self.ui.apply_verify_s
        if verify_s is None:
            return self.apply
        return self.apply.model_copy(update={"before_s": verify_s, "after_s": verify_s})

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Constructed directly, the model takes its arguments only: the layers are
        # load_settings's to add, with the environment it is given.
        return (init_settings,)


def parse_shard(text: str) -> tuple[int, int]:
    """``(i, n)`` from ``"i/n"`` with ``0 <= i < n``; ``ValueError`` saying what is wrong."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", str(text))
    if match is None:
        raise ValueError('must be "i/n" (this collector is shard i of n, from 0), e.g. "0/3"')
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1:
        raise ValueError("n must be at least 1")
    if index >= count:
        raise ValueError(f"i must be 0..{count - 1} (shards count from 0)")
    return index, count


def target_from_url(
    url: str,
    metrics_url: str | None = None,
    name: str | None = None,
    *,
    field_name: str = "targets",
) -> TargetSettings:
    """Build a target from Triton's HTTP URL; the metrics URL defaults to the same host
    on port 8002 with path ``/metrics``. A bare ``host:port`` means ``http://host:port``."""
    try:
        return TargetSettings(url=url, metrics_url=metrics_url or "", name=name or "")
    except ValidationError as exc:
        error = exc.errors()[0]
        where = "metrics_url" if error["loc"][:1] == ("metrics_url",) else field_name
        message = scrub_url_passwords(f"{_message(error)}, got {error['input']!r}")
        raise ConfigError(where, message) from None


def _targets_from_url_lists(layer: dict[str, Any], origin: str) -> dict[str, Any]:
    """One layer's ``triton`` and ``metrics_url`` lists (flags, environment) as its
    ``targets``: a layer that names Triton URLs replaces the targets of the layers below."""
    layer = {k: v for k, v in layer.items() if v is not None}
    urls = _comma_list(layer.pop("triton", None)) or []
    metrics_urls = _comma_list(layer.pop("metrics_url", None)) or []
    if not isinstance(urls, list) or not isinstance(metrics_urls, list):
        raise ConfigError("triton", f"must be a list of URLs ({origin})")
    if metrics_urls and not urls:
        raise ConfigError("metrics_url", f"given without a Triton URL ({origin})")
    if metrics_urls and len(metrics_urls) != len(urls):
        raise ConfigError(
            "metrics_url",
            f"{len(metrics_urls)} metrics URL(s) given for "
            f"{len(urls)} Triton target(s) ({origin}); give one "
            "per target or none",
        )
    if urls:
        layer["targets"] = [
            target_from_url(
                url, metrics_urls[i] if metrics_urls else None, field_name="triton"
            ).model_dump()
            for i, url in enumerate(urls)
        ]
    return layer


class _Environment(EnvSettingsSource):
    """``BATCHSCOPE_*`` variables of a given mapping (``os.environ`` by default)."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(
            self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str
        )

    def __call__(self) -> dict[str, Any]:
        layer = super().__call__()
        for key in ("triton", "metrics_url"):
            if ENV_PREFIX + key.upper() in self._environ:
                layer[key] = self._environ[ENV_PREFIX + key.upper()]
        return _targets_from_url_lists(layer, "environment")


def _read_file(path: Path) -> dict[str, Any]:
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise ConfigError("config", f"cannot read {path}: {exc.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError("config", f"{path} is not UTF-8 text (byte {exc.start})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("config", f"{path} is not valid YAML: {_yaml_problem(exc)}") from None
    except RecursionError:
        raise ConfigError("config", f"{path} is not valid YAML: nested too deeply") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("config", f"{path} must hold a mapping at the top level")
    for key in data:
        if not isinstance(key, str):  # YAML's 1:, null: or [a]: -- no setting's name
            raise ConfigError("config", f"{path}: top-level key {key!r} is not a setting name")
    return data


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, without the excerpt of the file PyYAML adds to its
    message: the line at fault may hold a password or a secret."""
    if isinstance(exc, yaml.reader.ReaderError):
        return f"a character YAML does not allow (position {exc.position})"
    if not isinstance(exc, yaml.MarkedYAMLError):
        return type(exc).__name__
    problem = exc.problem or exc.context or "syntax error"
    mark = exc.problem_mark or exc.context_mark
    if mark is None:
        return problem
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})"


def load_settings(
    *,
    config_file: str | Path | None = None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    known_sources: set[str] | None = None,
) -> Settings:
    """Merge defaults < YAML file < environment < ``overrides`` (the CLI) and validate.

    ``overrides`` takes the same keys as the YAML file, plus ``triton`` and
    ``metrics_url`` (lists of URLs, the CLI's ``--triton``/``--metrics-url``); a ``None``
    value means "not given". Mappings (``retention``, ``apply``, ``ui`` ...) merge key
    by key across the layers.
    """
    env = os.environ if env is None else env
    if config_file is None and env.get(ENV_PREFIX + "CONFIG"):
        config_file = env[ENV_PREFIX + "CONFIG"]
    layers: list[PydanticBaseSettingsSource] = [  # highest priority first
        InitSettingsSource(
            Settings, _targets_from_url_lists(dict(overrides or {}), "command line")
        ),
        _Environment(Settings, env),
    ]
    if config_file is not None:
        file_layer = _targets_from_url_lists(_read_file(Path(config_file)), f"file {config_file}")
        layers.append(InitSettingsSource(Settings, file_layer))
    try:
        # The synthesised signature lists the fields only; _build_sources is documented.
        settings = Settings(_build_sources=(tuple(layers), {}))  # type: ignore[call-arg]
    except ValidationError as exc:
        raise _config_error(exc) from None
    except SettingsError as exc:  # an environment variable that is not valid JSON
        field = re.search(r'field "([^"]+)"', str(exc))
        raise ConfigError(
            field.group(1) if field else "config", "is not valid JSON in the environment"
        ) from None
    if known_sources is not None:
        for name in settings.sources:
            if name not in known_sources:
                raise ConfigError(
                    "sources", f"unknown source {name!r}; known: {', '.join(sorted(known_sources))}"
                )
    return settings


def _dotted(loc: tuple[int | str, ...]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _message(error: Mapping[str, Any]) -> str:
    if error["type"] == "value_error":  # ours: the message without pydantic's prefix
        return str((error.get("ctx") or {}).get("error", error["msg"]))
    words = {
        "missing": "is required",
        "extra_forbidden": "unknown key",
        "string_too_short": "must be a non-empty string",
    }
    return words.get(error["type"], str(error["msg"]).lower())


def _config_error(exc: ValidationError) -> ConfigError:
    error = exc.errors()[0]
    field = _dotted(tuple(error["loc"]))
    message = _message(error)
    if error["type"] == "extra_forbidden" and len(error["loc"]) == 1:
        message = "unknown setting"
    elif error["type"] not in ("missing", "extra_forbidden") and _may_echo(error):
        message += f", got {error['input']!r}"
    return ConfigError(field or "config", scrub_url_passwords(message))


def _may_echo(error: Mapping[str, Any]) -> bool:
    """Whether an invalid value may be shown: not a secret, not a value that may hold
    one (a database URL, a receiver), and not a mapping or list (a whole group such as
    ``ui`` given wrongly holds its passwords)."""
    loc = tuple(map(str, error["loc"]))
    if _SECRETS & set(loc) or loc in (("ui",), ("alerts",)):
        return False
    return not isinstance(error["input"], dict | list | tuple)


def scrub_url_passwords(text: str) -> str:
    """``text`` with the password of every ``scheme://user:password@host`` as ``***``."""
    return _URL_PASSWORD.sub(r"\1***@", text)
