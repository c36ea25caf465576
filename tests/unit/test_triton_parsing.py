"""Parse and map steps of the triton source, on recorded-style fixtures (no network).

The values asserted here are the fixtures' own numbers, summed by hand: for resnet50
(KIND_GPU on two GPUs) every counter is the sum of its two gpu_uuid series and its
model-level series; text_encoder has the response cache on and a metric_tags label.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector.errors import ParseError
from collector.records import BatchStat, Duration, ModelConfig, QueuePolicy, ServerMetrics
from collector.sources.exposition import parse_exposition
from collector.sources.triton import (
    map_metrics,
    map_model_config,
    map_model_stats,
    parse_metrics,
    parse_model_config,
    parse_model_stats,
    parse_server_version,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "triton"
GPU_A = "GPU-3c1f6a2e-8b4d-4e7a-9f15-0d2c6b8a7e41"
GPU_B = "GPU-9a0e5d7b-2c6f-4b13-a8e9-5f4d1c3b2a60"


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def gpu_metrics_text() -> str:
    return fixture_text("metrics_gpu.txt")


# --------------------------------------------------------------------------- exposition


def test_counter_family_keeps_triton_name_and_value_suffix_is_empty(gpu_metrics_text: str) -> None:
    # prometheus_client renames the samples of an un-suffixed counter to "<name>_total";
    # the parse step must hide that, or every Triton counter would read as missing.
    raw = {m.name: m for m in text_string_to_metric_families(gpu_metrics_text)}
    assert raw["nv_inference_count"].samples[0].name == "nv_inference_count_total"

    families = parse_exposition(gpu_metrics_text)
    assert "nv_inference_count_total" not in families
    count = families["nv_inference_count"]
    assert count.type == "counter"
    assert {s.suffix for s in count.samples} == {""}
    assert [s.value for s in count.samples] == [2400.0, 2000.0, 0.0, 850.0, 0.0]
    assert families["nv_energy_consumption"].type == "counter"


def test_summary_and_histogram_series_carry_their_suffix(gpu_metrics_text: str) -> None:
    families = parse_exposition(gpu_metrics_text)
    queue = families["nv_inference_queue_summary_us"]
    assert queue.type == "summary"
    assert {s.suffix for s in queue.samples} == {"", "_count", "_sum"}
    assert all("quantile" in s.labels for s in queue.samples if s.suffix == "")
    hist = families["nv_inference_first_response_histogram_ms"]
    assert {s.suffix for s in hist.samples} == {"_bucket", "_count", "_sum"}


def test_a_family_repeated_in_the_text_is_merged() -> None:
    text = (
        'nv_inference_count{model="m",version="1"} 1\n'
        "other 2\n"
        'nv_inference_count{model="m",version="1"} 3\n'
    )
    families = parse_exposition(text)
    assert [s.value for s in families["nv_inference_count"].samples] == [1.0, 3.0]


@pytest.mark.parametrize(
    "text",
    [
        "<html><body><h1>502 Bad Gateway</h1></body></html>",
        '{"model_stats": []}',
        'nv_inference_count{model="m",version="1" 12\n',
        'nv_inference_count{model="m"} twelve\n',
    ],
    ids=["html", "json", "unclosed-labels", "non-numeric"],
)
def test_malformed_exposition_raises_parse_error(text: str) -> None:
    with pytest.raises(ParseError, match="invalid Prometheus exposition"):
        parse_exposition(text)


# --------------------------------------------------------------------------- metrics → records


def test_model_metrics_are_summed_over_gpu_uuid(gpu_metrics_text: str) -> None:
    result = parse_metrics(gpu_metrics_text)
    assert [(m.model, m.version) for m in result.models] == [
        ("resnet50", "1"),
        ("text_encoder", "2"),
    ]
    resnet = result.models[0]
    assert resnet.request_success == 2200.0  # 1200 (GPU A) + 1000 (GPU B) + 0 (model-level)
    assert resnet.inference_count == 4400.0
    assert resnet.exec_count == 550.0
    assert resnet.request_duration_us == 11_270_000.0
    assert resnet.queue_duration_us == 3_370_000.0
    assert resnet.compute_input_duration_us == 177_000.0
    assert resnet.compute_infer_duration_us == 7_260_000.0
    assert resnet.compute_output_duration_us == 88_500.0
    assert resnet.pending_request_count == 5.0
    assert resnet.load_duration_s == 4.182  # the largest series, not a sum
    # No response cache on resnet50: the cache families are absent, not zero.
    assert resnet.cache_hit_count is None
    assert resnet.cache_miss_count is None
    assert resnet.cache_hit_duration_us is None
    assert resnet.cache_miss_duration_us is None


def test_failures_are_kept_per_reason_and_summed(gpu_metrics_text: str) -> None:
    resnet, text_encoder = parse_metrics(gpu_metrics_text).models
    assert resnet.request_failure_by_reason == {
        "OTHER": 1.0,
        "BACKEND": 3.0,
        "CANCELED": 2.0,
        "REJECTED": 7.0,
    }
    assert resnet.request_failure == 13.0
    assert text_encoder.request_failure_by_reason == {
        "OTHER": 4.0,
        "BACKEND": 0.0,
        "CANCELED": 0.0,
        "REJECTED": 0.0,
    }


def test_cache_families_and_extra_labels(gpu_metrics_text: str) -> None:
    text_encoder = parse_metrics(gpu_metrics_text).models[1]
    # The "_team" metric_tags label does not split the model.
    assert text_encoder.request_success == 1000.0  # 850 executed + 150 cache hits
    assert text_encoder.inference_count == 850.0
    assert text_encoder.exec_count == 425.0
    assert text_encoder.request_duration_us == 2_595_000.0
    assert text_encoder.queue_duration_us == 428_000.0
    assert text_encoder.cache_hit_count == 150.0
    assert text_encoder.cache_miss_count == 850.0
    assert text_encoder.cache_hit_duration_us == 1200.0
    assert text_encoder.cache_miss_duration_us == 25_500.0
    assert text_encoder.pending_request_count == 0.0
    assert text_encoder.load_duration_s == 1.07


def test_summary_quantiles_take_the_largest_gpu_and_skip_nan(gpu_metrics_text: str) -> None:
    resnet, text_encoder = parse_metrics(gpu_metrics_text).models
    # GPU A: 5012 7420 8110 9876 11020; GPU B: 5105 7388 8240 9702 11890; the
    # model-level series has no observations (NaN) and must not win or poison it.
    assert resnet.summary_quantiles_us["nv_inference_request_summary_us"] == {
        0.5: 5105.0,
        0.9: 7420.0,
        0.95: 8240.0,
        0.99: 9876.0,
        0.999: 11890.0,
    }
    assert set(resnet.summary_quantiles_us) == {
        "nv_inference_request_summary_us",
        "nv_inference_queue_summary_us",
        "nv_inference_compute_input_summary_us",
        "nv_inference_compute_infer_summary_us",
        "nv_inference_compute_output_summary_us",
    }
    # Triton drops the request summary for models with the response cache on.
    assert "nv_inference_request_summary_us" not in text_encoder.summary_quantiles_us
    assert text_encoder.summary_quantiles_us["nv_cache_hit_summary_per_model"] == {
        0.5: 7.0,
        0.9: 11.0,
        0.95: 12.0,
        0.99: 16.0,
        0.999: 19.0,
    }
    assert text_encoder.summary_quantiles_us["nv_inference_queue_summary_us"][0.99] == 1130.0


def test_gpu_samples(gpu_metrics_text: str) -> None:
    a, b = parse_metrics(gpu_metrics_text).gpus
    assert (a.source, a.uuid, a.kind) == ("triton", GPU_A, "gpu")
    assert a.utilization_gpu_pct == pytest.approx(83.0)  # nv_gpu_utilization 0.83 × 100
    assert a.memory_total_bytes == 85_899_345_920
    assert a.memory_used_bytes == 31_459_643_392
    assert a.power_w == 287.451
    assert a.power_limit_w == 400.0
    assert a.energy_j == 1_543_210.873
    assert b.uuid == GPU_B
    assert b.utilization_gpu_pct == 50.0
    assert b.memory_used_bytes == 12_884_901_888
    assert b.power_w == 143.2
    assert b.energy_j == 902_117.25
    assert isinstance(a.memory_total_bytes, int)


def test_server_metrics(gpu_metrics_text: str) -> None:
    assert parse_metrics(gpu_metrics_text).server == ServerMetrics(
        cpu_utilization=0.1375,
        cpu_memory_total_bytes=540_972_212_224.0,
        cpu_memory_used_bytes=83_736_842_240.0,
        pinned_memory_pool_total_bytes=268_435_456.0,
        pinned_memory_pool_used_bytes=4_194_304.0,
    )


def test_unknown_families_are_ignored(gpu_metrics_text: str) -> None:
    extra = (
        "# HELP nv_trt_llm_request_metrics TRT LLM request metrics\n"
        "# TYPE nv_trt_llm_request_metrics gauge\n"
        'nv_trt_llm_request_metrics{model="resnet50",request_type="active",version="1"} 3\n'
        "# TYPE process_cpu_seconds counter\n"
        "process_cpu_seconds 12.5\n"
    )
    assert parse_metrics(gpu_metrics_text + extra) == parse_metrics(gpu_metrics_text)


def test_cpu_only_host_has_no_gpus_and_empty_page_has_nothing() -> None:
    text = (
        "# HELP nv_inference_request_success Number of successful inference requests, "
        "all batch sizes\n"
        "# TYPE nv_inference_request_success counter\n"
        'nv_inference_request_success{model="mlp",version="1"} 4\n'
        "# HELP nv_cpu_utilization CPU utilization rate [0.0 - 1.0]\n"
        "# TYPE nv_cpu_utilization gauge\n"
        "nv_cpu_utilization 0.25\n"
    )
    result = parse_metrics(text)
    assert result.gpus == ()
    assert result.server == ServerMetrics(cpu_utilization=0.25)
    (mlp,) = result.models
    assert mlp.request_success == 4.0
    assert mlp.exec_count == 0.0  # absent counter: zero, the record's default
    assert mlp.pending_request_count is None  # absent gauge: not provided
    assert mlp.request_failure_by_reason == {}

    empty = parse_metrics("")
    assert (empty.models, empty.gpus, empty.server) == ((), (), None)


def test_untyped_lines_and_failures_without_reason_still_map() -> None:
    # Older Triton (no reason label), or text whose comment lines were stripped.
    text = (
        'nv_inference_request_failure{model="mlp",version="1"} 2\n'
        'nv_inference_exec_count{model="mlp",version="1"} 9\n'
    )
    (mlp,) = map_metrics(parse_exposition(text)).models
    assert mlp.request_failure_by_reason == {"UNSPECIFIED": 2.0}
    assert mlp.exec_count == 9.0


def test_bad_quantile_label_is_a_parse_error() -> None:
    text = (
        "# TYPE nv_inference_queue_summary_us summary\n"
        'nv_inference_queue_summary_us{model="m",version="1",quantile="p99"} 5\n'
    )
    with pytest.raises(ParseError, match="nv_inference_queue_summary_us.*p99"):
        parse_metrics(text)


# --------------------------------------------------------------------------- statistics


def test_model_stats_from_fixture() -> None:
    resnet, text_encoder = parse_model_stats(fixture_text("stats_two_models.json"))
    assert (resnet.model, resnet.version) == ("resnet50", "1")
    assert resnet.last_inference_ms == 1_764_690_000_123
    assert resnet.inference_count == 4400
    assert resnet.execution_count == 550
    assert resnet.success == Duration(count=2200, ns=11_270_000_000)
    assert resnet.fail == Duration(count=13, ns=52_000_000)
    assert resnet.queue == Duration(count=2200, ns=3_370_000_000)
    assert resnet.compute_input == Duration(count=2200, ns=177_000_000)
    assert resnet.compute_infer == Duration(count=2200, ns=7_260_000_000)
    assert resnet.compute_output == Duration(count=2200, ns=88_500_000)
    assert resnet.cache_hit == Duration()
    assert [b.batch_size for b in resnet.batch_stats] == [2, 4, 8, 16]
    assert [b.exec_count for b in resnet.batch_stats] == [40, 40, 420, 50]
    assert sum(b.batch_size * b.exec_count for b in resnet.batch_stats) == resnet.inference_count
    assert resnet.batch_stats[2] == BatchStat(
        batch_size=8,
        compute_input=Duration(count=420, ns=84_000_000),
        compute_infer=Duration(count=420, ns=2_898_000_000),
        compute_output=Duration(count=420, ns=42_000_000),
    )
    assert resnet.batch_stats[2].compute_ns == 3_024_000_000
    assert text_encoder.cache_hit == Duration(count=150, ns=1_200_000)
    assert text_encoder.cache_miss == Duration(count=850, ns=25_500_000)
    assert isinstance(resnet.batch_stats, tuple)


def test_stats_accept_counts_as_strings_and_numbers() -> None:
    doc = {
        "model_stats": [
            {
                "name": "mlp",
                "version": "3",
                "last_inference": "1764690000999",
                "inference_count": "12",
                "execution_count": 3.0,
                "inference_stats": {"success": {"count": "12", "ns": "4800000"}},
                "batch_stats": [
                    {"batch_size": "4", "compute_infer": {"count": "3", "ns": 900000}},
                ],
            }
        ]
    }
    (mlp,) = map_model_stats(doc)
    assert mlp.last_inference_ms == 1_764_690_000_999
    assert (mlp.inference_count, mlp.execution_count) == (12, 3)
    assert mlp.success == Duration(count=12, ns=4_800_000)
    assert mlp.queue == Duration()  # missing duration_stat: zero
    assert mlp.batch_stats == (BatchStat(batch_size=4, compute_infer=Duration(3, 900_000)),)
    assert isinstance(mlp.execution_count, int)


def test_stats_batch_stats_are_sorted_by_batch_size() -> None:
    doc = {"model_stats": [{"name": "m", "batch_stats": [{"batch_size": 8}, {"batch_size": 1}]}]}
    (m,) = map_model_stats(doc)
    assert [b.batch_size for b in m.batch_stats] == [1, 8]


@pytest.mark.parametrize(
    ("doc", "where"),
    [
        ([], "statistics: expected an object"),
        ({"model_stats": {}}, "model_stats: expected an array"),
        ({"model_stats": [{"version": "1"}]}, r"model_stats\[0\]: no model name"),
        (
            {"model_stats": [{"name": "m", "inference_count": "many"}]},
            r"model_stats\[0\]\.inference_count: expected an integer, got 'many'",
        ),
        (
            {"model_stats": [{"name": "m", "inference_stats": {"queue": {"ns": True}}}]},
            r"model_stats\[0\]\.inference_stats\.queue\.ns: expected an integer",
        ),
        (
            {"model_stats": [{"name": "m", "batch_stats": [{"batch_size": 1.5}]}]},
            r"model_stats\[0\]\.batch_stats\[0\]\.batch_size",
        ),
    ],
)
def test_stats_of_the_wrong_shape_name_the_field(doc: object, where: str) -> None:
    with pytest.raises(ParseError, match=where):
        map_model_stats(doc)


def test_garbled_stats_json_is_a_parse_error() -> None:
    with pytest.raises(ParseError, match="model statistics is not valid JSON"):
        parse_model_stats('{"model_stats": [{"name": "m",')
    assert parse_model_stats("{}") == ()


# --------------------------------------------------------------------------- configs


def test_config_with_dynamic_batching_queue_policy_and_gpu_groups() -> None:
    text = fixture_text("config_resnet50.json")
    cfg = parse_model_config(text)
    assert cfg == ModelConfig(
        model="resnet50",
        max_batch_size=16,
        dynamic_batching=True,
        preferred_batch_sizes=(8, 16),
        max_queue_delay_us=500,
        priority_levels=2,
        default_queue_policy=QueuePolicy(
            timeout_action="DELAY",
            default_timeout_us=100_000,
            allow_timeout_override=True,
            max_queue_size=64,
        ),
        instance_count=4,  # KIND_GPU count 2 on gpus [0, 1]: the count is per GPU
        instance_kind="KIND_GPU",
        backend="onnxruntime",
        platform="onnxruntime_onnx",
        raw_json=text,
    )


def test_config_with_default_batcher_and_mixed_groups() -> None:
    text = fixture_text("config_text_encoder.json")
    cfg = parse_model_config(text)
    assert cfg.dynamic_batching is True
    assert cfg.preferred_batch_sizes == ()
    assert cfg.max_queue_delay_us == 0
    assert cfg.default_queue_policy is None  # not set: protobuf JSON omits the message
    assert cfg.instance_count == 3  # KIND_GPU 2 × [0] + KIND_CPU 1
    assert cfg.instance_kind == "KIND_GPU"  # of the first group
    assert cfg.backend == "python"
    assert cfg.platform is None  # "" in the JSON: not provided
    assert cfg.raw_json == text
    assert json.loads(cfg.raw_json)["response_cache"] == {"enable": True}


def test_config_without_batching() -> None:
    cfg = parse_model_config(fixture_text("config_no_batching.json"))
    assert (cfg.model, cfg.max_batch_size, cfg.dynamic_batching) == ("densenet_onnx", 0, False)
    assert (cfg.preferred_batch_sizes, cfg.max_queue_delay_us, cfg.priority_levels) == ((), 0, 0)
    assert (cfg.instance_count, cfg.instance_kind) == (2, "KIND_CPU")


def test_config_instance_count_edge_cases() -> None:
    def count(groups: object) -> tuple[int, str]:
        cfg = map_model_config({"name": "m", "instance_group": groups}, raw_json="{}")
        return cfg.instance_count, cfg.instance_kind

    assert count([{"kind": "KIND_GPU", "count": 3}]) == (3, "KIND_GPU")  # no gpus listed
    assert count([{"kind": "KIND_CPU", "count": 2, "gpus": [0, 1]}]) == (2, "KIND_CPU")
    assert count([{"count": "2"}, {"kind": "KIND_GPU", "gpus": [0, 1, 2]}]) == (5, "KIND_AUTO")
    assert count([]) == (0, "KIND_AUTO")  # ensembles run no instances of their own
    no_groups = map_model_config({"name": "m"}, raw_json="{}")
    assert (no_groups.instance_count, no_groups.instance_kind) == (1, "KIND_AUTO")


def test_config_numbers_may_be_strings_and_name_may_come_from_the_caller() -> None:
    doc = {
        "max_batch_size": "8",
        "dynamic_batching": {"max_queue_delay_microseconds": "250", "priority_levels": "3"},
    }
    cfg = map_model_config(doc, raw_json="{...}", model="mlp")
    assert (cfg.model, cfg.max_batch_size, cfg.max_queue_delay_us, cfg.priority_levels) == (
        "mlp",
        8,
        250,
        3,
    )
    assert cfg.raw_json == "{...}"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"name": "m", "max_batch_size": 8', "model config is not valid JSON"),
        ("[]", "config: expected an object"),
        ("{}", "config: no model name"),
        ('{"name": "m", "instance_group": {}}', r"config\.instance_group: expected an array"),
        (
            '{"name": "m", "dynamic_batching": {"default_queue_policy": '
            '{"allow_timeout_override": "yes"}}}',
            r"default_queue_policy\.allow_timeout_override: expected true or false",
        ),
    ],
)
def test_bad_config_raises_parse_error(text: str, message: str) -> None:
    with pytest.raises(ParseError, match=message):
        parse_model_config(text)


def test_server_version() -> None:
    assert parse_server_version(fixture_text("server_metadata.json")) == "2.52.0"
    assert parse_server_version('{"name": "triton"}') is None
    with pytest.raises(ParseError):
        parse_server_version("not json")


# --------------------------------------------------------------------------- recorded fixtures
# metrics_cpu.txt, stats.json and config_batched.json are recorded from a real server by
# another part of the project; when present they must go through the same path cleanly.


def _recorded(name: str) -> str:
    path = FIXTURES / name
    if not path.exists():
        pytest.fail(f"recorded fixture {name} not present")
    return path.read_text(encoding="utf-8")


def test_recorded_cpu_metrics_parse() -> None:
    result = parse_metrics(_recorded("metrics_cpu.txt"))
    assert result.models, "a recorded page lists at least one model"
    assert all(m.request_failure >= 0 and m.exec_count >= 0 for m in result.models)
    assert all(m.inference_count >= m.exec_count for m in result.models)
    assert result.gpus == ()  # a CPU-only host exports no nv_gpu_* families
    assert result.server is not None and result.server.cpu_memory_total_bytes


def test_recorded_stats_parse() -> None:
    stats = parse_model_stats(_recorded("stats.json"))
    assert stats
    for s in stats:
        assert sum(b.exec_count for b in s.batch_stats) <= s.execution_count
        assert list(s.batch_stats) == sorted(s.batch_stats, key=lambda b: b.batch_size)


def test_recorded_batched_config_parses() -> None:
    text = _recorded("config_batched.json")
    cfg = parse_model_config(text)
    assert cfg.dynamic_batching is True
    assert cfg.max_batch_size > 0
    assert cfg.instance_count >= 1
    assert cfg.raw_json == text


def test_histogram_buckets_add_up_over_gpus(gpu_metrics_text: str) -> None:
    resnet, text_encoder = parse_metrics(gpu_metrics_text).models
    buckets = resnet.histogram_buckets["nv_inference_first_response_histogram_ms"]
    # Two GPUs: 1100 + 930 under 100 ms, 1200 + 1000 in all.
    assert buckets == {
        100.0: 2030.0,
        500.0: 2200.0,
        2000.0: 2200.0,
        5000.0: 2200.0,
        math.inf: 2200.0,
    }
    assert set(text_encoder.histogram_buckets) == {"nv_inference_first_response_histogram_ms"}
