"""Settings: layering of file, environment and command line, and one clear error per
invalid field."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.config import load_settings, target_from_url
from collector.errors import ConfigError

KNOWN = {"triton", "nvml", "host"}


def test_defaults_and_metrics_url_derived_from_triton_url() -> None:
    s = load_settings(env={}, overrides={"triton": ["http://triton-a:8000"]}, known_sources=KNOWN)
    assert s.db_url == "sqlite:///batchscope.db"
    assert s.interval_s == 5.0 and s.duration_s is None
    (t,) = s.targets
    assert t.url == "http://triton-a:8000"
    assert t.metrics_url == "http://triton-a:8002/metrics"
    assert t.name == "triton-a:8000"


def test_bare_host_port_and_explicit_metrics_url() -> None:
    t = target_from_url("127.0.0.1:18000", "127.0.0.1:18002")
    assert t.url == "http://127.0.0.1:18000"
    assert t.metrics_url == "http://127.0.0.1:18002/metrics"


def test_file_then_env_then_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "bs.yaml"
    cfg.write_text(
        "targets:\n  - url: http://a:8000\n    name: a\n"
        "interval_s: 2\ntimeout_s: 1\nsources: [triton, host]\n"
        "retention: {raw_keep_s: 3600}\nslo_p95_ms: {resnet: 40}\n"
    )
    s = load_settings(
        config_file=cfg,
        env={"BATCHSCOPE_INTERVAL_S": "3"},
        overrides={"db_url": "sqlite:///x.db"},
        known_sources=KNOWN,
    )
    assert [t.name for t in s.targets] == ["a"]
    assert s.interval_s == 3.0  # env beats the file
    assert s.timeout_s == 1.0
    assert s.db_url == "sqlite:///x.db"
    assert s.sources == ("triton", "host")
    assert s.retention.raw_keep_s == 3600.0
    assert s.slo_p95_ms == {"resnet": 40.0}
    s2 = load_settings(
        config_file=cfg,
        env={"BATCHSCOPE_TRITON": "http://b:8000,http://c:9000"},
        known_sources=KNOWN,
    )
    assert [t.url for t in s2.targets] == ["http://b:8000", "http://c:9000"]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"env": {"BATCHSCOPE_INTERVAL_S": "abc"}}, "interval_s"),
        ({"overrides": {"interval_s": 0}}, "interval_s"),
        ({"overrides": {"timeout_s": -1}}, "timeout_s"),
        ({"overrides": {"max_response_bytes": "12.5"}}, "max_response_bytes"),
        ({"overrides": {"db_url": "not a url"}}, "db_url"),
        ({"overrides": {"triton": ["ftp://x:1"]}}, "triton"),
        ({"overrides": {"triton": ["http://x:notaport"]}}, "triton"),
        ({"overrides": {"sources": ["triton", "gpu"]}}, "sources"),
        ({"overrides": {"metrics_url": ["http://x:8002"]}}, "metrics_url"),
        (
            {"overrides": {"triton": ["http://a:1", "http://b:1"], "metrics_url": ["http://a:2"]}},
            "metrics_url",
        ),
        ({"env": {"BATCHSCOPE_RETENTION_RAW_KEEP_S": "-5"}}, "retention.raw_keep_s"),
        ({"overrides": {"scrape_workers": 0}}, "scrape_workers"),
        ({"env": {"BATCHSCOPE_SCRAPE_WORKERS": "many"}}, "scrape_workers"),
        ({"overrides": {"scrape_workers": True}}, "scrape_workers"),
        ({"overrides": {"shard": "3/3"}}, "shard"),
        ({"overrides": {"shard": "0/0"}}, "shard"),
        ({"env": {"BATCHSCOPE_SHARD": "1"}}, "shard"),
        ({"overrides": {"shard": "a/b"}}, "shard"),
        ({"overrides": {"file_sd": ["fleet.json", " "]}}, "file_sd"),
        ({"overrides": {"file_sd_refresh_s": 0}}, "file_sd_refresh_s"),
        ({"overrides": {"statistics_interval_s": 31}}, "statistics_interval_s"),
        ({"env": {"BATCHSCOPE_STATISTICS_INTERVAL_S": "-1"}}, "statistics_interval_s"),
    ],
)
def test_invalid_settings_name_the_field(kwargs: dict, field: str) -> None:
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as err:
        load_settings(known_sources=KNOWN, **kwargs)
    assert err.value.field == field
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("targets:\n  - name: a\n", "targets[0].url"),
        ("targets:\n  - url: http://a:1\n    colour: red\n", "targets[0].colour"),
        ("intervall_s: 3\n", "intervall_s"),
        ("retention: {keep: 3}\n", "retention.keep"),
        ("slo_p95_ms: {resnet: fast}\n", "slo_p95_ms.resnet"),
        ("slo_p95_ms: 40\n", "slo_p95_ms"),
        ("targets: [http://a:1, http://a:1]\n", "targets"),
        ("- just\n- a list\n", "config"),
        ("interval_s: [unclosed\n", "config"),
    ],
)
def test_invalid_file_names_the_field(tmp_path: Path, text: str, field: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_settings(config_file=cfg, env={}, known_sources=KNOWN)
    assert err.value.field == field


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(config_file=tmp_path / "nope.yaml", env={})


def test_detector_thresholds_from_the_file_are_validated(tmp_path: Path) -> None:
    from collector.analysis.detect import detector_settings

    cfg = tmp_path / "a.yaml"
    cfg.write_text("analysis: {queue_share: 0.7, sustain: 2}\n")
    s = load_settings(config_file=cfg, env={})
    d = detector_settings(s.analysis)
    assert d.queue_share == 0.7 and d.sustain == 2
    with pytest.raises(ConfigError) as err:
        detector_settings({"queue_shares": 0.7})
    assert err.value.field == "analysis.queue_shares"
    with pytest.raises(ConfigError) as err:
        detector_settings({"sustain": 0})
    assert err.value.field == "analysis.sustain"


def test_apply_settings_layer_key_by_key_and_the_ui_may_use_its_own_windows(tmp_path: Path) -> None:
    cfg = tmp_path / "apply.yaml"
    cfg.write_text("apply: {before_s: 20, min_qps_ratio: 0.9}\nui: {apply_verify_s: 5}\n")
    s = load_settings(config_file=cfg, env={"BATCHSCOPE_APPLY_AFTER_S": "10"})
    assert (s.apply.before_s, s.apply.after_s, s.apply.min_qps_ratio) == (20.0, 10.0, 0.9)
    assert s.apply.max_p95_ratio == 1.10 and s.apply.settle_s == 1.0  # today's defaults
    assert (s.ui_apply.before_s, s.ui_apply.after_s, s.ui_apply.min_qps_ratio) == (5.0, 5.0, 0.9)
    assert load_settings(env={}).ui_apply == load_settings(env={}).apply


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"overrides": {"apply": {"min_qps_ratio": 1.5}}}, "apply.min_qps_ratio"),
        ({"overrides": {"apply": {"max_p95_ratio": 0.9}}}, "apply.max_p95_ratio"),
        ({"env": {"BATCHSCOPE_APPLY_BEFORE_S": "0"}}, "apply.before_s"),
        ({"overrides": {"interval_s": True}}, "interval_s"),
        ({"env": {"BATCHSCOPE_SLO_P95_MS": "{not json"}}, "slo_p95_ms"),
        ({"overrides": {"analysis": {"sustain": 0}}}, "analysis.sustain"),
    ],
)
def test_every_setting_is_validated_at_start(kwargs: dict, field: str) -> None:
    kwargs.setdefault("env", {})
    with pytest.raises(ConfigError) as err:
        load_settings(**kwargs)
    assert err.value.field == field


def test_a_secret_is_never_echoed_in_an_error() -> None:
    with pytest.raises(ConfigError) as err:
        load_settings(
            env={}, overrides={"ui": {"admin_password": "hunter2", "viewer_password": "hunter2"}}
        )
    assert err.value.field == "ui.viewer_password" and "hunter2" not in str(err.value)


def test_settings_built_in_code_read_no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.config import Settings

    monkeypatch.setenv("BATCHSCOPE_INTERVAL_S", "9")
    assert Settings().interval_s == 5.0
    assert load_settings().interval_s == 9.0


def test_fleet_settings_from_the_environment_and_their_defaults() -> None:
    s = load_settings(
        env={"BATCHSCOPE_FILE_SD": "sd/a.json, sd/*.yaml", "BATCHSCOPE_SHARD": " 1/4 "}
    )
    assert s.file_sd == ("sd/a.json", "sd/*.yaml")
    assert (s.shard, s.shard_of) == ("1/4", (1, 4))
    d = load_settings(env={})
    assert (d.file_sd, d.shard, d.shard_of, d.scrape_workers) == ((), None, None, 16)
    assert d.file_sd_refresh_s == 5.0
    with pytest.raises(ConfigError, match=r"invalid setting shard: i must be 0\.\.2"):
        load_settings(env={}, overrides={"shard": "3/3"})
