"""Every option of every config group composes and validates, and its YAML file holds only what differs from
its schema's defaults: no drift between conf/ and code, and each fact in one place."""

from __future__ import annotations

from typing import get_args

import pytest
from omegaconf import OmegaConf

from ablate import config as C
from ablate.cli import config_groups
from ablate.compose import compose as compose_typed
from ablate.compose import register_configs, unknown_keys
from ablate.errors import ConfigError
from ablate.paths import config_dir
from ablate.validation import validate
from tests.conftest import compose

GROUPS = config_groups()


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_every_option_composes_and_validates(group, option):
    extra = {
        ("model", "hf"): ["model.name_or_path=/some/folder"],
        ("task", "dataset"): ["task.path=/some/pairs.jsonl"],
        ("judge", "reward_model"): ["judge.path=/some/folder"],
        ("safety", "classifier"): ["safety.path=/some/folder"],
    }.get((group, option), [])
    overrides = [f"{group}={option}", *extra] + (["model=tiny"] if group != "model" else [])
    cfg = compose_typed(*overrides)
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
        ("eval.n_prompts=0", "eval.n_prompts"),
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
    with pytest.raises(ConfigCompositionException):
        compose("task.n_eval=4")  # the evaluation's prompt count is eval.n_prompts


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


# ------------------------------------------------------------------------------ YAML holds only what differs
# the schema a `_global_` option file's keys outside its own package are compared with
GROUP_BASES = {
    "model": C.ModelConfig,
    "task": C.TaskConfig,
    "algo": C.AlgoConfig,
    "logger": C.LoggerConfig,
    "eval": C.EvalConfig,
}


def _yaml_files() -> list[str]:
    files = ["config.yaml", "bench.yaml"]
    return files + [f"{g}/{o}.yaml" for g in GROUPS for o in _options(g)]


def _leaves(node, prefix: str = "") -> dict:
    """Dotted key -> value of every leaf of a plain nested dict (lists are leaves)."""
    out = {}
    for key, value in node.items():
        if isinstance(value, dict) and value:
            out.update(_leaves(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _schema_defaults(defaults: list) -> dict:
    """Dotted key -> default of the schema a YAML file starts from (the first entry of its defaults list), placed
    at its package; for a ``_global_`` file, other groups' keys default to their group's base schema."""
    from hydra.core.config_store import ConfigStore

    from ablate.bench.config import register

    register()
    entry = defaults[0]
    path, _, package = entry.lstrip("/").partition("@")
    node = ConfigStore.instance().load(f"{path}.yaml").node
    prefix = "" if package in ("", "_here_") else f"{package}."
    found = _leaves(OmegaConf.to_container(node, resolve=False), prefix)
    for group, base in GROUP_BASES.items():
        if prefix and prefix != f"{group}.":
            found.update(_leaves(OmegaConf.to_container(OmegaConf.structured(base), resolve=False), f"{group}."))
    return found


@pytest.mark.parametrize("name", _yaml_files())
def test_no_yaml_value_repeats_its_schema_default(name):
    body = OmegaConf.to_container(OmegaConf.load(config_dir() / name), resolve=False)
    defaults = [d for d in body.pop("defaults") if isinstance(d, str)]
    body.pop("hydra", None)
    schema = _schema_defaults(defaults)
    leaves = _leaves(body)
    assert set(leaves) <= set(schema), f"{name}: keys its schema lacks"
    repeats = {k: v for k, v in leaves.items() if schema[k] == v and isinstance(v, bool) == isinstance(schema[k], bool)}
    assert repeats == {}, f"{name} repeats its schema's defaults: drop them"


@pytest.mark.parametrize("group", ["model", "algo", "ref"])
def test_each_schema_is_stored_under_its_name_default(group):
    """An option's name is written once, as its schema's ``name`` default; the YAML file does not repeat it."""
    from hydra.core.config_store import ConfigStore

    register_configs()
    for option in ConfigStore.instance().list(f"schema/{group}"):
        node = ConfigStore.instance().load(f"schema/{group}/{option}").node
        assert node.name == option.removesuffix(".yaml")


# ------------------------------------------------------------------------------------------- string choices
CHOICES = [
    ("model.precision", C.ModelPrecision, []),
    ("eval.precision", C.Precision, []),
    ("eval.sampler", C.Sampler, []),
    ("algo.loss_type", C.DPOLoss, []),
    ("algo.kl_estimator", C.KLEstimator, ["algo=grpo"]),
    ("algo.kl_control", C.KLControl, ["algo=ppo"]),
    ("algo.kl_placement", C.KLPlacement, ["algo=ppo"]),
    ("algo.reward", C.RewardSource, ["algo=grpo"]),
    ("logger.mode", C.LoggerMode, []),
]


@pytest.mark.parametrize("key,choices,extra", CHOICES, ids=[k for k, _, _ in CHOICES])
def test_a_string_choice_takes_its_literals_and_names_them_otherwise(key, choices, extra):
    for value in get_args(choices):
        cfg = compose_typed("model=tiny", *extra, f"{key}={value}")
        group, leaf = key.split(".")
        assert getattr(getattr(cfg, group), leaf) == value and type(getattr(getattr(cfg, group), leaf)) is str
    with pytest.raises(ConfigError) as e:
        compose_typed("model=tiny", *extra, f"{key}=nope")
    assert str(e.value) == f"{key} must be one of {', '.join(get_args(choices))}, got 'nope'"


def test_require_is_the_one_config_check():
    C.require(True, "never")
    with pytest.raises(ConfigError, match="^the message$"):
        C.require(False, "the message")
    assert C.require is C.require  # the old name, until its importers are renamed


# ------------------------------------------------------------------------------------------------ compose
def test_compose_types_sets_out_dir_and_leaves_hydra_cleared(tmp_path):
    from hydra.core.global_hydra import GlobalHydra

    from ablate.compose import hydra_session

    cfg = compose_typed("model=tiny", "algo=ppo", out_dir=tmp_path)
    assert isinstance(cfg, C.Config) and isinstance(cfg.algo, C.PPOAlgoConfig) and cfg.out_dir == str(tmp_path)
    assert compose_typed("model=tiny").out_dir == "."
    with hydra_session():
        assert compose_typed("ref=ema").ref.name == "ema"  # inside a session: composed in it
        assert GlobalHydra.instance().is_initialized()
    assert not GlobalHydra.instance().is_initialized()
    with pytest.raises(ConfigError, match=r"unknown key 'algo.betta' \(did you mean algo.beta\?\)"):
        compose_typed("+algo.betta=0.3")
    assert not GlobalHydra.instance().is_initialized()


def test_the_bench_composes_through_the_same_helper():
    from ablate.bench.config import BenchConfig, compose_bench, run_configs

    bench = compose_bench(["model=tiny", "repeats=2", "regimes=[full,int8]"])
    assert isinstance(bench, BenchConfig) and bench.repeats == 2 and bench.model.name == "tiny"
    runs = run_configs(bench.regimes, ["model=tiny", "repeats=2", "algo.beta=0.2"])
    assert sorted(runs) == ["full", "int8"]
    assert all(c.algo.beta == 0.2 and c.logger.name == "none" and c.out_dir == "." for c in runs.values())
