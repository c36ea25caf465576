"""Targets from DNS SRV records (``dns_sd``), looked up on a real DNS server (dnsmasq
on a free port of 127.0.0.1): the records as targets, a changed record set seen at the
next refresh, a name gone giving its targets up, a dead nameserver keeping the last good
ones, the collector following the records, and ``collect --dns-sd`` end to end."""

from __future__ import annotations

import getpass
import logging
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import dns.exception
import dns.resolver
import pytest

from collector.config import Settings, TargetSettings
from collector.dns_sd import DnsSd
from collector.errors import ConfigError
from collector.scheduler import CollectorService, collector_jobs
from collector.store import Store
from tests.support import start_process, stop_process, wait_until
from tests.unit.test_fleet_targets import (
    _write,
    assert_the_one_server_scraped,
    recording_factory,
)

DNSMASQ = "dnsmasq"
NAME = "_http._tcp.triton.test"  # the zone dnsmasq answers for is test.


def _free_udp_and_tcp_port() -> int:
    """A port of 127.0.0.1 free for both UDP and TCP (dnsmasq listens on both)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
            udp.bind(("127.0.0.1", 0))
            port = int(udp.getsockname()[1])
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
                try:
                    tcp.bind(("127.0.0.1", port))
                except OSError:
                    continue
                return port
    raise AssertionError("no port free for both UDP and TCP")


class DnsServer:
    """dnsmasq answering SRV records for names under ``test.`` (NXDOMAIN for any other
    name there); ``serve`` (re)starts it with a record set, ``stop`` stops it."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_udp_and_tcp_port()
        self.nameserver = f"127.0.0.1:{self.port}"
        self._dir = workdir
        self._proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def serve(self, records: Sequence[tuple[str, str, int]]) -> None:
        """Answer ``(name, host, port)`` SRV records from now on."""
        if shutil.which(DNSMASQ) is None:
            pytest.fail(f"{DNSMASQ} is missing: apt-get install dnsmasq-base")
        self.stop()
        self.starts += 1
        log = (self._dir / f"dnsmasq{self.starts}.log").open("wb")
        self._proc = start_process(
            [
                DNSMASQ,
                "--keep-in-foreground",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                f"--port={self.port}",
                "--listen-address=127.0.0.1",
                "--bind-interfaces",
                "--local=/test/",
                f"--user={getpass.getuser()}",
                "--pid-file=",
                *(f"--srv-host={name},{host},{port}" for name, host, port in records),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        log.close()
        wait_until(self._answers, 10, "dnsmasq to answer")

    def _answers(self) -> bool:
        assert self._proc is not None and self._proc.poll() is None, self._log()
        resolver = dns.resolver.Resolver(configure=False)
        resolver.nameservers, resolver.port, resolver.lifetime = ["127.0.0.1"], self.port, 0.5
        try:
            resolver.resolve("ready.test", "SRV")
        except dns.resolver.NXDOMAIN:
            return True  # an answer
        except dns.exception.DNSException:
            return False
        return True

    def _log(self) -> str:
        return (self._dir / f"dnsmasq{self.starts}.log").read_text()

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None


@pytest.fixture
def dns_server(tmp_path: Path) -> Iterator[DnsServer]:
    server = DnsServer(tmp_path)
    try:
        yield server
    finally:
        server.stop()


def _endpoints(targets: Sequence[TargetSettings]) -> list[tuple[str, str, str]]:
    return [(t.name, t.url, t.metrics_url) for t in targets]


# ------------------------------------------------------------------ the lookups


def test_each_srv_record_is_a_tritons_http_endpoint_with_metrics_on_8002(
    dns_server: DnsServer,
) -> None:
    dns_server.serve([(NAME, "triton-b.test", 8000), (NAME, "triton-a.test", 9000)])
    finder = DnsSd([NAME], nameserver=dns_server.nameserver)
    assert _endpoints(finder.load()) == [
        ("triton-a.test:9000", "http://triton-a.test:9000", "http://triton-a.test:8002/metrics"),
        ("triton-b.test:8000", "http://triton-b.test:8000", "http://triton-b.test:8002/metrics"),
    ]
    same = DnsSd([NAME], nameserver=dns_server.nameserver, metrics_port=None)
    assert [t.metrics_url for t in same.load()] == [
        "http://triton-a.test:9000/metrics",
        "http://triton-b.test:8000/metrics",
    ]


def test_a_changed_record_set_is_seen_and_a_name_gone_gives_its_targets_up(
    dns_server: DnsServer, caplog: pytest.LogCaptureFixture
) -> None:
    other = "_http._tcp.other.test"
    dns_server.serve([(NAME, "a.test", 8000), (other, "z.test", 8000)])
    finder = DnsSd([NAME, other], nameserver=dns_server.nameserver)
    assert [t.name for t in finder.load()] == ["a.test:8000", "z.test:8000"]
    assert finder.refresh() is None  # the same records: no change
    dns_server.serve([(NAME, "a.test", 8000), (NAME, "b.test", 8000), (other, "z.test", 8000)])
    changed = finder.refresh()
    assert changed is not None
    assert [t.name for t in changed] == ["a.test:8000", "b.test:8000", "z.test:8000"]
    caplog.set_level(logging.WARNING, "batchscope.discovery")
    dns_server.serve([(NAME, "b.test", 8000)])  # other.test: NXDOMAIN now
    gone = finder.refresh()
    assert gone is not None and [t.name for t in gone] == ["b.test:8000"]
    assert f"dns_sd: {other}: no SRV records (NXDOMAIN); its 1 target(s) stop" in caplog.text


def test_a_dead_nameserver_keeps_the_last_good_targets_and_is_logged_once(
    dns_server: DnsServer, caplog: pytest.LogCaptureFixture
) -> None:
    dns_server.serve([(NAME, "a.test", 8000)])
    finder = DnsSd([NAME], nameserver=dns_server.nameserver, timeout_s=0.3)
    [kept] = finder.load()
    dns_server.stop()
    caplog.set_level(logging.INFO, "batchscope.discovery")
    assert finder.refresh() is None and finder.refresh() is None
    assert finder.targets() == [kept]
    failures = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    kept_line = f"dns_sd: {NAME}: no answer within 0.3 s; keeping its last good 1 target(s)"
    assert failures == [kept_line]
    dns_server.serve([(NAME, "a.test", 8000), (NAME, "b.test", 8000)])
    back = finder.refresh()
    assert back is not None and [t.name for t in back] == ["a.test:8000", "b.test:8000"]
    assert f"dns_sd: {NAME} answers again: 2 target(s)" in caplog.text


def test_a_nameserver_that_is_down_at_start_does_not_stop_it(dns_server: DnsServer) -> None:
    # The collector may start before the DNS (or the servers) are up: no target yet.
    finder = DnsSd([NAME], nameserver=dns_server.nameserver, timeout_s=0.3)
    assert finder.load() == []
    dns_server.serve([(NAME, "a.test", 8000)])
    found = finder.refresh()
    assert found is not None and [t.name for t in found] == ["a.test:8000"]


@pytest.mark.parametrize(
    ("overrides", "field", "says"),
    [
        ({"dns_sd": "_http._tcp.triton .test"}, "dns_sd", "is not a DNS name"),
        ({"dns_sd_nameserver": "dns.example"}, "dns_sd_nameserver", "is not an IP address"),
        ({"dns_sd_nameserver": "[::1]:0"}, "dns_sd_nameserver", "the port must be 1..65535"),
        ({"dns_sd_metrics_port": "metrics"}, "dns_sd_metrics_port", "a port 1..65535 or 'same'"),
        ({"dns_sd_refresh_s": 0}, "dns_sd_refresh_s", ""),
    ],
)
def test_invalid_dns_sd_settings_stop_the_start_naming_the_field(
    overrides: dict[str, Any], field: str, says: str
) -> None:
    from collector.config import load_settings

    with pytest.raises(ConfigError) as err:
        load_settings(config_file=None, env={}, overrides=overrides)
    assert err.value.field == field
    assert says in str(err.value)


# ------------------------------------------------------------------ the collector


def test_the_collector_follows_the_records(tmp_path: Path, dns_server: DnsServer) -> None:
    dns_server.serve([(NAME, "a.test", 8000), (NAME, "both.test", 8000)])
    listed = tmp_path / "fleet.json"
    # A target both list is file_sd's: scraped once, where the file says.
    _write(listed, [{"targets": ["both.test:8000"], "labels": {"__scheme__": "https"}}])
    settings = Settings(
        dns_sd=(NAME,),
        dns_sd_nameserver=dns_server.nameserver,
        dns_sd_refresh_s=0.05,
        file_sd=(str(listed),),
        db_url=f"sqlite:///{tmp_path}/d.db",
        interval_s=0.05,
        timeout_s=0.5,
    )
    assert collector_jobs(settings, analyses=False) == ["housekeeping", "file_sd", "dns_sd"]
    seen, made, factory = recording_factory()
    store = Store(settings.db_url)
    service = CollectorService(settings, store, [], source_factory=factory)
    assert {t.name: t.url for t in service.targets} == {
        "both.test:8000": "https://both.test:8000",
        "a.test:8000": "http://a.test:8000",
    }
    try:
        service.start()
        wait_until(lambda: seen[("one", "a.test:8000")] > 0, 10, "a scraped")
        dns_server.serve([(NAME, "b.test", 8000), (NAME, "both.test", 8000)])
        wait_until(lambda: seen[("one", "b.test:8000")] > 0, 10, "b, a new record, scraped")
        wait_until(lambda: made["a.test:8000"].closed, 10, "a, its record gone, closed")
        assert sorted(t.name for t in service.targets) == ["b.test:8000", "both.test:8000"]
    finally:
        service.shutdown()
        store.close()
    assert all(source.closed for source in made.values())


def test_collect_scrapes_the_servers_the_srv_records_list(
    tmp_path: Path, dns_server: DnsServer
) -> None:
    """`batchscope collect --dns-sd NAME` end to end, against a Triton-like server (its
    HTTP API and metrics on one port: ``dns_sd_metrics_port: same``)."""
    from http.server import ThreadingHTTPServer

    from collector.cli import main
    from tests.unit.test_scheduler import _Handler

    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        dns_server.serve([(NAME, "127.0.0.1", port)])
        config = tmp_path / "batchscope.yaml"
        config.write_text(
            f"dns_sd_nameserver: {dns_server.nameserver}\ndns_sd_metrics_port: same\n"
        )
        db = f"sqlite:///{tmp_path}/c.db"
        argv = ["collect", "--config", str(config), "--dns-sd", NAME, "--sources", "triton"]
        status = main([*argv, "--db", db, "--interval", "0.5", "--duration", "2"])
        server.shutdown()
    assert status == 0
    assert_the_one_server_scraped(db, port)
