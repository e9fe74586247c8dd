"""Plug-ins outside the package (``ABLATE_PLUGINS``): docs/extending.md's regime, one module and one YAML copied
from the page as written, and a throw-away algorithm, show up wherever a built-in does: the command line and its
choices, the sweep presets (as Hydra's basic sweeper expands them, and in W&B sweep files), the bench's and the
audit's defaults, a report's figure order and colours. Each check runs in a fresh process: a plug-in registered
here would stay in this process's registries."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_FAST, run_cli

DOC = REPO / "docs" / "extending.md"
BUILTIN = [
    "full",
    "offload",
    "int8",
    "nf4",
    "shared",
    "cached",
    "topk",
    "served",
    "distilled",
    "ema",
    "snapshot",
    "none",
]
# every regime: the sweep's plus the placebo, a control listed beside cached and left out of the sweeps
ALL = [*BUILTIN[: BUILTIN.index("cached") + 1], "placebo", *BUILTIN[BUILTIN.index("cached") + 1 :]]

ALGO_MODULE = """
from dataclasses import dataclass

from ablate.algos import registry
from ablate.algos.grpo import build_trainer
from ablate.config import GRPOAlgoConfig


@dataclass
class GrpoWideConfig(GRPOAlgoConfig):
    name: str = "grpo_wide"
    num_generations: int = 8


registry.register("grpo_wide", build_trainer, schema=GrpoWideConfig)
"""


def doc_files(text: str) -> dict[str, str]:
    """The page's code blocks that begin ``# file: <name>``: name -> content."""
    blocks = re.findall(r"```\w+\n# file: (\S+)\n(.*?)```", text, flags=re.S)
    return {name: body for name, body in blocks}


def plugin_folder(tmp_path, files: dict[str, str]) -> Path:
    """A plug-in folder holding ``files`` (name -> content): a module and the YAML that names it, or several."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    for name, body in files.items():
        (folder / name).write_text(body)
    return folder


def option_yaml(group: str, name: str) -> str:
    """An option file that is its schema (``schema/<group>/<name>``) and nothing else."""
    return f"defaults:\n  - /schema/{group}/{name}@_here_\n  - _self_\n"


@pytest.fixture
def plugin_dir(tmp_path) -> Path:
    """docs/extending.md's plug-in regime, written out as the page gives it, and a throw-away algorithm."""
    files = doc_files(DOC.read_text())
    assert set(files) == {"bf16_ref.py", "bf16.yaml"}, files
    return plugin_folder(
        tmp_path, {**files, "grpo_wide_algo.py": ALGO_MODULE, "grpo_wide.yaml": option_yaml("algo", "grpo_wide")}
    )


def plugins_env(folder) -> dict:
    """``ABLATE_PLUGINS`` set to ``folder``, and this checkout's ``ablate`` first on the path (a subprocess started
    in a temporary folder would otherwise import whichever copy is installed)."""
    return {"ABLATE_PLUGINS": str(folder), "PYTHONPATH": str(REPO)}


def run_py(code: str, env: dict, cwd: Path) -> subprocess.CompletedProcess:
    res = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    return res


LISTS = """
    import json
    from ablate.refs import regime_names
    from ablate.algos.registry import algorithm_names
    from ablate import presets
    from ablate.sweep.wandb_file import wandb_sweep
    from ablate.bench.config import all_regimes
    from ablate.audit.cli import split_regimes
    from ablate.cli import preflight
    from ablate.compose import compose
    from analysis.figure_style import regime_colors, regime_order

    print(json.dumps({
        "all": regime_names("all"), "sweep": regime_names("sweep"), "audit": regime_names("audit"),
        "algos": algorithm_names(),
        "grid": presets.grid(["algos"]),
        "wandb": wandb_sweep(["regimes"])["parameters"]["ref"]["values"],
        "bench": all_regimes(), "audit_default": split_regimes([])[0],
        "figures": list(regime_order()), "colours": list(regime_colors(["bf16", "none", "full"])),
        "jobs": preflight(["ref=bf16", "model=tiny", "logger=none"]) + preflight(["algo=grpo_wide", "model=tiny"]),
        "composed": [compose("ref=bf16", "model=tiny").ref.name, compose("algo=grpo_wide", "model=tiny").algo.num_generations],
    }))
"""


