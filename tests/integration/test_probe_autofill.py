"""The probe against a real Triton: after batchscope enables dynamic batching without
preferred sizes, Triton's auto-complete reports ``preferred_batch_size: [32]`` (its
max_batch_size); batchscope reads that as Triton's own fill, not the operator's aim,
and raises no ``batch_below_preferred`` against its own change."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from collector.analysis.detect import BATCH_BELOW_PREFERRED, DetectorSettings, run_detectors
from collector.analysis.recommend import recommend_model
from collector.config import Settings, target_from_url
from collector.scheduler import CollectorService, build_sources
from collector.sources.triton_json import parse_model_config
from collector.store import Store
from collector.testbed.load import run_load
from collector.testbed.models import ModelSpec
from collector.testbed.server import TritonServer

pytestmark = pytest.mark.integration

MODEL = ModelSpec("m", fixed_ms=4.0, per_sample_ms=0.3, max_batch_size=32)
CLIENTS = 8  # batches of at most 8: far below an aim of 32


def observe(server: TritonServer, store: Store, settings: Settings, seconds: float) -> float:
    """Collect while CLIENTS closed-loop clients drive the model; returns the end time."""
    service = CollectorService(settings, store, build_sources(settings))
    service.start()
    load = threading.Thread(
        target=run_load,
        args=(server.grpc_url, MODEL.name),
        kwargs={"concurrency": CLIENTS, "duration_s": seconds},
    )
    try:
        load.start()
        load.join()
    finally:
        service.shutdown()
    return time.time()


def test_the_applied_probe_raises_no_batch_below_preferred(
    triton_factory: Callable[..., TritonServer], tmp_path: Path
) -> None:
    server = triton_factory([MODEL])
    target = target_from_url(server.http_url, server.metrics_url)
    settings = Settings(
        targets=(target,),
        db_url=f"sqlite:///{tmp_path}/p.db",
        interval_s=0.5,
        jitter_s=0.0,
        sources=("triton",),
    )
    store = Store(settings.db_url)
    try:
        end = observe(server, store, settings, 8.0)
        probe = recommend_model(store, target.name, MODEL.name, window_s=6.0, now=end)
        assert probe is not None and probe.kind == "probe"
        assert probe.proposed_config.preferred_batch_sizes == ()
        server.load_model(MODEL.name, json.loads(probe.config_json))

        # Triton fills in what the probe left out.
        effective = server.get_json(f"/v2/models/{MODEL.name}/config")
        assert effective["dynamic_batching"]["preferred_batch_size"] == [MODEL.max_batch_size]

        end = observe(server, store, settings, 10.0)
        findings = run_detectors(
            store, DetectorSettings(window_s=6.0, sustain=1, min_samples=3), now=end
        )
        batching = store.latest_model_configs(target.name)[(target.name, MODEL.name)]
        assert batching.config.dynamic_batching  # the detectors saw the probe running
        assert [f for f in findings if f.kind == BATCH_BELOW_PREFERRED] == []
        # ... because batchscope knows whose the [32] is (imported here: where that
        # reading is missing, the assertion above is what fails).
        from collector.analysis.configs import preferred_sizes_origin

        config = parse_model_config(json.dumps(effective), MODEL.name)
        assert preferred_sizes_origin(config, probe.proposed_config) == "auto"
    finally:
        store.close()
