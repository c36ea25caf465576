"""Targets from DNS SRV records, as Prometheus's ``dns_sd_configs`` finds them.

Each name in ``dns_sd`` is looked up for SRV records; each record's host and port is a
Triton server's HTTP endpoint (as ``--triton``), and its metrics are on the same host,
port ``dns_sd_metrics_port`` (8002; ``same``: the record's own port, for a server that
serves both on one port). That is what a Kubernetes headless Service publishes for its
named ports (``_http._tcp.triton.NAMESPACE.svc.cluster.local``, one record per ready
pod) and what Consul's DNS interface answers (``_triton._tcp.service.consul``, on
``dns_sd_nameserver: 127.0.0.1:8600``).

``DnsSd.load`` looks every name up at start; ``DnsSd.refresh`` looks again (every
``dns_sd_refresh_s``) and returns the new target list when it changed. A name that
does not exist or holds no SRV records (NXDOMAIN, no answer) gives its targets up, as
in Prometheus (a Service with no ready pod); a lookup that fails otherwise (a timeout,
no nameserver answering) keeps the name's last good targets. Either is logged once per
change, and neither stops the start: the servers may come up after the collector.
What is checked at start are the settings themselves (``collector.config``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import dns.exception
import dns.name
import dns.rdatatype
import dns.resolver

from collector.config import TargetSettings, parse_nameserver
from collector.discovery import METRICS_PORT_LABEL, address_target, merge_targets
from collector.errors import ConfigError

__all__ = ["LOOKUP_TIMEOUT_S", "DnsSd"]

log = logging.getLogger("batchscope.discovery")

# Each refresh's lookup of one name gives up after this long (all tries together), so
# a dead nameserver holds the refresh job, and a shutdown, for seconds at most.
LOOKUP_TIMEOUT_S = 5.0
_TRY_TIMEOUT_S = 2.0


class _LookupFailed(Exception):
    """A name's lookup that gave no records; ``gone``: the name has none (NXDOMAIN or
    no SRV answer), not merely no answer now."""

    def __init__(self, reason: str, *, gone: bool) -> None:
        super().__init__(reason)
        self.gone = gone


@dataclass
class _Name:
    targets: list[TargetSettings] = field(default_factory=list)  # the last good lookup's
    error: str | None = None  # the failure last logged for this name


class DnsSd:
    """The targets of the SRV records of ``names`` (see the module docstring).
    ``metrics_port`` None: the metrics are on each record's own port."""

    setting = "dns_sd"

    def __init__(
        self,
        names: Sequence[str],
        *,
        nameserver: str | None = None,
        metrics_port: int | None = 8002,
        timeout_s: float = LOOKUP_TIMEOUT_S,
    ) -> None:
        self.names = list(dict.fromkeys(names))
        self._metrics_port = metrics_port
        try:
            resolver = dns.resolver.Resolver(configure=nameserver is None)
        except dns.exception.DNSException as exc:  # no /etc/resolv.conf, or none in it
            raise ConfigError(
                "dns_sd_nameserver",
                f"no nameserver to ask for the dns_sd names ({exc}): set dns_sd_nameserver",
            ) from None
        if nameserver is not None:
            address, port = parse_nameserver(nameserver)
            resolver.nameservers = [address]
            resolver.port = port
        resolver.lifetime = timeout_s
        resolver.timeout = min(_TRY_TIMEOUT_S, timeout_s)
        self._resolver = resolver
        self._found: dict[str, _Name] = {name: _Name() for name in self.names}

    def load(self) -> list[TargetSettings]:
        """Look every name up now (a failure is logged, not raised: the name's targets
        come at a later refresh)."""
        self.refresh()
        return self.targets()

    def targets(self) -> list[TargetSettings]:
        """The targets of every name's last good lookup, each name once (first wins)."""
        return merge_targets(found.targets for found in self._found.values())

    def refresh(self) -> list[TargetSettings] | None:
        """The targets when a name's records changed since the last look, else None."""
        changed = False
        for name, found in self._found.items():
            try:
                targets = self._lookup(name)
            except _LookupFailed as exc:
                reason = str(exc)
                if exc.gone and found.targets:
                    log.warning(
                        "dns_sd: %s: %s; its %d target(s) stop", name, reason, len(found.targets)
                    )
                    found.targets = []
                    changed = True
                elif reason != found.error:
                    kept = "" if exc.gone else f"; keeping its last good {len(found.targets)}"
                    log.warning("dns_sd: %s: %s%s", name, reason, kept and kept + " target(s)")
                found.error = reason
                continue
            if found.error is not None:
                log.info("dns_sd: %s answers again: %d target(s)", name, len(targets))
            found.error = None
            if targets != found.targets:
                found.targets = targets
                changed = True
        return self.targets() if changed else None

    def _lookup(self, name: str) -> list[TargetSettings]:
        """The targets of ``name``'s SRV records, ordered by host and port."""
        try:
            answer = self._resolver.resolve(name, dns.rdatatype.SRV, search=True)
        except (dns.resolver.NXDOMAIN, dns.resolver.NoAnswer) as exc:
            raise _LookupFailed(f"no SRV records ({type(exc).__name__})", gone=True) from None
        except dns.resolver.LifetimeTimeout:
            raise _LookupFailed(
                f"no answer within {self._resolver.lifetime:g} s", gone=False
            ) from None
        except dns.exception.DNSException as exc:
            raise _LookupFailed(" ".join(str(exc).split())[:300], gone=False) from None
        # RFC 2782: a target of "." says the service is not available there.
        endpoints = sorted(
            {
                (rr.target.to_text(omit_final_dot=True), int(rr.port))
                for rr in answer
                if rr.target != dns.name.root
            }
        )
        targets = []
        for host, port in endpoints:
            metrics_port = port if self._metrics_port is None else self._metrics_port
            address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            try:
                labels = {METRICS_PORT_LABEL: str(metrics_port)}
                targets.append(address_target(address, labels, name, setting=self.setting))
            except ConfigError as exc:  # a host name no URL can hold
                log.warning("dns_sd: %s: record %s left out: %s", name, address, exc)
        return targets
