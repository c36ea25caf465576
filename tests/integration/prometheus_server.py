"""A real Prometheus (Debian's ``prometheus``) for integration tests.

:class:`PrometheusServer` writes a scrape config (1 s scrape and rule-evaluation
interval, the given rule files, one job per :class:`ScrapeJob`), starts the binary on
a free loopback port with its TSDB in a folder of the test's, waits until
``/-/ready`` answers and every target has been scraped, and stops it again (terminate,
wait, kill), also when a test fails.  ``query``/``query_range``/``series``/
``label_values`` wrap the HTTP API and return typed records; a response whose status
is not ``success``, or that carries warnings, raises :class:`PrometheusQueryError`.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from collector.process_control import die_with_parent
from tests.support import free_port

__all__ = [
    "InstantSample",
    "PrometheusQueryError",
    "PrometheusServer",
    "RangeSeries",
    "ScrapeJob",
    "answers_200",
    "host_port",
]

_POLL_S = 0.1


class PrometheusQueryError(AssertionError):
    """Prometheus answered with an error or with warnings."""


@dataclass(frozen=True)
class ScrapeJob:
    """One scrape job: its ``job`` label and its ``host:port`` targets."""

    name: str
    targets: tuple[str, ...]
    metrics_path: str = "/metrics"


@dataclass(frozen=True)
class InstantSample:
    """One element of an instant query's result (a scalar has no labels)."""

    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query's result: (unix time, value) points, oldest first."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


def answers_200(url: str) -> bool:
    """Whether a GET of ``url`` answers 200 now (a refused connection is a no)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return bool(response.status == 200)
    except OSError:  # URLError and HTTPError included
        return False


def host_port(url: str) -> str:
    """``host:port`` of an ``http://host:port/...`` URL, as a scrape target names it."""
    return urllib.parse.urlsplit(url).netloc


@dataclass
class PrometheusServer:
    """A Prometheus process scraping ``jobs`` every ``interval_s`` with ``rule_files``."""

    workdir: Path
    jobs: Sequence[ScrapeJob]
    rule_files: Sequence[Path] = ()
    interval_s: float = 1.0
    binary: str = "prometheus"
    port: int = 0
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "prometheus.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "prometheus.yml"

    def config(self) -> dict[str, Any]:
        interval = f"{self.interval_s:g}s"
        return {
            "global": {
                "scrape_interval": interval,
                "scrape_timeout": interval,
                "evaluation_interval": interval,
            },
            "rule_files": [str(Path(p).resolve()) for p in self.rule_files],
            "scrape_configs": [
                {
                    "job_name": job.name,
                    "metrics_path": job.metrics_path,
                    "static_configs": [{"targets": list(job.targets)}],
                }
                for job in self.jobs
            ],
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout_s: float = 30.0) -> None:
        """Start the server and return once it is ready and every target was scraped."""
        binary = shutil.which(self.binary)
        if binary is None:
            raise FileNotFoundError(
                f"{self.binary} is missing: `make system-deps` installs Debian's prometheus"
            )
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(self.config(), sort_keys=False))
        self.port = self.port or free_port()
        command = [
            binary,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={self.workdir / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with self.log_path.open("wb") as log:
            self._proc = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, preexec_fn=die_with_parent()
            )
        try:
            self._wait_ready(time.monotonic() + timeout_s)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, deadline: float) -> None:
        while not answers_200(f"{self.url}/-/ready"):
            self._check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"Prometheus not ready at {self.url}; log: {self.log_path}")
            time.sleep(_POLL_S)
        while True:
            targets = self._get("/api/v1/targets", {"state": "active"})["activeTargets"]
            down = [t["scrapeUrl"] for t in targets if t["health"] != "up"]
            if not down:
                return
            self._check_alive()
            if time.monotonic() > deadline:
                errors = [f"{t['scrapeUrl']}: {t['lastError']}" for t in targets]
                raise TimeoutError(f"targets not scraped: {errors}")
            time.sleep(_POLL_S)

    def _check_alive(self) -> None:
        if self._proc is not None and self._proc.poll() is not None:
            log = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"Prometheus exited with {self._proc.returncode}:\n{log}")

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=timeout_s)

    def __enter__(self) -> PrometheusServer:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------------ the HTTP API

    def _get(self, path: str, params: Mapping[str, str | Sequence[str]]) -> Any:
        query = urllib.parse.urlencode(params, doseq=True)
        return self._call(urllib.request.Request(f"{self.url}{path}?{query}"))

    def _post(self, path: str, params: Mapping[str, str | Sequence[str]]) -> Any:
        body = urllib.parse.urlencode(params, doseq=True).encode()
        return self._call(urllib.request.Request(f"{self.url}{path}", data=body))

    @staticmethod
    def _call(request: urllib.request.Request) -> Any:
        sent = request.data.decode() if isinstance(request.data, bytes) else request.full_url
        what = urllib.parse.unquote_plus(sent)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                answer = json.load(response)
        except urllib.error.HTTPError as exc:
            # Bad queries come back as 400/422 with a JSON body naming the error.
            with contextlib.suppress(ValueError):
                answer = json.loads(exc.read())
                raise PrometheusQueryError(
                    f"{answer.get('errorType')}: {answer.get('error')} (for {what})"
                ) from exc
            raise
        if answer.get("status") != "success":
            raise PrometheusQueryError(f"status {answer.get('status')}: {answer} (for {what})")
        if answer.get("warnings"):
            raise PrometheusQueryError(f"warnings {answer['warnings']} (for {what})")
        return answer["data"]

    def query(self, expr: str, at: float) -> list[InstantSample]:
        """The instant vector (or scalar) ``expr`` evaluates to at unix time ``at``."""
        data = self._post("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        if data["resultType"] == "scalar":
            return [InstantSample({}, float(data["result"][1]))]
        if data["resultType"] != "vector":
            raise PrometheusQueryError(f"{expr!r} gave a {data['resultType']}, not a vector")
        return [InstantSample(r["metric"], float(r["value"][1])) for r in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[RangeSeries]:
        """``expr`` evaluated every ``step_s`` from ``start`` to ``end`` (unix times)."""
        data = self._post(
            "/api/v1/query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"},
        )
        return [
            RangeSeries(r["metric"], tuple((float(t), float(v)) for t, v in r["values"]))
            for r in data["result"]
        ]

    def series(self, match: Iterable[str], start: float, end: float) -> list[dict[str, str]]:
        """Label sets of the series that ``match`` selectors select in [start, end]."""
        params = {"match[]": list(match), "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return list(self._post("/api/v1/series", params))

    def label_values(self, label: str, match: Iterable[str], start: float, end: float) -> list[str]:
        """Values of ``label`` on the series ``match`` selects in [start, end]."""
        params = {"match[]": list(match), "start": f"{start:.3f}", "end": f"{end:.3f}"}
        return list(self._get(f"/api/v1/label/{urllib.parse.quote(label)}/values", params))
