"""Targets of a fleet: Prometheus file_sd files (read, validated with the file and the
entry named, re-read on change, a broken file keeping its last good targets and a
deleted one giving them up), and
shards (``--shard i/n``) that together scrape each target exactly once."""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from collector.config import Settings, TargetSettings
from collector.discovery import FileSd, in_shard, shard_index, targets_from_groups
from collector.errors import ConfigError
from collector.records import ModelMetrics, TritonSnapshot
from collector.scheduler import CollectorService
from collector.store import Store
from tests.support import wait_until


def _write(path: Path, groups: object) -> None:
    """Replace ``path`` at once (as a config manager does), with a new mtime."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(groups))
    os.replace(tmp, path)


# ------------------------------------------------------------------ the file format


def test_an_address_is_tritons_http_endpoint_with_metrics_on_8002() -> None:
    [a, b] = targets_from_groups([{"targets": ["triton-a:8000", "triton-b"]}], "f.json")
    assert (a.name, a.url, a.metrics_url) == (
        "triton-a:8000",
        "http://triton-a:8000",
        "http://triton-a:8002/metrics",
    )
    assert (b.url, b.metrics_url) == ("http://triton-b:8000", "http://triton-b:8002/metrics")


def test_labels_say_where_the_http_api_and_the_metrics_are() -> None:
    # A file written for Prometheus lists the metrics port; one label names the HTTP one.
    [prom] = targets_from_groups(
        [{"targets": ["10.0.0.5:8002"], "labels": {"__batchscope_http_port": "8000", "job": "t"}}],
        "prom.json",
    )
    assert (prom.name, prom.url, prom.metrics_url) == (
        "10.0.0.5:8000",
        "http://10.0.0.5:8000",
        "http://10.0.0.5:8002/metrics",
    )
    [other] = targets_from_groups(
        [
            {
                "targets": ["[::1]:9000"],
                "labels": {
                    "__batchscope_metrics_port": "9002",
                    "__metrics_path__": "/m",
                    "__scheme__": "https",
                },
            }
        ],
        "v6.json",
    )
    assert (other.url, other.metrics_url) == ("https://[::1]:9000", "https://[::1]:9002/m")


@pytest.mark.parametrize(
    ("groups", "says"),
    [
        ({"targets": ["a:1"]}, "fleet.json: must hold a list of target groups"),
        (["a:1"], "fleet.json: group 0: must be a mapping"),
        ([{"targets": "a:1"}], "fleet.json: group 0: 'targets' must be a list"),
        ([{"targets": ["a:1"], "label": {}}], "fleet.json: group 0: unknown key 'label'"),
        ([{"targets": ["a:1", "http://b:1"]}], "group 0 targets[1]: a target must be host:port"),
        (
            [{"targets": []}, {"targets": ["a:port"]}],
            "group 1 targets[0]: target 'a:port': port is not a",
        ),
        ([{"targets": ["a"], "labels": {"zone": 1}}], "labels must map names to strings"),
        (
            [{"targets": ["a"], "labels": {"__batchscope_http_port": "80000"}}],
            "label __batchscope_http_port must be a port 1..65535, got '80000'",
        ),
        (
            [{"targets": ["a"], "labels": {"__scheme__": "ftp"}}],
            "label __scheme__ must be http or https",
        ),
        (
            [
                {"targets": ["a:1"]},
                {"targets": ["a:1"], "labels": {"__batchscope_metrics_port": "9"}},
            ],
            "group 1 targets[0]: a:1 is also listed by fleet.json: group 0 targets[0]",
        ),
    ],
)
def test_an_invalid_entry_names_the_file_and_the_entry(groups: object, says: str) -> None:
    with pytest.raises(ConfigError) as err:
        targets_from_groups(groups, "fleet.json")
    assert err.value.field == "file_sd"
    assert says in str(err.value)


def test_json_and_yaml_files_and_glob_patterns(tmp_path: Path) -> None:
    (tmp_path / "sd").mkdir()
    _write(tmp_path / "sd" / "a.json", [{"targets": ["a:8000"]}])
    (tmp_path / "sd" / "b.yaml").write_text("- targets: [b:8000, a:8000]\n  labels: {x: y}\n")
    (tmp_path / "sd" / "empty.yml").write_text("")  # no group yet
    sd = FileSd([str(tmp_path / "sd" / "*.json"), str(tmp_path / "sd" / "*.y*ml")])
    assert [t.name for t in sd.load()] == ["a:8000", "b:8000"]  # each name once
    with pytest.raises(ConfigError, match=r"cannot read .*missing\.json"):
        FileSd([str(tmp_path / "missing.json")]).load()
    (tmp_path / "bad.yaml").write_text("- targets: [unclosed\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml is not valid YAML"):
        FileSd([str(tmp_path / "bad.yaml")]).load()


def test_a_changed_file_is_read_again_and_a_broken_one_keeps_its_last_good_targets(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "fleet.json"
    _write(path, [{"targets": ["a:8000", "b:8000"]}])
    sd = FileSd([str(path)])
    assert len(sd.load()) == 2
    assert sd.refresh() is None  # unchanged: nothing read
    _write(path, [{"targets": ["b:8000", "c:8000"]}])
    assert [t.name for t in sd.refresh() or []] == ["b:8000", "c:8000"]
    caplog.set_level(logging.ERROR, "batchscope.discovery")
    _write(path, [{"targets": ["d:nope"]}])
    assert sd.refresh() is None
    path.write_text("[{")  # broken again, differently
    assert sd.refresh() is None
    _write(path, [{"targets": ["d:nope"]}])
    assert sd.refresh() is None
    assert [t.name for t in sd.targets()] == ["b:8000", "c:8000"]
    errors = [r.getMessage() for r in caplog.records]
    assert len(errors) == 3, errors  # once per change, not once per look
    assert "fleet.json: group 0 targets[0]: target 'd:nope'" in errors[0]
    assert "keeping its last good 2 target(s)" in errors[0]
    path.unlink()  # a file deleted gives its targets up, as in Prometheus
    assert sd.refresh() == []
    assert sd.refresh() is None
    _write(path, [{"targets": ["e:8000"]}])
    assert [t.name for t in sd.refresh() or []] == ["e:8000"]
    _write(path, [])
    assert sd.refresh() == []


# ------------------------------------------------------------------ the collector


class _Fake:
    """A Triton source that scrapes nothing; it notes which collector ran it."""

    name = "triton"

    def __init__(self, target: TargetSettings, by: str, seen: Counter[tuple[str, str]]) -> None:
        self.target, self._by, self._seen = target.name, by, seen
        self.closed = False

    def collect(self) -> list[Any]:
        self._seen[(self._by, self.target)] += 1
        return []

    def close(self) -> None:
        self.closed = True


def recording_factory() -> tuple[
    Counter[tuple[str, str]], dict[str, _Fake], Callable[[TargetSettings], list[Any]]
]:
    """A source factory making one ``_Fake`` per target (collector "one"): the scrapes
    seen by (collector, target), the sources made by target, and the factory."""
    seen: Counter[tuple[str, str]] = Counter()
    made: dict[str, _Fake] = {}

    def factory(target: TargetSettings) -> list[Any]:
        made[target.name] = _Fake(target, "one", seen)
        return [made[target.name]]

    return seen, made, factory


def test_the_collector_follows_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    _write(path, [{"targets": ["a:8000", "b:8000"]}])
    settings = Settings(
        targets=(TargetSettings(url="http://static:8000"),),  # type: ignore[call-arg]
        file_sd=(str(path),),
        file_sd_refresh_s=0.05,
        db_url=f"sqlite:///{tmp_path}/f.db",
        interval_s=0.05,
        timeout_s=0.5,
    )
    seen, made, factory = recording_factory()
    store = Store(settings.db_url)
    static = factory(settings.targets[0])
    service = CollectorService(settings, store, static, source_factory=factory)
    assert {t.name for t in service.targets} == {"static:8000", "a:8000", "b:8000"}
    try:
        service.start()
        wait_until(lambda: seen[("one", "b:8000")] > 0, 10, "b scraped")
        _write(path, [{"targets": ["b:8000", "c:8000", "static:8000"]}])
        wait_until(lambda: seen[("one", "c:8000")] > 0, 10, "c, added to the file, scraped")
        wait_until(lambda: made["a:8000"].closed, 5, "a, removed from the file, closed")
        assert {t.name for t in service.targets} == {"static:8000", "b:8000", "c:8000"}
        path.write_text("not json")
        a_before = seen[("one", "a:8000")]
        c_before = seen[("one", "c:8000")]
        wait_until(lambda: seen[("one", "c:8000")] > c_before + 3, 10, "c still scraped")
        assert seen[("one", "a:8000")] == a_before
        states = {t.name: t for t in store.targets()}
        assert states["c:8000"].url == "http://c:8000"  # where it is scraped, written down
        assert states["c:8000"].metrics_url == "http://c:8002/metrics"
    finally:
        service.shutdown()
        store.close()
    assert all(source.closed for source in made.values())


def test_a_file_sd_file_that_is_invalid_at_start_stops_the_start(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("- targets: [a:8000]\n  labels: {__batchscope_http_port: http}\n")
    settings = Settings(file_sd=(str(path),), db_url=f"sqlite:///{tmp_path}/x.db")
    with pytest.raises(ConfigError) as err:
        CollectorService(settings, Store(settings.db_url), [])
    assert err.value.field == "file_sd"
    assert f"{path}: group 0 targets[0]: label __batchscope_http_port" in str(err.value)


# ------------------------------------------------------------------ shards


def test_the_shard_of_a_name_is_the_same_in_every_process() -> None:
    # CRC-32, not Python's salted hash(): fixed values, whatever the process.
    assert [shard_index(f"triton-{i}:8000", 4) for i in range(6)] == [3, 2, 0, 1, 1, 0]
    assert shard_index("triton-a:8000", 1000) == 1106258269 % 1000
    names = [f"10.0.{i // 250}.{i % 250}:8000" for i in range(900)]
    for n in (1, 2, 3, 7):
        owners = [[i for i in range(n) if in_shard(name, (i, n))] for name in names]
        assert all(len(o) == 1 for o in owners)  # each name in exactly one shard
        sizes = Counter(o[0] for o in owners)
        assert min(sizes.values()) > 900 / n * 0.7  # and the shards are about even


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_n_collectors_over_one_store_cover_every_target_exactly_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    db_url = (
        f"sqlite:///{tmp_path}/shared.db"
        if backend == "sqlite"
        else request.getfixturevalue("pg_url")
    )
    path = tmp_path / "fleet.json"
    names = [f"triton-{i}:8000" for i in range(30)]
    _write(path, [{"targets": names[5:]}])
    static = tuple(TargetSettings(url=f"http://{n}") for n in names[:5])  # type: ignore[call-arg]
    seen: Counter[tuple[str, str]] = Counter()
    analysed: Counter[str] = Counter()
    lock = threading.Lock()
    n = 3
    services = []
    store = Store(db_url)
    store.open()
    for i in range(n):
        settings = Settings(
            targets=static,
            file_sd=(str(path),),
            shard=f"{i}/{n}",
            db_url=db_url,
            interval_s=0.1,
            timeout_s=0.5,
            analysis_every_s=0.05,
            retention={"every_s": 0.05},
        )

        def analysis(_store: Store, _now: float, who: str = f"{i}/{n}") -> None:
            with lock:
                analysed[who] += 1

        by = f"{i}/{n}"
        shard_store = Store(db_url)
        services.append(
            CollectorService(
                settings,
                shard_store,
                [_Fake(t, by, seen) for t in static if in_shard(t.name, settings.shard_of)],
                analyses=[analysis],
                source_factory=lambda t, by=by: [_Fake(t, by, seen)],
            )
        )
    try:
        for service in services:
            service.start()
        wait_until(
            lambda: {t.name for t in store.targets()} >= set(names), 20, "every target stored"
        )
        wait_until(lambda: analysed["0/3"] >= 2, 10, "shard 0's analyses")
    finally:
        for service in services:
            service.shutdown()
            service.store.close()
        store.close()
    owners: dict[str, set[str]] = {}
    for by, target in seen:
        owners.setdefault(target, set()).add(by)
    assert sorted(owners) == sorted(names)  # every target scraped ...
    assert all(len(who) == 1 for who in owners.values()), owners  # ... by one collector
    assert sorted({t.name for s in services for t in s.targets}) == sorted(names)
    assert sum(len(s.targets) for s in services) == len(names)
    # The store-wide jobs run in shard 0 only.
    assert set(analysed) == {"0/3"}
    assert [s.runs_store_jobs for s in services] == [True, False, False]


def test_an_exporter_of_one_shard_waits_for_its_own_targets_only(tmp_path: Path) -> None:
    from collector.exporter.service import Exporter

    targets = tuple(TargetSettings(url=f"http://t{i}:8000") for i in range(4))  # type: ignore[call-arg]
    mine = [t.name for t in targets if in_shard(t.name, (0, 2))]
    settings = Settings(
        targets=targets, shard="0/2", db_url=f"sqlite:///{tmp_path}/e.db", sources=("triton",)
    )
    exporter = Exporter(settings, host="127.0.0.1", port=0)
    try:
        waiting = exporter.readiness().reason
    finally:
        exporter.store.close()
    assert 0 < len(mine) < 4
    assert sorted(part.split(":")[0] for part in waiting.split("; ")) == sorted(
        name.split(":")[0] for name in mine
    )


def test_collect_scrapes_the_servers_a_file_sd_file_lists(tmp_path: Path) -> None:
    """`batchscope collect --file-sd FILE` end to end, against a Triton-like server
    (its HTTP API and metrics on one port, said by a label)."""
    from http.server import ThreadingHTTPServer

    from collector.cli import main
    from tests.unit.test_scheduler import _Handler

    with ThreadingHTTPServer(("127.0.0.1", 0), _Handler) as server:
        server.daemon_threads = True
        threading.Thread(target=server.serve_forever, daemon=True).start()
        port = server.server_address[1]
        fleet = tmp_path / "fleet.json"
        _write(
            fleet,
            [
                {
                    "targets": [f"127.0.0.1:{port}"],
                    "labels": {"__batchscope_metrics_port": str(port)},
                }
            ],
        )
        db = f"sqlite:///{tmp_path}/c.db"
        argv = ["collect", "--file-sd", str(fleet), "--sources", "triton", "--db", db]
        status = main([*argv, "--interval", "0.5", "--duration", "2"])
        server.shutdown()
    assert status == 0
    assert_the_one_server_scraped(db, port)


def assert_the_one_server_scraped(db: str, port: int) -> None:
    """The store ``db`` holds one target, the Triton-like server on ``port`` (its HTTP
    API and metrics on that port), up, with samples of its model."""
    store = Store(db)
    try:
        [state] = store.targets()
        assert (state.name, state.up) == (f"127.0.0.1:{port}", True)
        assert state.metrics_url == f"http://127.0.0.1:{port}/metrics"
        assert len(store.model_samples(target=state.name, model="resnet50")) >= 2
    finally:
        store.close()


def _service(tmp_path: Path, factory: Any) -> tuple[CollectorService, Store]:
    settings = Settings(
        db_url=f"sqlite:///{tmp_path}/u.db", interval_s=0.05, timeout_s=0.5, jitter_s=0
    )
    store = Store(settings.db_url)
    return CollectorService(settings, store, [], source_factory=factory), store


def _targets(*names: str) -> list[TargetSettings]:
    return [TargetSettings(url=f"http://{n}", metrics_url=f"http://{n}/m", name=n) for n in names]


def test_a_target_whose_sources_cannot_be_made_is_left_out_and_the_rest_change(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seen: Counter[tuple[str, str]] = Counter()

    def factory(target: TargetSettings) -> list[Any]:
        if target.name == "bad:8000":
            raise ValueError("no such source")
        return [_Fake(target, "one", seen)]

    service, store = _service(tmp_path, factory)
    try:
        service.update_targets(_targets("a:8000"))
        service.update_targets(_targets("bad:8000", "c:8000"))
        assert {t.name for t in service.targets} == {"c:8000"}
        assert [s.target for s in service.sources] == ["c:8000"]
        assert "cannot scrape target bad:8000" in caplog.text
    finally:
        service.shutdown()
        store.close()


def test_no_target_starts_after_shutdown(tmp_path: Path) -> None:
    made: list[_Fake] = []

    def factory(target: TargetSettings) -> list[Any]:
        made.append(_Fake(target, "one", Counter()))
        return [made[-1]]

    service, store = _service(tmp_path, factory)
    try:
        service.start()
        service.update_targets(_targets("a:8000"))
        service.shutdown()
        service.update_targets(_targets("a:8000", "late:8000"))  # a refresh come late
        assert [s.target for s in made] == ["a:8000"]
        assert all(s.closed for s in made)
    finally:
        store.close()


class _Sampled:
    """A Triton-like source returning a snapshot of one model per scrape; ``gate``
    (when set) holds a scrape until it opens."""

    name = "triton"

    def __init__(self, target: str) -> None:
        self.target = target
        self.count = 0.0
        self.gate: threading.Event | None = None
        self.started = threading.Event()
        self.closed = False

    def collect(self) -> list[object]:
        self.started.set()
        if self.gate is not None:
            self.gate.wait(5)
        self.count += 1
        metrics = ModelMetrics(model="m", version="1", inference_count=self.count)
        return [TritonSnapshot(self.target, time.time(), model_metrics=(metrics,))]

    def close(self) -> None:
        self.closed = True


def test_a_dropped_target_forgets_its_state_once_its_scrape_in_flight_ends(
    tmp_path: Path,
) -> None:
    made: dict[str, _Sampled] = {}

    def factory(target: TargetSettings) -> list[Any]:
        made[target.name] = _Sampled(target.name)
        return [made[target.name]]

    service, store = _service(tmp_path, factory)
    try:
        service.start()
        service.update_targets(_targets("a:8000"))
        wait_until(lambda: made["a:8000"].count >= 2, 5, "a scraped")
        a = made["a:8000"]
        a.started.clear()
        a.gate = threading.Event()
        wait_until(a.started.is_set, 5, "a scrape of a in flight")
        service.update_targets([])  # a dropped while its scrape runs
        assert not a.closed
        a.gate.set()  # the scrape ends and writes its sample
        wait_until(lambda: a.closed, 5, "a closed once its scrape ended")
        assert not any(key[0] == "a:8000" for key in service._previous)
        assert not any(key[1] == "a:8000" for key in service._health)
    finally:
        service.shutdown()
        store.close()


def test_a_command_that_does_not_scrape_the_file_sd_files_does_not_read_them(
    tmp_path: Path,
) -> None:
    import argparse

    from collector.command_support import collecting_settings

    args = argparse.Namespace(
        config=None,
        triton="http://127.0.0.1:8000",
        metrics_url=None,
        db_url=f"sqlite:///{tmp_path}/r.db",
        file_sd=[str(tmp_path / "missing.json")],
        shard=None,
    )
    with pytest.raises(ConfigError, match="missing.json"):
        collecting_settings(args, interval_s=1.0, sources=["triton"])
    settings = collecting_settings(args, interval_s=1.0, sources=["triton"], check_file_sd=False)
    assert settings.file_sd == (str(tmp_path / "missing.json"),)
