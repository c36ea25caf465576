"""The testbed's config file and the model repository it writes: every mistake names
its field; an ensemble's config forwards to its model and quotes any name."""

from __future__ import annotations

from pathlib import Path

import pytest

from collector.errors import ConfigError
from collector.testbed.config import parse_testbed_config
from collector.testbed.models import ModelSpec, config_pbtxt, write_model_repository

HOSTILE = '<img src="x" onerror=alert(1)>'


def test_an_ensemble_entry_parses_and_forwards_to_its_model() -> None:
    config = parse_testbed_config(
        {
            "models": [
                {"name": "inner", "dynamic_batching": True, "preferred_batch_sizes": [4, 8]},
                {"name": HOSTILE, "ensemble_of": "inner"},
            ]
        }
    )
    inner, outer = config.models
    assert inner.preferred_batch_sizes == (4, 8) and outer.ensemble_of == "inner"
    text = config_pbtxt(outer)
    assert 'platform: "ensemble"' in text
    assert 'name: "<img src=\\"x\\" onerror=alert(1)>"' in text  # quotes escaped
    assert 'model_name: "inner"' in text and "backend" not in text


@pytest.mark.parametrize(
    ("models", "field", "words"),
    [
        (
            [{"name": "a", "ensemble_of": "missing"}],
            "models[0].ensemble_of",
            "not one of the models",
        ),
        ([{"name": "a", "ensemble_of": "a"}], "models[0].ensemble_of", "another model"),
        ([{"name": "a", "ensemble_of": 3}], "models[0].ensemble_of", ""),
        ([{"name": "a", "colour": "red"}], "models[0].colour", "unknown key"),
        ([{"name": "a", "max_batch_size": 0}], "models[0].max_batch_size", ">= 1"),
    ],
)
def test_mistakes_name_their_field(models: list[dict[str, object]], field: str, words: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_testbed_config({"models": models})
    assert err.value.field == field and words in str(err.value)


def test_the_repository_holds_no_code_for_an_ensemble(tmp_path: Path) -> None:
    root = write_model_repository(
        tmp_path, [ModelSpec("inner"), ModelSpec("outer", ensemble_of="inner")]
    )
    assert (root / "inner" / "1" / "model.py").exists()
    assert (root / "outer" / "1").is_dir() and not (root / "outer" / "1" / "model.py").exists()
    with pytest.raises(ValueError, match="ensemble_of"):
        write_model_repository(tmp_path / "x", [ModelSpec("outer", ensemble_of="gone")])
