"""Targets from Prometheus ``file_sd`` files, and which targets fall to this shard
(``collector.dns_sd`` finds them in DNS SRV records).

A file (JSON, or YAML when its name ends in ``.yml``/``.yaml``) holds target groups,
exactly as Prometheus's ``file_sd_configs`` reads them::

    [{"targets": ["triton-a:8000", "triton-b:8000"], "labels": {"zone": "a"}}]

Each address is a Triton server's HTTP endpoint (``host:port``, port 8000 when left
out; the same as ``--triton``), and its metrics are on the same host, port 8002, path
``/metrics``. Labels of the group say otherwise:

``__batchscope_http_port``
    the address is the *metrics* endpoint (as a file written for Prometheus lists it,
    ``host:8002``) and the HTTP API is on this port of the same host.
``__batchscope_metrics_port``
    the address is the HTTP endpoint and the metrics are on this port.
``__metrics_path__``, ``__scheme__``
    Prometheus's own labels: the metrics path, and ``https`` for both endpoints.

Other labels are ignored. Prometheus drops labels that start with ``__`` after
relabelling, so one file can serve Prometheus and batchscope alike.

``FileSd.load`` reads the files at start and raises a ``ConfigError`` naming the
file and the entry. ``FileSd.refresh`` looks at them again (a ``stat`` per file when
nothing changed) and returns the new target list when something did; a file that
became unreadable or invalid keeps its last good targets and is reported once, and a
file deleted gives its targets up (as Prometheus does).
"""

from __future__ import annotations

import glob
import json
import logging
import os
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import yaml
from pydantic import ValidationError

from collector.config import DEFAULT_HTTP_PORT, DEFAULT_METRICS_PORT, TargetSettings
from collector.errors import ConfigError

__all__ = [
    "HTTP_PORT_LABEL",
    "METRICS_PORT_LABEL",
    "DISCOVERY_SETTINGS",
    "FileSd",
    "TargetFinder",
    "address_target",
    "in_shard",
    "merge_targets",
    "shard_index",
    "targets_from_groups",
]

log = logging.getLogger("batchscope.discovery")

HTTP_PORT_LABEL = "__batchscope_http_port"
METRICS_PORT_LABEL = "__batchscope_metrics_port"
_GLOB_CHARS = frozenset("*?[")
_Loader: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def shard_index(name: str, count: int) -> int:
    """The shard (0..count-1) a target falls to: CRC-32 of its name, the same in every
    process and on every machine (unlike Python's ``hash``)."""
    return zlib.crc32(name.encode("utf-8")) % count


def in_shard(name: str, shard: tuple[int, int] | None) -> bool:
    """Whether this collector (shard ``(i, n)``; None: the only one) scrapes ``name``."""
    return shard is None or shard_index(name, shard[1]) == shard[0]


def _port(labels: dict[str, str], key: str, where: str, setting: str) -> int | None:
    if key not in labels:
        return None
    text = labels[key]
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(setting, f"{where}: label {key} must be a port 1..65535, got {text!r}")
    return int(text)


def address_target(
    address: str, labels: dict[str, str], where: str, *, setting: str = "file_sd"
) -> TargetSettings:
    """The target at ``address`` (``host:port``) with file_sd ``labels``; a
    ``ConfigError`` for ``setting`` naming ``where`` when either is invalid."""
    if not isinstance(address, str) or not address.strip() or "://" in address:
        raise ConfigError(
            setting, f"{where}: a target must be host:port (no scheme), got {address!r}"
        )
    scheme = labels.get("__scheme__", "http")
    path = labels.get("__metrics_path__", "/metrics")
    http_port = _port(labels, HTTP_PORT_LABEL, where, setting)
    metrics_port = _port(labels, METRICS_PORT_LABEL, where, setting)
    if http_port is not None and metrics_port is not None:
        raise ConfigError(
            setting, f"{where}: give {HTTP_PORT_LABEL} or {METRICS_PORT_LABEL}, not both"
        )
    address = address.strip()
    try:
        # Validated as an HTTP URL first: the same messages as a --triton URL.
        TargetSettings(url=f"{scheme}://{address}", metrics_url="", name="")
    except ValidationError as exc:
        error = exc.errors()[0]
        reason = str((error.get("ctx") or {}).get("error", error["msg"]))
        raise ConfigError(setting, f"{where}: target {address!r}: {reason}") from None
    parts = urlsplit(f"{scheme}://{address}")
    host = str(parts.hostname)
    host = f"[{host}]" if ":" in host else host
    if http_port is not None:  # the address is the metrics endpoint, as Prometheus's
        return TargetSettings(
            url=f"{scheme}://{host}:{http_port}",
            metrics_url=f"{scheme}://{host}:{parts.port or DEFAULT_METRICS_PORT}{path}",
            name="",
        )
    return TargetSettings(
        url=f"{scheme}://{host}:{parts.port or DEFAULT_HTTP_PORT}",
        metrics_url=f"{scheme}://{host}:{metrics_port or DEFAULT_METRICS_PORT}{path}",
        name="",
    )


def _labels(group: dict[str, Any], where: str) -> dict[str, str]:
    labels = group.get("labels") or {}
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        raise ConfigError("file_sd", f"{where}: labels must map names to strings")
    scheme = labels.get("__scheme__", "http")
    if scheme not in ("http", "https"):
        raise ConfigError("file_sd", f"{where}: label __scheme__ must be http or https")
    path = labels.get("__metrics_path__", "/metrics")
    if not path.startswith("/") or any(c.isspace() for c in path):
        raise ConfigError(
            "file_sd", f"{where}: label __metrics_path__ must be a path, got {path!r}"
        )
    return labels


