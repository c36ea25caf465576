"""Where a Triton server exports its metrics, found for a command given only its HTTP URL.

Triton serves ``/metrics`` on a port of its own (``--metrics-port``, 8002 by default)
and its HTTP API does not say which, so ``batchscope apply --triton URL`` looks, in
this order, and takes the first candidate that answers with Triton's metrics:

1. ``--metrics-url``, when given (the only candidate then);
2. the store (``--db``): where a collector scraped a target with the same URL;
3. a target of the settings (config file, ``BATCHSCOPE_TRITON``) with the same URL;
4. the ``tritonserver`` process on this host that serves the URL's HTTP port: its
   ``--metrics-port`` and ``--metrics-address`` (what ``testbed up`` starts is found
   this way even when nothing collected it);
5. Triton's default, the same host on port 8002.

When none answers, the ``ConfigError`` names ``--metrics-url`` and says what was tried.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import psutil
import requests

from collector.config import DEFAULT_METRICS_PORT, TargetSettings, target_from_url
from collector.errors import ConfigError
from collector.sources.host import http_port_of, is_server_process
from collector.store import TargetState

__all__ = ["FoundMetrics", "MetricsCandidate", "find_metrics_target", "process_metrics_url"]

_TIMEOUT_S = 5.0
# Every metric family Triton exports starts with this.
_TRITON_PREFIX = "nv_"
_ANY_ADDRESS = {"0.0.0.0", "::", ""}


@dataclass(frozen=True)
class MetricsCandidate:
    """A metrics URL to try, and where it came from (said when it does not answer)."""

    url: str
    origin: str


@dataclass(frozen=True)
class FoundMetrics:
    """The target with the metrics URL that answered, and where that URL came from."""

    target: TargetSettings
    origin: str


def _option(cmdline: Sequence[str], name: str) -> str | None:
    """The value of ``--name=value`` or ``--name value`` on a command line."""
    for i, arg in enumerate(cmdline):
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
        if arg == name and i + 1 < len(cmdline):
            return cmdline[i + 1]
    return None


def process_metrics_url(cmdline: Sequence[str], host: str) -> str | None:
    """The metrics URL a ``tritonserver`` command line serves, as reached at ``host``
    (the host of its HTTP URL); ``None`` when it exports no metrics."""
    if (_option(cmdline, "--allow-metrics") or "true").lower() in ("false", "0", "no"):
        return None
    port = int(_option(cmdline, "--metrics-port") or DEFAULT_METRICS_PORT)
    address = _option(cmdline, "--metrics-address") or ""
    reach = host if address in _ANY_ADDRESS else address
    if ":" in reach:  # an IPv6 literal
        reach = f"[{reach}]"
    return f"http://{reach}:{port}/metrics"


def _servers(
    processes: Callable[[], Iterable[psutil.Process]],
) -> Iterable[tuple[int, list[str]]]:
    for proc in processes():
        try:
            cmdline = proc.cmdline()
            if cmdline and is_server_process(proc, cmdline):
                yield proc.pid, cmdline
        except psutil.Error:
            continue


def _local_candidates(
    url: str, processes: Callable[[], Iterable[psutil.Process]]
) -> list[MetricsCandidate]:
    parts = urlsplit(url)
    if parts.hostname is None or parts.port is None:
        return []
    found = []
    for pid, cmdline in _servers(processes):
        try:
            if http_port_of(cmdline) != parts.port:
                continue
            metrics = process_metrics_url(cmdline, parts.hostname)
        except ValueError:  # a port that is not a number: not a server we can read
            continue
        if metrics is not None:
            found.append(MetricsCandidate(metrics, f"tritonserver pid {pid} on this host"))
    return found


def _default_url(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or "localhost"
    try:
        if ipaddress.ip_address(host).version == 6:
            host = f"[{host}]"
    except ValueError:
        pass
    return urlunsplit(("http", f"{host}:{DEFAULT_METRICS_PORT}", "/metrics", "", ""))


def candidates(
    target: TargetSettings,
    configured: Iterable[TargetSettings],
    processes: Callable[[], Iterable[psutil.Process]],
    stored: Iterable[TargetState] = (),
) -> list[MetricsCandidate]:
    """Steps 2 to 5 of the module docstring for ``target`` (built from ``--triton``),
    in order, each URL once."""
    default = _default_url(target.url)
    found = [
        MetricsCandidate(t.metrics_url, "the store")
        for t in stored
        if t.url == target.url and t.metrics_url
    ]
    # A configured target whose metrics URL is the default says nothing more than step 5.
    found += [
        MetricsCandidate(t.metrics_url, "the settings")
        for t in configured
        if t.url == target.url and t.metrics_url != default
    ]
    found += _local_candidates(target.url, processes)
    found.append(MetricsCandidate(default, "Triton's default port"))
    unique: dict[str, MetricsCandidate] = {}
    for c in found:
        unique.setdefault(c.url, c)
    return list(unique.values())


def _answer(http: requests.Session, url: str, model: str | None) -> str | None:
    """``None`` when ``url`` serves Triton's metrics (with ``model``'s series, when
    given), else why not (a few words)."""
    try:
        response = http.get(url, timeout=_TIMEOUT_S)
    except requests.Timeout:
        return "timed out"
    except requests.ConnectionError:
        return "connection refused"
    except requests.RequestException as exc:
        return type(exc).__name__
    if not response.ok:
        return f"HTTP {response.status_code}"
    if _TRITON_PREFIX not in response.text:
        return "not Triton's metrics"
    if model is not None and f'model="{model}"' not in response.text:
        return f"no series of model {model!r}"
    return None


def find_metrics_target(
    triton_url: str,
    metrics_url: str | None,
    configured: Iterable[TargetSettings],
    *,
    http: requests.Session,
    model: str | None = None,
    processes: Callable[[], Iterable[psutil.Process]] | None = None,
    stored: Iterable[TargetState] = (),
) -> FoundMetrics:
    """The target at ``triton_url`` with a metrics URL that answers (see the module
    docstring), with series of ``model`` when given. ``ConfigError("metrics_url", ...)``
    naming ``--metrics-url`` when none does; ``ConfigError("triton", ...)`` for a URL
    that is not one."""
    target = target_from_url(triton_url, metrics_url, field_name="triton")
    if metrics_url:
        tried = [MetricsCandidate(target.metrics_url, "--metrics-url")]
    else:
        tried = candidates(
            target,
            configured,
            processes or (lambda: psutil.process_iter(["name", "cmdline"])),
            stored,
        )
    failures = []
    for candidate in tried:
        why = _answer(http, candidate.url, model)
        if why is None:
            found = target_from_url(target.url, candidate.url, target.name, field_name="triton")
            return FoundMetrics(found, candidate.origin)
        failures.append(f"{candidate.url} ({candidate.origin}: {why})")
    hint = (
        "check --metrics-url"
        if metrics_url
        else "pass --metrics-url URL (Triton's --metrics-port; `batchscope demo` prints it)"
    )
    raise ConfigError(
        "metrics_url",
        f"no Triton metrics for {target.url} at {', '.join(failures)}; {hint}",
    )
