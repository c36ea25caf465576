"""Bad input to the settings loader: whatever the YAML file, the environment or the
command line holds, ``load_settings`` gives ``Settings`` or raises ``ConfigError`` (a
message naming the field), never ``UnicodeDecodeError``, ``RecursionError``, a bare
pydantic ``ValidationError`` or another accident of the input.

The inputs: arbitrary bytes and text as the file; YAML documents built from the
settings' own keys with arbitrary values; a complete valid file mutated byte by byte;
arbitrary ``BATCHSCOPE_*`` variables; arbitrary command-line overrides. Each property
runs at a moderate example count here and at a high one in the ``long`` test.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import strategies as st

from collector.config import Settings, load_settings
from collector.errors import ConfigError
from tests.reliability.conftest import FaultLedger
from tests.reliability.fuzz_support import FAST_EXAMPLES, LONG_EXAMPLES, run_property

VALID_FILE = b"""\
targets:
  - url: http://triton-a:8000
    metrics_url: http://triton-a:8002/metrics
    name: triton-a
  - http://triton-b:8000
db_url: sqlite:///batchscope.db
interval_s: 5
duration_s: null
timeout_s: 3
max_response_bytes: 16777216
sources: [triton, host]
backoff_max_s: 60
jitter_s: 0.5
scrape_workers: 16
file_sd: [targets/*.json]
shard: 0/3
slo_p95_ms: {resnet50: 40}
analysis: {sustain: 3}
retention: {raw_keep_s: 604800, rollup_bucket_s: 300}
apply: {before_s: 30, after_s: 30, min_qps_ratio: 0.95}
ui: {admin_password: a-secret, viewer_password: b-secret, apply_verify_s: 30}
alerts:
  receivers:
    - name: ops
      webhook: {url: "https://hooks.example.com/b", secret: whsec_c2VjcmV0LWtleS1ieXRlcw==}
    - name: chat
      slack: {url: "https://hooks.slack.com/services/T/B/X"}
    - name: am
      alertmanager: {url: "http://alertmanager:9093", resend_s: 60}
  routes:
    - match: {alertname: BatchscopeTargetDown}
      severity: [critical]
      receivers: [ops, am]
  repeat_interval_s: 14400
  rules: {queue_saturation: {for_s: 60, severity: critical}}
"""

# Nesting past the interpreter's recursion limit: YAML's composer recurses.
DEEP_YAML = b"a: " + b"[" * 5000 + b"]" * 5000 + b"\n"
NOT_UTF8 = b"interval_s: 5\ndb_url: \xff\xfe\n"
# Top-level keys that are not strings (an int, YAML's null): pydantic-settings called
# .lower() on them. The second is the input libFuzzer found (tests/reliability/fuzz_inputs).
KEY_NOT_A_NAME = b"1: 2\ninterval_s: 5\n"
FUZZER_FOUND = (
    b'&targets: snut":{"count":33,"ns":5564975},"compute_infer":{"count":33,"ns":382661200\n'
    b"nv_inference_queue_summary_us_sum{gpnterval_s: lertn3}\n"
)

# --------------------------------------------------------------------------- inputs

_KEYS = sorted(Settings.model_fields)
_GROUP_KEYS = sorted(
    {
        name
        for field in ("retention", "apply", "ui", "alerts")
        for name in type(getattr(Settings(), field)).model_fields
    }
    | {"url", "metrics_url", "name", "webhook", "slack", "alertmanager", "secret", "match"}
    | {"secret_file", "secret_env", "receivers", "severity", "for_s", "enabled", "triton"}
)
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16)
    | st.sampled_from(["0/3", "5", "-1", "http://h:8000", "whsec_", "1e400", "nan", "yes"])
)


def _yaml_values() -> st.SearchStrategy[Any]:
    key = st.sampled_from(_GROUP_KEYS) | st.text(max_size=6) | st.integers(-5, 5) | st.none()
    return st.recursive(
        _SCALARS,
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(key, inner, max_size=5),
        max_leaves=25,
    )


# YAML keys may be any scalar: 1:, null:, true: and 1.5: are keys too.
_ODD_KEYS = st.integers(-5, 5) | st.none() | st.booleans() | st.floats(allow_nan=False)
_DOCUMENTS = st.dictionaries(
    st.sampled_from(_KEYS) | st.text(max_size=8) | _ODD_KEYS, _yaml_values()
)


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    data = bytearray(VALID_FILE)
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, max(0, len(data) - 1)))
        op = draw(st.integers(0, 4))
        if op == 0 and data:
            data[at] = draw(st.integers(0, 255))
        elif op == 1:
            del data[at : at + draw(st.integers(1, 30))]
        elif op == 2:
            data[at:at] = draw(
                st.sampled_from(
                    [
                        b":",
                        b"- ",
                        b"{",
                        b"[",
                        b"\n  ",
                        b"'",
                        b'"',
                        b"&a ",
                        b"*a",
                        b"!!",
                        b"\t",
                        b"\xff",
                        b"? ",
                        b"|",
                        b"%YAML 1.1\n",
                        b"---\n",
                        b"null",
                    ]
                )  # fmt: skip
            )
        elif op == 3:
            data[at:at] = draw(st.binary(min_size=1, max_size=6))
        else:
            del data[at:]
    return bytes(data)


_FILES = (
    st.binary(max_size=300)
    | st.text(max_size=300).map(str.encode)
    | _DOCUMENTS.map(lambda d: yaml.safe_dump(d, allow_unicode=True, sort_keys=False).encode())
    | mutated()
)

_ENV_NAMES = st.sampled_from(
    [f"BATCHSCOPE_{k.upper()}" for k in _KEYS]
    + [f"BATCHSCOPE_{g}_{k.upper()}" for g in ("UI", "APPLY", "RETENTION", "ALERTS") for k in _KEYS]
    + [
        "BATCHSCOPE_TRITON",
        "BATCHSCOPE_METRICS_URL",
        "BATCHSCOPE_UI_ADMIN_PASSWORD",
        "BATCHSCOPE_ALERTS_RECEIVERS",
        "BATCHSCOPE_ALERTS_ROUTES",
        "BATCHSCOPE_UI",
        "BATCHSCOPE_ALERTS",
    ]
)
_ENV_VALUES = (
    st.text(st.characters(codec="utf-8"), max_size=30)
    | _yaml_values().map(
        lambda v: yaml.safe_dump(v, default_flow_style=True, sort_keys=False).strip()
    )
    | st.sampled_from(['{"a": ', "[]", "{}", '[{"name": "x"}]', "null", "1,2,,3"])
)
_ENVS = st.dictionaries(_ENV_NAMES, _ENV_VALUES, max_size=4)
_OVERRIDES = st.dictionaries(
    st.sampled_from([*_KEYS, "triton", "metrics_url"]),
    _yaml_values() | st.lists(st.text(max_size=20), max_size=3),
    max_size=4,
)


# --------------------------------------------------------------------------- checks


def own_errors_only(load: Callable[[], object]) -> None:
    try:
        load()
    except ConfigError as exc:
        assert exc.field, "ConfigError without a field"
        assert str(exc).startswith("invalid setting "), str(exc)


def check_file(body: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batchscope.yaml"
        path.write_bytes(body)
        own_errors_only(lambda: load_settings(config_file=path, env={}))


def check_env(env: dict[str, str]) -> None:
    own_errors_only(lambda: load_settings(env=env))


def check_overrides(overrides: dict[str, Any]) -> None:
    own_errors_only(lambda: load_settings(env={}, overrides=overrides))


PROPERTIES: list[tuple[str, st.SearchStrategy[Any], Callable[[Any], None], list[Any], str]] = [
    (
        "file",
        _FILES,
        check_file,
        [DEEP_YAML, NOT_UTF8, KEY_NOT_A_NAME, FUZZER_FOUND, VALID_FILE],
        "arbitrary bytes/text, YAML of the settings' keys with arbitrary values, and a "
        "complete valid file mutated, as the settings file",
    ),
    (
        "environment",
        _ENVS,
        check_env,
        [{"BATCHSCOPE_ALERTS_RECEIVERS": '{"a": '}, {"BATCHSCOPE_UI": "[]"}],
        "arbitrary BATCHSCOPE_* variables",
    ),
    (
        "command line",
        _OVERRIDES,
        check_overrides,
        [{"triton": [""]}],
        "arbitrary command-line overrides",
    ),
]


def _run(name: str, examples: int, fault_ledger: FaultLedger) -> None:
    _, strategy, check, pinned, describe = next(p for p in PROPERTIES if p[0] == name)
    run_property(
        fault_ledger,
        fault=f"settings loader, {name}: {describe}",
        strategy=strategy,
        check=check,
        pinned=pinned,
        examples=examples,
        answers=f"Settings or ConfigError naming the field, nothing else{_FIXED.get(name, '')}",
    )


@pytest.mark.parametrize("name", [p[0] for p in PROPERTIES])
def test_settings_loader_raises_only_config_errors(name: str, fault_ledger: FaultLedger) -> None:
    _run(name, FAST_EXAMPLES, fault_ledger)


@pytest.mark.long
@pytest.mark.parametrize("name", [p[0] for p in PROPERTIES])
def test_settings_loader_raises_only_config_errors_long(
    name: str, fault_ledger: FaultLedger
) -> None:
    _run(name, LONG_EXAMPLES, fault_ledger)


_FIXED = {
    "file": "; found and fixed: a file not UTF-8 raised UnicodeDecodeError, YAML nested "
    "5000 deep raised RecursionError, a top-level key that is not a string (1:, null:; "
    "found by the coverage-guided fuzzer) raised AttributeError (now ConfigErrors, pinned)",
}


def test_pinned_files_give_config_errors(tmp_path: Path) -> None:
    """Files that once escaped as other exceptions, each a ConfigError now."""
    for body in (DEEP_YAML, NOT_UTF8, KEY_NOT_A_NAME, FUZZER_FOUND):
        path = tmp_path / "bad.yaml"
        path.write_bytes(body)
        with pytest.raises(ConfigError) as caught:
            load_settings(config_file=path, env={})
        assert caught.value.field == "config"
