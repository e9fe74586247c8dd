"""Schemas of the ``ref``, ``logger``, ``eval``, ``checkpoint`` and ``divergence`` groups, the top-level ``Config``
and :func:`validate`, the checks that span groups."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from ablate.config.checks import LoggerMode, Precision, Sampler, require, require_choice, require_count_or_none


# ------------------------------------------------------------------------------------------------- ref
@dataclass
class RefConfig:
    """Base of every regime's schema; regimes subclass it in ``ablate/refs/<regime>.py``."""

    name: str = MISSING


# ---------------------------------------------------------------------------------------------- logger
@dataclass
class LoggerConfig:
    name: str = "wandb"  # wandb | none
    project: str = "ablate"
    mode: str = "offline"  # LoggerMode
    entity: str | None = None
    group: str | None = None  # default: the sweep's folder name for -m runs, none for single runs
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        require_choice("logger.mode", self.mode, LoggerMode)


# ------------------------------------------------------------------------------------------------ eval
@dataclass
class EvalConfig:
    # 128 prompts x 6 coupled samples at the final evaluation, one sample each at step 0 and in between: enough for
    # the default job's final reward_delta interval to be narrower than the report's +-0.05 margin (docs/measured.md)
    n_prompts: int = 128  # held-out prompts the evaluation samples (a split of their own: never trained on)
    interval: int = 20  # evaluate every N optimiser steps (0: only before and after training)
    at_start: bool = True  # evaluate at step 0: the regime's pure approximation error
    batch_size: int = 8  # rows per scoring forward (the audit holds three [rows, length, vocabulary] fp32 logits)
    # rows per generate call; None: as many as fit (ablate.models.batching; in fp32 a row also keeps its logits there)
    sample_batch_size: int | None = None
    # sampling seed; None: 1234 + 1000 * seed (ablate.eval.evaluator.sampling_seed), each run seed its own noise
    seed: int | None = None
    precision: str = "fp32"  # Precision of sampling and scoring: the samples come from the model whose KL is scored
    sampler: str = "coupled"  # Sampler (ablate.models.sampling): coupled gives the step-0 policy the SFT's responses
    samples_per_prompt: int = 6  # coupled samples per prompt at the final evaluation (keys (prompt, 0..k-1))
    interim_samples_per_prompt: int | None = 1  # at step 0 and every `interval` steps; None: samples_per_prompt
    # audit what the algorithm consumes from its reference at step 0 and at the end (ablate.eval.fidelity)
    fidelity: bool = True

    def __post_init__(self) -> None:
        require_choice("eval.precision", self.precision, Precision)
        require_choice("eval.sampler", self.sampler, Sampler)
        require(self.interval >= 0, f"eval.interval must be >= 0, got {self.interval}")
        require(self.n_prompts >= 1, f"eval.n_prompts must be >= 1, got {self.n_prompts}")
        require(self.batch_size >= 1, f"eval.batch_size must be >= 1, got {self.batch_size}")
        require_count_or_none("eval.sample_batch_size", self.sample_batch_size)
        require(self.samples_per_prompt >= 1, f"eval.samples_per_prompt must be >= 1, got {self.samples_per_prompt}")
        require_count_or_none("eval.interim_samples_per_prompt", self.interim_samples_per_prompt)


@dataclass
class CheckpointConfig:
    # A resumable checkpoint (weights, optimiser, scheduler, RNG, regime state: 1.6 GB for SmolLM2) is saved at the first
    # step end `minutes` after the attempt's start or the last one, every `interval` steps, and last only if `keep`.
    interval: int = 0  # also every N optimiser steps (0: by time only)
    minutes: float = 10.0  # wall-time budget between checkpoints, the most work a kill loses (0: not by time)
    keep: bool = False  # save the last step's checkpoint and keep it after the job finished

    def __post_init__(self) -> None:
        require(self.interval >= 0, f"checkpoint.interval must be >= 0, got {self.interval}")
        require(self.minutes >= 0, f"checkpoint.minutes must be >= 0, got {self.minutes}")


