"""Coverage-guided fuzzing (atheris, libFuzzer) of everything batchscope reads from
outside: Triton's metrics page (prometheus_client's parser, the fast parser and the
Triton metrics parser, the caching ones kept across inputs as a scraper keeps them),
its statistics, model config and server metadata JSON, and the settings file.

The first byte of an input picks the reader, the rest is the body. A reader may return
records or raise batchscope's own errors (``BatchscopeError``); any other exception is
a crash: libFuzzer stops, prints the traceback and writes the input to
``-artifact_prefix``. Run (libFuzzer's flags after the module)::

    python -m tests.reliability.fuzz_inputs -max_total_time=60 CORPUS_DIR

``seed_corpus(directory)`` writes the recorded answers of tests/fixtures/triton and a
settings file as the starting corpus, each prefixed with its reader's byte.
"""

from __future__ import annotations

import contextlib
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import atheris  # type: ignore[import-untyped, import-not-found, unused-ignore]

with atheris.instrument_imports(include=["collector", "prometheus_client", "yaml"]):
    from collector.config import load_settings
    from collector.sources.exposition import parse_exposition
    from collector.sources.fast_exposition import FastExpositionParser
    from collector.sources.triton_json import (
        ModelStatsParser,
        parse_model_config,
        parse_model_stats,
        parse_server_version,
    )
    from collector.sources.triton_metrics import TritonMetricsParser, parse_metrics

from collector.errors import BatchscopeError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "triton"
_SETTINGS_DIR = Path(tempfile.mkdtemp(prefix="batchscope-fuzz-"))
_SETTINGS_FILE = _SETTINGS_DIR / "batchscope.yaml"

# Kept across inputs, as one target's parsers are kept across scrapes.
_fast = FastExpositionParser()
_triton = TritonMetricsParser()
_stats = ModelStatsParser()


def _text(body: bytes) -> str:
    return body.decode("utf-8", "replace")


def _exposition(body: bytes) -> None:
    parse_exposition(_text(body))


def _fast_exposition(body: bytes) -> None:
    _fast.parse(body)


def _triton_metrics(body: bytes) -> None:
    _triton.parse(body)
    parse_metrics(_text(body))


def _statistics(body: bytes) -> None:
    _stats.parse(body)
    parse_model_stats(body)


def _config(body: bytes) -> None:
    parse_model_config(_text(body), "fallback")


def _server_metadata(body: bytes) -> None:
    parse_server_version(body)


def _settings(body: bytes) -> None:
    _SETTINGS_FILE.write_bytes(body)
    load_settings(config_file=_SETTINGS_FILE, env={})


READERS: tuple[Callable[[bytes], None], ...] = (
    _exposition,
    _fast_exposition,
    _triton_metrics,
    _statistics,
    _config,
    _server_metadata,
    _settings,
)
SEEDS: dict[Callable[[bytes], None], tuple[str, ...]] = {
    _exposition: ("metrics_cpu.txt",),
    _fast_exposition: ("metrics_gpu.txt",),
    _triton_metrics: ("metrics_cpu.txt", "metrics_gpu.txt"),
    _statistics: ("stats.json", "stats_two_models.json"),
    _config: ("config_batched.json", "config_resnet50.json", "config_text_encoder.json"),
    _server_metadata: ("server_metadata.json",),
}
SETTINGS_SEED = b"""\
targets: [http://triton-a:8000, {url: http://triton-b:8000, name: b}]
interval_s: 5
ui: {admin_password: a, viewer_password: b}
alerts:
  receivers: [{name: ops, webhook: {url: "https://h/x", secret: whsec_c2VjcmV0}}]
  routes: [{match: {alertname: X}, receivers: [ops]}]
analysis: {sustain: 3}
"""


def one_input(data: bytes) -> None:
    if not data:
        return
    reader = READERS[data[0] % len(READERS)]
    with contextlib.suppress(BatchscopeError):  # the readers' own errors are fine
        reader(data[1:])


def seed_corpus(directory: Path) -> int:
    """Write the starting corpus into ``directory``; the number of files."""
    directory.mkdir(parents=True, exist_ok=True)
    count = 0
    for index, reader in enumerate(READERS):
        names = SEEDS.get(reader, ())
        bodies = [(FIXTURES / name).read_bytes() for name in names] or [SETTINGS_SEED]
        for body in bodies:
            (directory / f"seed-{index}-{count}").write_bytes(bytes([index]) + body)
            count += 1
    return count


def main(argv: list[str]) -> None:
    atheris.Setup(argv, one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
