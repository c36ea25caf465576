"""The processes and stores that ``bench/collector.py`` measures side by side.

* :class:`CollectorProcess`: ``batchscope collect --sources triton`` with a settings
  file listing a simulated fleet's targets;
* :class:`PrometheusProcess`: Debian's ``prometheus`` scraping the same targets'
  ``/metrics`` at the same interval, its TSDB in a temporary folder, on a free port;
* :class:`BenchStore`: the store the collector writes (a SQLite file, or a fresh
  schema of a PostgreSQL database, dropped afterwards), read for the scrapes done and
  its size;
* :func:`cpu_seconds`: a process's user + system CPU from ``/proc/<pid>/stat``, its
  children's included.

Every process is started with a parent-death signal and stopped by its ``stop()``
(SIGTERM, then SIGKILL), also when the bench is interrupted.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psutil
import yaml
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.pool import NullPool

from collector.process_control import die_with_parent

__all__ = [
    "BenchStore",
    "CollectorProcess",
    "PrometheusProcess",
    "cpu_seconds",
    "free_port",
    "collector_env",
    "pg_store",
    "rollup_now",
    "sqlite_store",
]

DEFAULT_PG_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/test"
# What batchscope stores per scrape; sizes are summed over these.
STORE_TABLES = (
    "targets", "target_transitions", "models", "model_samples",
    "model_configs", "server_samples", "device_samples", "process_samples",
    "model_rollups", "device_rollups", "rollup_marks", "findings", "detector_streaks",
    "recommendations", "host_facts", "alert_states", "alert_notifications",
)  # fmt: skip


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of ``pid``, of the children it waited for, and of its
    live descendants (read from ``/proc/<pid>/stat`` by psutil)."""
    total = 0.0
    try:
        root = psutil.Process(pid)
        processes = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return total
    for proc in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


class _Process:
    """A started command, stopped with SIGTERM (then SIGKILL)."""

    name = "process"

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    @property
    def pid(self) -> int:
        assert self.proc is not None, f"{self.name} is not running"
        return self.proc.pid

    def _spawn(self, command: Sequence[str], env: dict[str, str] | None = None) -> None:
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(
                list(command),
                # Not the caller's folder: ``python -m`` puts its folder first on the
                # path, ahead of a ``source_root`` given through PYTHONPATH.
                cwd=self.workdir,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                preexec_fn=die_with_parent(),
            )

    def check_alive(self) -> None:
        if self.proc is not None and self.proc.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{tail}")

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self, timeout_s: float = 30.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class CollectorProcess(_Process):
    """``batchscope collect --sources triton`` over ``targets`` (HTTP URLs whose
    ``/metrics`` is on the same port) into ``db_url``."""

    name = "batchscope"

    def __init__(
        self,
        workdir: Path,
        targets: Sequence[str],
        db_url: str,
        interval_s: float,
        source_root: Path | None = None,
        analyses: bool = True,
    ):
        super().__init__(workdir)
        self.targets = list(targets)
        self.db_url = db_url
        self.interval_s = interval_s
        self.source_root = source_root
        self.analyses = analyses

    def settings(self) -> dict[str, Any]:
        return {
            "targets": [
                {"url": url, "metrics_url": f"{url}/metrics", "name": f"sim-{i:04d}"}
                for i, url in enumerate(self.targets)
            ],
            "db_url": self.db_url,
            "interval_s": self.interval_s,
            "sources": ["triton"],
            # Without analyses they would first run after a day: the window then holds
            # the scrape cycle alone.
            **({} if self.analyses else {"analysis_every_s": 86400.0}),
        }

    def start(self) -> CollectorProcess:
        config = self.workdir / "batchscope.yaml"
        config.write_text(yaml.safe_dump(self.settings(), sort_keys=False))
        command = [sys.executable, "-m", "collector.cli", "collect", "--config", str(config)]
        self._spawn([*command, "--sources", "triton"], env=collector_env(self.source_root))
        return self