@dataclass
class DivergenceConfig:
    """When a job is stopped and recorded as ``diverged``. A NaN/inf training loss always is."""

    max_kl: float | None = None  # nats per response: true KL (at an evaluation) or the trainer's KL beyond this

    def __post_init__(self) -> None:
        require(self.max_kl is None or self.max_kl > 0, f"divergence.max_kl must be > 0, got {self.max_kl}")


# ------------------------------------------------------------------------------------------------ plan
def parse_margin_value(metric: str, value: str) -> tuple[float, bool]:
    """``(number, relative)`` of a margin written ``0.05`` (in the metric's unit) or ``10%`` (of the baseline's
    mean); a ConfigError for anything else (a margin must be a positive number)."""
    text = str(value).strip()
    relative = text.endswith("%")
    try:
        number = float(text[:-1] if relative else text)
    except ValueError:
        number = math.nan
    require(
        math.isfinite(number) and number > 0,
        f"margin {metric}={value!r}: a margin is a positive number (0.05) or a share of the baseline's mean (10%)",
    )
    return (number / 100 if relative else number), relative


@dataclass
class PlanConfig:
    """The analysis a sweep declares before its runs (docs/statistics.md, "Margins declared in advance"): every
    run's config.yaml keeps it, and ``python -m analysis report`` reads its margins from the runs. Empty (the
    default): nothing declared; the report then says its margins were chosen at analysis time."""

    primary: str | None = None  # the primary metric (None: the report's default, reward_delta)
    margins: dict[str, str] = field(default_factory=dict)  # metric -> "0.05" (its unit) or "10%" (of the baseline)
    seeds: int | None = None  # the seeds the verdicts were planned for (python -m analysis plan)
    basis: str = ""  # where the margins come from, in words (e.g. 25% of full's effect in reports/calibration)
    null_control: str | None = None  # the regime that must come out equivalent to the baseline (None: the report's)

    def __post_init__(self) -> None:
        for metric, value in self.margins.items():
            parse_margin_value(metric, value)
        require(self.seeds is None or self.seeds >= 2, f"plan.seeds must be 2 or more, got {self.seeds}")


# ------------------------------------------------------------------------------------------------- top
@dataclass
class Config:
    model: Any = MISSING
    task: Any = MISSING
    judge: Any = MISSING  # the gold reward
    safety: Any = MISSING  # the safety judge
    algo: Any = MISSING
    ref: Any = MISSING
    logger: Any = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    plan: PlanConfig = field(default_factory=PlanConfig)  # the analysis declared before the runs (margins)
    seed: int = 0
    threads: int | None = None  # torch CPU threads (None: all cores, or cores / workers under a parallel launcher)
    save_policy: bool = False  # save the final policy (or adapter) into the run folder
    out_dir: str = "${hydra:runtime.output_dir}"

    def __post_init__(self) -> None:
        require(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        require(self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}")


def check_processes(cfg: Config) -> None:
    """What a job launched on several processes (``accelerate launch``, ``torchrun``) needs: an algorithm that runs
    data-parallel, a global batch that splits evenly, and at least one evaluation prompt per process."""
    from ablate.distributed import world_size

    n = world_size()
    if n == 1:
        return
    require(
        cfg.algo.name != "ppo",
        f"algo=ppo runs in one process (our PPO is not data-parallel), but this job was launched on {n}: "
        "run it without accelerate launch / torchrun",
    )
    require(
        cfg.algo.batch_size % n == 0,
        f"algo.batch_size={cfg.algo.batch_size} is the global batch: it must split evenly over the {n} processes",
    )
    require(
        cfg.eval.n_prompts >= n,
        f"eval.n_prompts={cfg.eval.n_prompts} is fewer than the {n} processes the evaluation is sharded over",
    )