@pytest.mark.slow
def test_the_docs_plugin_regime_and_an_algorithm_are_in_every_list(plugin_dir, tmp_path):
    got = json.loads(run_py(LISTS, {"ABLATE_PLUGINS": str(plugin_dir)}, tmp_path).stdout.splitlines()[-1])
    every = [*ALL, "trdpo_soft", "trdpo_hard", "bf16"]  # unranked: after the built-ins, by name
    assert got["all"] == got["bench"] == got["figures"] == every
    assert got["sweep"] == got["wandb"] == [*BUILTIN, "bf16"]
    assert got["audit"] == got["audit_default"] == ["full", "int8", "nf4", "topk", "distilled", "bf16"]
    assert got["algos"] == ["dpo", "ppo", "grpo", "grpo_wide"]
    assert got["grid"] == {"algo": "dpo,ppo,grpo,grpo_wide", "ref": ",".join([*BUILTIN, "bf16"])}
    assert got["colours"] == ["full", "none", "bf16"]  # the report's order, the colours follow it
    assert got["jobs"] == 2 and got["composed"] == ["bf16", 8]


@pytest.mark.slow
def test_without_plugins_nothing_is_added(tmp_path):
    got = json.loads(run_py(LISTS.replace("bf16", "full").replace("algo=grpo_wide", "algo=grpo").replace(
        "compose(\"algo=grpo\", \"model=tiny\").algo.num_generations", "0"), {"ABLATE_PLUGINS": ""}, tmp_path
    ).stdout.splitlines()[-1])  # fmt: skip
    assert got["all"] == [*ALL, "trdpo_soft", "trdpo_hard"] and got["algos"] == ["dpo", "ppo", "grpo"]


# Hydra's own multirun on ablate's config: its basic sweeper expands the preset's grid (the resolvers) and its basic
# launcher calls this task function, which records each job's choices instead of training.
SWEEP = """
    import sys
    import hydra
    from ablate.compose import register_configs
    from ablate.paths import config_dir

    register_configs()

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name="config")
    def record(cfg):
        print("JOB", cfg.algo.name, cfg.ref.name, flush=True)

    sys.argv = ["sweep", "-m", "+sweep=algos", "model=tiny", "hydra/launcher=basic", "~hydra.callbacks.sweep_report",
                "hydra.sweep.dir=multirun", "hydra/job_logging=disabled", "hydra/hydra_logging=disabled"]
    record()
"""


@pytest.mark.slow
@pytest.mark.parametrize("with_plugins", [False, True])
def test_hydras_basic_sweeper_expands_the_registry_lists(plugin_dir, tmp_path, with_plugins):
    env = {"ABLATE_PLUGINS": str(plugin_dir) if with_plugins else ""}
    out = run_py(SWEEP, env, tmp_path).stdout
    jobs = [tuple(ln.split()[1:]) for ln in out.splitlines() if ln.startswith("JOB ")]
    algos = ["dpo", "ppo", "grpo"] + (["grpo_wide"] if with_plugins else [])
    refs = BUILTIN + (["bf16"] if with_plugins else [])
    assert sorted(jobs) == sorted((a, r) for a in algos for r in refs)


@pytest.mark.slow
def test_the_cli_lists_a_plugin_among_the_choices(plugin_dir, tmp_path):
    res = run_cli("ref=bf1", "model=tiny", cwd=tmp_path, timeout=120, env=plugins_env(plugin_dir))
    assert res.returncode == 2
    assert "ablate: error: unknown ref 'bf1' (choose from: bf16, cached," in res.stderr.strip().splitlines()[-1]
    res = run_cli("algo=grpo_wid", "model=tiny", cwd=tmp_path, timeout=120, env=plugins_env(plugin_dir))
    assert "unknown algo 'grpo_wid' (choose from: dpo, grpo, grpo_wide, ppo)" in res.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "write,says",
    [
        (lambda d: None, "ABLATE_PLUGINS: no such folder"),
        (lambda d: (d.mkdir(), (d / "broken.py").write_text("import nope_not_a_module\n")), "failed to import"),
        (lambda d: (d.mkdir(), (d / "orphan.yaml").write_text("x: 1\n")), "names no regime, algorithm, task or judge"),
    ],
)
def test_a_bad_plugin_is_one_line_before_anything_loads(tmp_path, write, says):
    folder = tmp_path / "plugins"
    write(folder)
    res = run_cli("model=tiny", cwd=tmp_path, timeout=120, env=plugins_env(folder))
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("ablate: error: ") and says in lines[0]
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_the_docs_plugin_regime_trains(plugin_dir, tmp_path):
    res = run_cli("ref=bf16", *TINY_FAST, "hydra.run.dir=run", cwd=tmp_path, timeout=600, env=plugins_env(plugin_dir))
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["steps"] == 3


