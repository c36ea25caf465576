"""The ``alerts`` settings group (``collector.config.Settings.alerts``): receivers
(webhook, Slack, Alertmanager), routes, rule overrides and delivery. Every invalid
value is a validation error naming its field, or a ``ConfigError`` that does; a
secret (a webhook's ``whsec_`` secret, a Slack URL with its token) is a ``SecretStr``,
never shown in a repr, a message or a log.
"""

from __future__ import annotations

import base64
import binascii
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from collector.errors import ConfigError
from collector.settings_fields import Positive, Seconds, not_bool

__all__ = [
    "Severity",
    "RECEIVER_KINDS",
    "AlertRuleSettings",
    "AlertSettings",
    "AlertmanagerReceiver",
    "ReceiverSettings",
    "RouteSettings",
    "SlackReceiver",
    "WebhookReceiver",
    "signing_key",
]

#: Receiver kinds: each receiver has exactly one of these keys.
RECEIVER_KINDS = ("webhook", "slack", "alertmanager")
#: How urgent an alert is (a rule's severity, a route's match).
Severity = Literal["info", "warning", "critical"]
_WHSEC = "whsec_"


def _http_url(value: str) -> str:
    """An ``http(s)://host[:port][/path]`` URL, kept as written (a webhook's path and
    query matter); raises ``ValueError`` saying what is wrong."""
    text = value.strip()
    if not text or any(c.isspace() for c in text):
        raise ValueError("must be a URL such as https://host/path (no spaces)")
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https"):
        raise ValueError("must be an http:// or https:// URL")
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        raise ValueError("port is not a number") from None
    if not parts.hostname:
        raise ValueError("has no host")
    return text


HttpUrl = Annotated[str, AfterValidator(_http_url)]


