"""Every query of the bundled dashboards, run on a real Prometheus (Debian's) scraping
Triton's recorded GPU exposition (latency summaries on) and an exposition holding every
family of batchscope's exporter, GPU, MIG, findings and recommendation included.

The CPU testbed cannot fill the GPU, MIG and summary panels; here each query returns
data without an error, and the batching arithmetic gives the figures the recorded
counters imply. Counters grow with each scrape, so rates are real rates."""

from __future__ import annotations

import math
import re
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from collector.exporter.families import FAMILIES, Family, Kind
from grafana.dashgen import panel_queries, substitute, variable_queries
from grafana.dashgen.batching import average_batch_size, queue_per_request
from grafana.dashgen.lint import known_metrics
from tests.integration.prometheus_server import PrometheusServer, ScrapeJob

TRITON_TEXT = (
    Path(__file__).resolve().parents[1] / "fixtures" / "triton" / "metrics_gpu.txt"
).read_text()
RATE_INTERVAL = "4s"  # four 1 s scrapes
_SAMPLE = re.compile(r"^([a-zA-Z_:][\w:]*)(\{.*\})?\s+(\S+)$")

# Label values of the synthetic exporter exposition: two of each label that the
# dashboards split on, so grouping and matching are exercised.
_LABEL_VALUES: dict[str, tuple[str, ...]] = {
    "batch_size": ("1", "4"),
    "kind": ("gpu", "mig"),
    "position": ("0", "1"),
    "model": ("resnet50",),
    "target": ("triton-a",),
}


def _grown(text: str, counters: frozenset[str], scrapes: int) -> str:
    """``text`` with every counter multiplied by the number of scrapes so far."""
    lines = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in counters:
            value = float(match.group(3)) * scrapes
            line = f"{match.group(1)}{match.group(2) or ''} {value:g}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def _family_lines(family: Family, scrapes: int) -> list[str]:
    kind = "counter" if family.kind is Kind.COUNTER else "gauge"
    lines = [f"# HELP {family.name} {family.help}", f"# TYPE {family.name} {kind}"]
    label_sets: list[dict[str, str]] = [{}]
    for label in family.labels:
        values = _LABEL_VALUES.get(label, (f"{label}-a",))
        label_sets = [dict(s, **{label: v}) for s in label_sets for v in values]
    for i, labels in enumerate(label_sets):
        if family.name == "batchscope_finding":
            labels["kind"] = "idle_capacity" if i == 0 else "queue_saturation"
        text = ",".join(f'{k}="{v}"' for k, v in labels.items())
        value = 10.0 * (i + 1) * scrapes if kind == "counter" else 1.0
        lines.append(f"{family.name}{{{text}}} {value:g}")
    return lines


def _exporter_text(scrapes: int) -> str:
    return "\n".join(line for f in FAMILIES for line in _family_lines(f, scrapes)) + "\n"


class _Expositions(BaseHTTPRequestHandler):
    """Serves /triton/metrics and /exporter/metrics, counters growing per scrape."""

    scrapes: dict[str, int] = {}
    counters = known_metrics([TRITON_TEXT]).counters

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        n = self.scrapes[self.path] = self.scrapes.get(self.path, 0) + 1
        if self.path == "/triton/metrics":
            body = _grown(TRITON_TEXT, self.counters, n)
        elif self.path == "/exporter/metrics":
            body = _exporter_text(n)
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


def _wait_for_scrapes(prometheus: PrometheusServer, count: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    expr = 'min(count_over_time(up{job=~"triton|batchscope"}[1m]))'
    while True:
        got = prometheus.query(expr, time.time())
        if got and got[0].value >= count:
            return
        assert time.monotonic() < deadline, f"fewer than {count} scrapes in {timeout_s} s"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Expositions)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    address = f"127.0.0.1:{server.server_address[1]}"
    jobs = [
        ScrapeJob("triton", (address,), "/triton/metrics"),
        ScrapeJob("batchscope", (address,), "/exporter/metrics"),
    ]
    try:
        with PrometheusServer(tmp_path_factory.mktemp("prometheus"), jobs) as running:
            _wait_for_scrapes(running, 5, timeout_s=30)
            yield running
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def test_every_panel_and_annotation_query_returns_data(prometheus: PrometheusServer) -> None:
    now = time.time()
    empty, no_number = [], []
    for query in panel_queries():
        expr = substitute(query.expr, rate_interval=RATE_INTERVAL)
        series = prometheus.query_range(expr, now - 3, now, 1)  # raises on an error
        where = f"{query.dashboard_uid} / {query.panel_title} / {query.ref_id}: {expr}"
        if not series:
            empty.append(where)
        elif not any(math.isfinite(v) for s in series for _, v in s.points):
            no_number.append(where)
    assert not empty, "no data:\n" + "\n".join(empty)
    assert not no_number, "only NaN:\n" + "\n".join(no_number)


def test_every_variable_query_finds_values(prometheus: PrometheusServer) -> None:
    now = time.time()
    for variable in variable_queries():
        match = substitute(variable.selector)
        values = prometheus.label_values(variable.label, [match], now - 60, now)
        assert values, f"{variable.dashboard_uid} ${variable.name}: {variable.query}"


def _recorded_sum(name: str, model: str) -> float:
    total = 0.0
    for line in TRITON_TEXT.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) == name and f'model="{model}"' in (match.group(2) or ""):
            total += float(match.group(3))
    return total


@pytest.mark.parametrize(
    ("expr", "numerator", "denominator", "scale"),
    [
        (average_batch_size(), "nv_inference_count", "nv_inference_exec_count", 1.0),
        (
            queue_per_request(),
            "nv_inference_queue_duration_us",
            "nv_inference_request_success",
            1e-6,
        ),
    ],
    ids=["average batch size", "queue seconds per request"],
)
def test_ratios_sum_the_counters_first_then_divide(
    prometheus: PrometheusServer, expr: str, numerator: str, denominator: str, scale: float
) -> None:
    # resnet50 runs on two GPUs: summed first, the queue time per request weights each
    # GPU by its requests (1531.8 us); an average of the per-GPU ratios would not
    # (1532.5 us), and the model-level series without gpu_uuid (0/0) would make it NaN.
    model = "resnet50"
    got = prometheus.query(
        substitute(expr, rate_interval=RATE_INTERVAL, values={"model": model}), time.time()
    )
    expected = _recorded_sum(numerator, model) / _recorded_sum(denominator, model) * scale
    assert [s.labels.get("model") for s in got] == [model]
    assert got[0].value == pytest.approx(expected, rel=1e-6)