def targets_from_groups(data: object, origin: str) -> list[TargetSettings]:
    """The targets of file_sd target groups ``data`` (parsed JSON or YAML); a
    ``ConfigError`` naming ``origin`` and the group or entry when they are invalid."""
    if data is None:
        return []
    if not isinstance(data, list):
        raise ConfigError("file_sd", f"{origin}: must hold a list of target groups")
    found: dict[str, tuple[TargetSettings, str]] = {}
    for g, group in enumerate(data):
        where = f"{origin}: group {g}"
        if not isinstance(group, dict):
            raise ConfigError("file_sd", f"{where}: must be a mapping with 'targets'")
        unknown = set(group) - {"targets", "labels"}
        if unknown:
            raise ConfigError("file_sd", f"{where}: unknown key {sorted(unknown)[0]!r}")
        addresses = group.get("targets")
        if not isinstance(addresses, list):
            raise ConfigError("file_sd", f"{where}: 'targets' must be a list of host:port")
        labels = _labels(group, where)
        for t, address in enumerate(addresses):
            entry = f"{where} targets[{t}]"
            target = address_target(address, labels, entry)
            seen = found.get(target.name)
            if seen is not None and seen[0] != target:
                raise ConfigError(
                    "file_sd",
                    f"{entry}: {target.name} is also listed by {seen[1]} with other endpoints",
                )
            found.setdefault(target.name, (target, entry))
    return [target for target, _ in found.values()]


def _parse(path: Path) -> list[TargetSettings]:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ConfigError("file_sd", f"cannot read {path}: {exc.strerror}") from None
    try:
        if path.suffix.lower() in (".yml", ".yaml"):
            data = yaml.load(text, Loader=_Loader)  # noqa: S506 (a safe loader)
        else:
            data = json.loads(text)
    except (ValueError, yaml.YAMLError) as exc:
        kind = "YAML" if path.suffix.lower() in (".yml", ".yaml") else "JSON"
        first = " ".join(str(exc).split())
        raise ConfigError("file_sd", f"{path} is not valid {kind}: {first}") from None
    return targets_from_groups(data, str(path))


#: The settings that list discovered targets; each is refreshed by a job of its name
#: every ``<setting>_refresh_s``, and each has a flag ``--file-sd``, ``--dns-sd``.
DISCOVERY_SETTINGS = ("file_sd", "dns_sd")


def merge_targets(lists: Iterable[Iterable[TargetSettings]]) -> list[TargetSettings]:
    """The targets of ``lists``, each name once: where two lists name one target, the
    first list's endpoints are scraped."""
    merged: dict[str, TargetSettings] = {}
    for targets in lists:
        for target in targets:
            merged.setdefault(target.name, target)
    return list(merged.values())


class TargetFinder(Protocol):
    """Where discovered targets come from (file_sd files, DNS SRV names): ``setting``
    names the setting that lists them, for messages."""

    setting: str

    def load(self) -> list[TargetSettings]:
        """The targets at start."""
        ...

    def targets(self) -> list[TargetSettings]:
        """The targets of the last look."""
        ...

    def refresh(self) -> list[TargetSettings] | None:
        """The targets when they changed since the last look, else None."""
        ...


@dataclass
class _Seen:
    signature: tuple[int, int, int] | None  # (inode, size, mtime_ns) last looked at
    targets: list[TargetSettings]  # the last good read
    error: str | None = None  # the error last reported for this file


class FileSd:
    """The targets of the file_sd ``patterns`` (paths or glob patterns)."""

    setting = "file_sd"

    def __init__(self, patterns: Sequence[str]) -> None:
        self.patterns = list(patterns)
        self._files: dict[Path, _Seen] = {}

    def _paths(self) -> list[Path]:
        paths: list[Path] = []
        for pattern in self.patterns:
            if _GLOB_CHARS & set(pattern):
                paths.extend(Path(p) for p in sorted(glob.glob(pattern)))
            else:
                paths.append(Path(pattern))
        return list(dict.fromkeys(paths))

    @staticmethod
    def _signature(path: Path) -> tuple[int, int, int] | None:
        try:
            st = os.stat(path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns)

    def load(self) -> list[TargetSettings]:
        """Read every file now; a ``ConfigError`` naming the file and entry when one
        is missing or invalid (the check at start)."""
        self._files = {}
        for path in self._paths():
            signature = self._signature(path)
            self._files[path] = _Seen(signature, _parse(path))
        return self.targets()

    def targets(self) -> list[TargetSettings]:
        """The targets of every file's last good read, each name once (first wins)."""
        return merge_targets(seen.targets for seen in self._files.values())

    def refresh(self) -> list[TargetSettings] | None:
        """The targets when a file changed since the last look, else None. A file
        that cannot be read or is invalid keeps its last good targets and is logged
        once per change; a file deleted, or that a glob no longer matches, gives its
        targets up."""
        changed = False
        paths = self._paths()
        for path in set(self._files) - set(paths):
            del self._files[path]
            changed = True
        for path in paths:
            signature = self._signature(path)
            seen = self._files.get(path)
            if seen is not None and seen.signature == signature:
                continue
            if seen is None:
                seen = self._files[path] = _Seen(None, [])
            seen.signature = signature
            if signature is None:  # deleted: as Prometheus, its targets go
                if seen.targets:
                    log.warning(
                        "file_sd: %s is gone; its %d target(s) stop", path, len(seen.targets)
                    )
                    seen.targets = []
                    changed = True
                seen.error = None
                continue
            try:
                targets = _parse(path)
            except ConfigError as exc:
                message = str(exc)
                if message != seen.error:
                    log.error("%s; keeping its last good %d target(s)", exc, len(seen.targets))
                seen.error = message
                continue
            seen.error = None
            if targets != seen.targets:
                seen.targets = targets
                changed = True
        return self.targets() if changed else None
