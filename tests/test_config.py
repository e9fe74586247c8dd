"""Every option of every config group composes and validates: no drift between conf/ and code."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from ablate.config import unknown_keys, validate
from ablate.errors import ConfigError
from ablate.paths import config_dir
from tests.conftest import compose

GROUPS = ["model", "task", "algo", "ref", "logger"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes_and_validates(group, option):
    extra = {
        ("model", "hf"): ["model.name_or_path=/some/folder"],
    }.get((group, option), [])
    overrides = [f"{group}={option}", *extra] + (["model=tiny"] if group != "model" else [])
    raw = compose(*overrides)
    raw.out_dir = "."
    cfg = OmegaConf.to_object(raw)
    assert getattr(cfg, group).name == option  # the file's name is the option's name
    validate(cfg)


def test_every_group_has_options():
    for g in GROUPS:
        assert _options(g), g


def test_launcher_presets_exist():
    assert (config_dir() / "hydra" / "launcher").is_dir()
    assert _options("hydra/launcher")


def test_defaults_are_the_documented_default_job():
    raw = compose()
    assert (raw.model.name, raw.algo.name, raw.ref.name, raw.task.name, raw.logger.mode) == (
        "smollm2",
        "dpo",
        "full",
        "sentiment",
        "offline",
    )


@pytest.mark.parametrize(
    "override,needle",
    [
        ("algo.beta=-1", "algo.beta"),
        ("algo.max_steps=0", "algo.max_steps"),
        ("task.unsafe_threshold=1.5", "task.unsafe_threshold"),
        ("model.hidden_size=50", "model.hidden_size"),
        ("eval.interval=-1", "eval.interval"),
        ("task.temperature=0.7", "task.temperature must be 1.0"),
        ("model.device=gpu", "model.device"),
    ],
)
def test_out_of_range_values_fail_with_the_key_named(override, needle):
    raw = compose("model=tiny", override)
    raw.out_dir = "."
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        OmegaConf.to_object(raw)


def test_unknown_key_and_wrong_type_fail_at_composition():
    from hydra.errors import ConfigCompositionException

    with pytest.raises(ConfigCompositionException):
        compose("algo.not_a_key=1")
    with pytest.raises(ConfigCompositionException):
        compose("algo.beta=abc")


def test_keys_no_schema_defines_are_found():
    """Hydra's '+' adds keys unchecked; the walk over the composed config finds them at any depth."""
    raw = compose("model=tiny", "+algo.betta=0.3", "+unknown_key=1", "+model.adapter.rr=2", "ref=topk", "++ref.kk=1")
    found = unknown_keys(raw)
    assert sorted(found) == ["algo.betta", "model.adapter.rr", "ref.kk", "unknown_key"]
    assert "beta" in found["algo.betta"] and "k" in found["ref.kk"]  # what the schema has there


@pytest.mark.parametrize(
    "overrides",
    [(), ("+sweep=report_dpo",), ("+sweep=ema",), ("algo=ppo", "ref=shared"), ("model=hf", "model.name_or_path=x/y")],
)
def test_schema_walk_accepts_every_legitimate_config(overrides):
    assert unknown_keys(compose(*overrides)) == {}