def signing_key(secret: str) -> bytes:
    """The HMAC key of a Standard Webhooks secret ``whsec_<base64>``; ``ValueError``
    (without the secret in it) when it is not one."""
    text = secret.strip()
    if not text.startswith(_WHSEC):
        raise ValueError("must be whsec_ followed by the base64 key")
    try:
        key = base64.b64decode(text[len(_WHSEC) :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("the part after whsec_ is not valid base64") from None
    if not key:
        raise ValueError("the part after whsec_ is empty")
    return key


class WebhookReceiver(BaseModel):
    """A webhook: the Alertmanager payload (version 4), signed the Standard Webhooks way
    when a secret is given: ``secret`` itself, or read from ``secret_file`` or the
    environment variable ``secret_env`` at start."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: HttpUrl
    secret: SecretStr | None = None
    secret_file: Path | None = None
    secret_env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _secret_from_file_or_env(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        given = [k for k in ("secret", "secret_file", "secret_env") if value.get(k)]
        if len(given) > 1:
            raise ValueError(f"give one of secret, secret_file, secret_env, not {given}")
        if value.get("secret_file"):
            path = Path(str(value["secret_file"]))
            try:
                text = path.read_text().strip()
            except OSError as exc:
                raise ValueError(f"secret_file: cannot read {path}: {exc.strerror}") from None
            _check_secret(text, f"secret_file {path}")
            return {**value, "secret": text}
        if value.get("secret_env"):
            name = str(value["secret_env"])
            text = os.environ.get(name, "").strip()
            if not text:
                raise ValueError(f"secret_env: the environment variable {name} is not set")
            _check_secret(text, f"secret_env {name}")
            return {**value, "secret": text}
        return value

    @field_validator("secret")
    @classmethod
    def _whsec(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None:
            signing_key(value.get_secret_value())
        return value

    @property
    def key(self) -> bytes | None:
        """The HMAC key, or ``None`` for an unsigned webhook."""
        return None if self.secret is None else signing_key(self.secret.get_secret_value())


def _check_secret(text: str, where: str) -> None:
    try:
        signing_key(text)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from None


class SlackReceiver(BaseModel):
    """A Slack incoming webhook; its URL holds the token, so it is never printed."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: Annotated[SecretStr, AfterValidator(lambda v: SecretStr(_http_url(v.get_secret_value())))]


class AlertmanagerReceiver(BaseModel):
    """An Alertmanager (its base URL): alerts are posted to ``/api/v2/alerts`` and
    re-sent every ``resend_s`` while firing (shorter than its ``resolve_timeout``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    url: HttpUrl
    resend_s: Seconds = 60.0


class ReceiverSettings(BaseModel):
    """One place notifications go: a ``name`` and exactly one receiver kind."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: Annotated[str, Field(min_length=1)]
    webhook: WebhookReceiver | None = None
    slack: SlackReceiver | None = None
    alertmanager: AlertmanagerReceiver | None = None

    @model_validator(mode="before")
    @classmethod
    def _one_known_kind(cls, value: object) -> object:
        if not isinstance(value, dict):
            return value
        unknown = [k for k in value if k != "name" and k not in RECEIVER_KINDS]
        if unknown:
            raise ValueError(
                f"unknown receiver kind {unknown[0]!r}; known: {', '.join(RECEIVER_KINDS)}"
            )
        kinds = [k for k in RECEIVER_KINDS if value.get(k) is not None]
        if len(kinds) != 1:
            raise ValueError(f"needs exactly one of {', '.join(RECEIVER_KINDS)}, got {len(kinds)}")
        return value

    @property
    def kind(self) -> str:
        return next(k for k in RECEIVER_KINDS if getattr(self, k) is not None)


class RouteSettings(BaseModel):
    """Alerts whose labels equal every entry of ``match`` and whose severity is one
    of ``severity`` (empty: any) go to ``receivers``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    match: dict[str, str] = Field(default_factory=dict)
    severity: tuple[Severity, ...] = ()
    receivers: Annotated[tuple[str, ...], Field(min_length=1)]

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.severity and labels.get("severity") not in self.severity:
            return False
        return all(labels.get(k) == v for k, v in self.match.items())


class AlertRuleSettings(BaseModel):
    """Overrides for one alert rule: how long its condition must hold before it fires
    (``for_s``), its severity, and whether it is evaluated at all."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    for_s: Annotated[float | None, Field(ge=0, allow_inf_nan=False)] = None
    severity: Severity | None = None
    enabled: bool = True


class AlertSettings(BaseModel):
    """Alert rules, receivers and routes (``alerts``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    receivers: tuple[ReceiverSettings, ...] = ()
    routes: tuple[RouteSettings, ...] = ()
    dashboard_url: HttpUrl | None = None
    repeat_interval_s: Seconds = 4 * 3600.0
    max_attempts: Annotated[int, BeforeValidator(not_bool), Field(gt=0, le=100)] = 8
    backoff_s: Seconds = 2.0
    backoff_max_s: Seconds = 600.0
    timeout_s: Seconds = 10.0
    deliver_every_s: Seconds = 1.0  # how often the outbox is looked at for due sends
    # Finished notifications, resolved alerts and ended silences are kept this long.
    keep_s: Seconds = 30 * 86400.0
    failure_share: Annotated[Positive, Field(le=1)] = 0.05
    # An alert whose condition could not be evaluated (no fresh data) for this long
    # resolves: nothing is known of it any more.
    no_data_resolve_s: Seconds = 900.0
    rules: dict[str, AlertRuleSettings] = Field(default_factory=dict)

    @field_validator("receivers")
    @classmethod
    def _names_unique(cls, value: tuple[ReceiverSettings, ...]) -> tuple[ReceiverSettings, ...]:
        names = [r.name for r in value]
        twice = [n for n in names if names.count(n) > 1]
        if twice:
            raise ValueError(f"receiver name {twice[0]!r} appears twice")
        return value

    @field_validator("routes")
    @classmethod
    def _routes_to_known_receivers(
        cls, value: tuple[RouteSettings, ...], info: ValidationInfo
    ) -> tuple[RouteSettings, ...]:
        known = {r.name for r in info.data.get("receivers", ())}
        for i, route in enumerate(value):
            for name in route.receivers:
                if name not in known:
                    raise ConfigError(
                        f"alerts.routes[{i}].receivers",
                        f"no receiver named {name!r}; known: {', '.join(sorted(known)) or 'none'}",
                    )
        return value

    @field_validator("rules")
    @classmethod
    def _known_rules(cls, value: dict[str, AlertRuleSettings]) -> dict[str, AlertRuleSettings]:
        # Imported here: the rules read the store, and the store imports these settings.
        from alerts.rules import RULE_NAMES

        for name in value:
            if name not in RULE_NAMES:
                raise ConfigError(
                    f"alerts.rules.{name}", f"unknown rule; known: {', '.join(RULE_NAMES)}"
                )
        return value

    def receiver(self, name: str) -> ReceiverSettings:
        """The receiver called ``name``; ``KeyError`` when there is none."""
        for r in self.receivers:
            if r.name == name:
                return r
        raise KeyError(name)

    def receivers_for(self, labels: Mapping[str, str]) -> tuple[str, ...]:
        """The receivers an alert with ``labels`` goes to: without routes, every one;
        with routes, those of every route that matches (none when none matches)."""
        if not self.routes:
            return tuple(r.name for r in self.receivers)
        chosen: list[str] = []
        for route in self.routes:
            if route.matches(labels):
                chosen += [n for n in route.receivers if n not in chosen]
        return tuple(chosen)