JUDGE_MODULE = """
from dataclasses import dataclass

from ablate.config import JudgeConfig
from ablate.tasks import judge_registry


@dataclass
class ShortConfig(JudgeConfig):
    name: str = "short"


class Short:
    ID = "short-v1"  # names the judge in cache keys

    def __call__(self, texts, prompts):
        return [-len(t) / 100 for t in texts]


judge_registry.register("judge", "short", ShortConfig, lambda cfg, *, device, cache_root: Short())
"""


@pytest.mark.slow
def test_a_plugin_judge_is_one_module_and_one_yaml(tmp_path):
    folder = plugin_folder(tmp_path, {"short_judge.py": JUDGE_MODULE, "short.yaml": option_yaml("judge", "short")})
    res = run_py(
        """
        import json
        from ablate.cli import preflight
        from ablate.compose import compose
        from ablate.tasks.judges import make_judge

        judge = make_judge(compose("judge=short", "model=tiny").judge, device=None, cache_root=None)
        jobs = preflight(["judge=short", "model=tiny", "logger=none"])
        print(json.dumps({"jobs": jobs, "scores": judge(["ab", "abcd"], ["p", "p"]), "id": judge.ID}))
        """,
        plugins_env(folder),
        tmp_path,
    )
    assert json.loads(res.stdout.strip().splitlines()[-1]) == {"jobs": 1, "scores": [-0.02, -0.04], "id": "short-v1"}
    res = run_cli("judge=shor", "model=tiny", cwd=tmp_path, timeout=120, env=plugins_env(folder))
    assert "unknown judge 'shor' (choose from: reward_model, short, vader)" in res.stderr


TASK_MODULE = """
from dataclasses import dataclass

from ablate.config import TaskConfig
from ablate.errors import ConfigError
from ablate.tasks import task_registry


@dataclass
class GreetConfig(TaskConfig):
    name: str = "greet"
    word: str = "hello"


def load(cfg, tokenizer):
    t = cfg.task
    prompts = {
        split: [f"Say {t.word} to person {i} of the {split} set." for i in range(n)]
        for split, n in (("train", t.n_train), ("eval", cfg.eval.n_prompts), ("test", t.n_test))
    }
    return task_registry.TaskInputs(prompts, heldout=["Hello there, how are you today?"])


def check(cfg):
    if not cfg.task.word:
        raise ConfigError("task.word must not be empty")


task_registry.register("greet", GreetConfig, load, check=check)
"""


@pytest.mark.slow
def test_a_plugin_task_is_one_module_and_one_yaml(tmp_path):
    folder = plugin_folder(tmp_path, {"greet_task.py": TASK_MODULE, "greet.yaml": option_yaml("task", "greet")})
    env = plugins_env(folder)
    res = run_cli("task=gree", "model=tiny", cwd=tmp_path, timeout=120, env=env)
    assert "unknown task 'gree' (choose from: dataset, greet, sentiment)" in res.stderr
    res = run_cli("task=greet", "task.word=", "model=tiny", cwd=tmp_path, timeout=120, env=env)
    assert res.returncode == 2 and res.stderr.strip().splitlines() == ["ablate: error: task.word must not be empty"]
    res = run_cli("task=greet", *TINY_FAST, "hydra.run.dir=run", cwd=tmp_path, timeout=600, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["provenance"]["task"]["task"] == "greet"
    samples = (tmp_path / "run" / "samples.jsonl").read_text()
    assert "Say hello to person" in samples