def collector_env(source_root: Path | None) -> dict[str, str]:
    """The environment batchscope runs in: the settings file alone says what to do (no
    BATCHSCOPE_* of the caller's), and ``source_root``, when given, is the source tree
    it runs from (another checkout, to compare revisions on one fleet)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSCOPE_")}
    if source_root is not None:
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(source_root.resolve()), env.get("PYTHONPATH", "")) if p
        )
    return env


_ROLLUP = (
    "import sys\n"
    "from collector.store import Store\n"
    "store = Store(sys.argv[1])\n"
    "print(store.rollup(float(sys.argv[2]), bucket_s=float(sys.argv[3])))\n"
    "store.close()\n"
)


def rollup_now(db_url: str, bucket_s: float, source_root: Path | None) -> int:
    """Roll the store's raw samples up into ``bucket_s`` buckets, with the same
    batchscope as the collector (a subprocess); the rows written."""
    now = time.time() + 2 * bucket_s
    out = subprocess.run(
        [sys.executable, "-c", _ROLLUP, db_url, repr(now), repr(bucket_s)],
        env=collector_env(source_root),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"rollup failed: {out.stderr.strip()[-1000:]}")
    return int(out.stdout.split()[-1])


class PrometheusProcess(_Process):
    """Debian's ``prometheus`` scraping ``targets`` (``host:port``) every ``interval_s``."""

    name = "prometheus"

    def __init__(self, workdir: Path, targets: Sequence[str], interval_s: float):
        super().__init__(workdir)
        self.targets = list(targets)
        self.interval_s = interval_s
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def config(self) -> dict[str, Any]:
        interval = f"{self.interval_s:g}s"
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": f"{min(self.interval_s, 10.0):g}s",
                "evaluation_interval": "1m",
            },
            "scrape_configs": [
                {"job_name": "fleet", "static_configs": [{"targets": self.targets}]}
            ],
        }

    def start(self, timeout_s: float = 60.0) -> PrometheusProcess:
        binary = shutil.which("prometheus")
        if binary is None:
            raise FileNotFoundError("prometheus is missing: `make system-deps` installs it")
        config = self.workdir / "prometheus.yml"
        config.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.port = free_port()
        self._spawn(
            [
                binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.workdir / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--log.level=warn",
            ]
        )
        deadline = time.monotonic() + timeout_s
        while not self._ready():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus not ready at {self.url}:\n{self.log_tail()}")
            time.sleep(0.1)
        return self

    def _ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.url}/-/ready", timeout=2) as response:
                return bool(response.status == 200)
        except OSError:
            return False

    def query(self, expr: str, at: float | None = None) -> float:
        """The value of a query that gives one number (``sum(...)``); 0 for no data."""
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        body = urllib.parse.urlencode(params).encode()
        with urllib.request.urlopen(f"{self.url}/api/v1/query", data=body, timeout=30) as r:
            answer = json.load(r)
        if answer.get("status") != "success":
            raise RuntimeError(f"Prometheus query {expr!r} failed: {answer}")
        result = answer["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0

    def targets_up(self) -> int:
        return int(self.query('count(up{job="fleet"} == 1)'))

    def scrapes_between(self, start: float, end: float) -> int:
        """Successful scrapes in (start, end]: the sum of ``up`` over the window."""
        window = f"{max(round((end - start) * 1000), 1)}ms"
        return round(self.query(f'sum(sum_over_time(up{{job="fleet"}}[{window}]))', end))


class BenchStore:
    """The collector's store as the bench reads it: scrapes done and size in bytes."""

    def __init__(self, kind: str, url: str, engine: Engine, schema: str | None = None):
        self.kind = kind
        self.url = url
        self.engine = engine
        self.schema = schema

    def _scalar(self, sql: str, **params: Any) -> float:
        try:
            with self.engine.connect() as conn:
                value = conn.execute(text(sql), params).scalar()
        except Exception:  # noqa: BLE001 - no table yet (the collector still starting)
            return 0.0
        return float(value or 0)

    def targets_scraped(self) -> int:
        """Targets with at least one successful scrape."""
        return int(self._scalar("SELECT COUNT(*) FROM targets WHERE last_seen_at IS NOT NULL"))

    def scrapes_between(self, start: float, end: float) -> int:
        """Target-scrapes whose samples were taken in [start, end)."""
        return int(
            self._scalar(
                "SELECT COUNT(*) FROM (SELECT DISTINCT m.target_id, s.collected_at "
                "FROM model_samples s JOIN models m ON m.id = s.model_id "
                "WHERE s.collected_at >= :start AND s.collected_at < :end) AS scrapes",
                start=start,
                end=end,
            )
        )

    def rows(self, table: str) -> int:
        return int(self._scalar(f"SELECT COUNT(*) FROM {table}"))

    def size_bytes(self) -> int:
        """The bytes batchscope's tables take: SQLite's pages in use (the WAL's
        committed pages included, as a reader sees them), PostgreSQL's
        ``pg_total_relation_size`` (indexes and TOAST included) over its tables."""
        if self.kind == "sqlite":
            with contextlib.suppress(Exception), self.engine.connect() as conn:
                page = conn.exec_driver_sql("PRAGMA page_size").scalar() or 0
                pages = conn.exec_driver_sql("PRAGMA page_count").scalar() or 0
                free = conn.exec_driver_sql("PRAGMA freelist_count").scalar() or 0
                return int(page) * (int(pages) - int(free))
            return 0
        return int(
            self._scalar(
                "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = :schema AND c.relkind = 'r'",
                schema=self.schema,
            )
        )

    def file_bytes(self) -> int:
        """SQLite: the database file and its WAL on disk (0 for PostgreSQL)."""
        if self.kind != "sqlite":
            return 0
        path = Path(make_url(self.url).database or "")
        return sum(p.stat().st_size for p in (path, Path(f"{path}-wal")) if p.exists())


@contextlib.contextmanager
def sqlite_store(workdir: Path) -> Iterator[BenchStore]:
    path = workdir / "batchscope.db"
    url = f"sqlite:///{path}"
    # Read-only: the bench never creates the file or takes the write lock.
    engine = create_engine(f"sqlite:///file:{path}?mode=ro&uri=true", poolclass=NullPool)
    try:
        yield BenchStore("sqlite", url, engine)
    finally:
        engine.dispose()


def pg_reachable(base_url: str) -> str | None:
    """None when PostgreSQL at ``base_url`` answers, else why not."""
    engine = create_engine(base_url, poolclass=NullPool, connect_args={"connect_timeout": 3})
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # noqa: BLE001 - reported, the point is skipped
        return f"{type(exc).__name__}: {str(exc).splitlines()[0]}"
    finally:
        engine.dispose()
    return None


@contextlib.contextmanager
def pg_store(base_url: str) -> Iterator[BenchStore]:
    """A fresh schema of the database at ``base_url`` (dropped on exit); the store's
    URL sets it as the search path, so batchscope's tables land there."""
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = create_engine(base_url, poolclass=NullPool, connect_args={"connect_timeout": 5})
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    url = make_url(base_url).update_query_dict({"options": f"-csearch_path={schema}"})
    rendered = url.render_as_string(hide_password=False)
    engine = create_engine(rendered, poolclass=NullPool)
    try:
        yield BenchStore("postgresql", rendered, engine, schema)
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()


def wait_for_first_scrapes(
    store: BenchStore,
    prometheus: PrometheusProcess | None,
    collector: CollectorProcess,
    targets: int,
    timeout_s: float,
) -> str:
    """Return once both have scraped every target (or after ``timeout_s``, saying so)."""
    deadline = time.monotonic() + timeout_s
    while True:
        collector.check_alive()
        done_b = store.targets_scraped()
        done_p = targets if prometheus is None else _targets_up(prometheus)
        if done_b >= targets and done_p >= targets:
            return ""
        if time.monotonic() > deadline:
            note = f"warm-up ended with {done_b}/{targets} (batchscope), {done_p} (Prometheus)"
            if done_b < targets:
                problems = [
                    line
                    for line in collector.log_tail(20000).splitlines()
                    if " WARNING " in line or " ERROR " in line or "Error" in line
                ]
                note += "".join(f"\n  batchscope log: {line[:300]}" for line in problems[-3:])
            return note
        time.sleep(0.5)


def _targets_up(prometheus: PrometheusProcess) -> int:
    prometheus.check_alive()
    try:
        return prometheus.targets_up()
    except (OSError, urllib.error.URLError):
        return 0
