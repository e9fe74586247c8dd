"""The benchmark's typed config (``conf/bench.yaml``): the model, task and algorithm groups of a run, plus
what to measure; and the run config each benchmarked regime would train with."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from ablate.compose import compose, hydra_session
from ablate.config import require


def all_regimes() -> list[str]:
    """Every registered regime, in the canonical order (``full`` first: the ratios' denominator)."""
    from ablate.refs import regime_names

    return regime_names("all")


RUN_KEYS = ("model", "task", "algo", "seed")  # the bench's overrides that apply to the benchmarked runs


@dataclass
class BenchConfig:
    model: Any = MISSING
    task: Any = MISSING
    algo: Any = MISSING
    eval: Any = None  # what a model preset sets of a run's evaluation (model=tiny); the runs compose their own
    seed: int = 0
    threads: int | None = None  # torch threads (None: torch's default, all cores)
    regimes: list[str] = field(default_factory=lambda: all_regimes())  # every registered one, canonical order
    repeats: int = 5  # timed reference calls per regime, interleaved across regimes (the median is reported)
    trainer_steps: int = 3  # optimiser steps per harness / stock-TRL training round (the first is not timed)
    trainer_rounds: int = 2  # alternating rounds harness, TRL, harness, TRL, ...
    trainers: list[str] = field(default_factory=lambda: ["dpo", "grpo"])
    peak_memory: bool = True  # one short run per regime in a subprocess, for its peak resident memory
    matmul_size: int = 2048  # square matmul for the machine's ceiling
    out: str = "reports/bench"  # writes <out>/<model>.md and <out>/<model>.csv

    def __post_init__(self) -> None:
        from ablate.refs import regime_class

        for r in self.regimes:
            regime_class(r)  # unknown regime: one clear error
        require(self.repeats >= 1, f"repeats must be >= 1, got {self.repeats}")
        require(
            self.trainer_steps >= 2,
            f"trainer_steps must be >= 2 (the first step is not timed), got {self.trainer_steps}",
        )
        require(self.trainer_rounds >= 1, f"trainer_rounds must be >= 1, got {self.trainer_rounds}")
        require(set(self.trainers) <= {"dpo", "grpo"}, f"trainers must be among dpo, grpo, got {self.trainers}")


def register() -> None:
    """Store the bench's schema (``bench_schema``) next to the run's."""
    from hydra.core.config_store import ConfigStore

    from ablate.compose import register_configs

    register_configs()
    ConfigStore.instance().store(name="bench_schema", node=BenchConfig)


def compose_bench(overrides: list[str]) -> BenchConfig:
    """The bench's typed config for ``python -m ablate.bench <overrides>``."""
    register()
    return compose(*overrides, config_name="bench")


def run_configs(regimes: list[str], overrides: list[str]) -> dict:
    """The run config each regime would train with (the bench's model/task/algo/seed overrides applied), by
    regime, with the CLI's checks passed (config, packages, model source, the installed TRL): bad input is one
    line before any model loads, as for ``python -m ablate``."""
    from ablate.algos import trl_fence
    from ablate.cli import check_config

    keep = [o for o in overrides if o.split("=")[0].lstrip("+~").split(".")[0] in RUN_KEYS]
    out = {}
    with hydra_session():
        for r in regimes:
            out[r] = compose(*keep, f"ref={r}", "logger=none", "checkpoint.interval=0")
            check_config(out[r])
    trl_fence.check()
    return out


def error_line(prog: str, e: Exception) -> int:
    """Bad input as one line on stderr (an ablate error as it says it; a Hydra composition error made readable by
    the CLI's own wording), and the exit status 2."""
    import sys

    from ablate.cli import _friendly
    from ablate.errors import AblateError

    print(f"{prog}: error: {e if isinstance(e, AblateError) else _friendly(e)}", file=sys.stderr)
    return 2
