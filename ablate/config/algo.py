"""Schemas of the ``algo`` group."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from omegaconf import MISSING

from ablate.config.checks import DPOLoss, KLControl, KLEstimator, KLPlacement, RewardSource, require, require_choice


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

    def summary_fields(self) -> dict[str, Any]:
        """What ``summary.json`` records about these settings beyond ``config.yaml`` (none here)."""
        return {}


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
    # KLPlacement; None: the reward for k1, else the algorithm's own place (:meth:`placement`)
    kl_placement: str | None = None
    kl_control: str = "fixed"  # KLControl
    kl_target: float = 0.05
    kl_horizon: int = 100  # adaptive: steps over which a clipped error of 0.2 changes beta by 20%
    reward: str = "gold"  # RewardSource
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        require_choice("algo.kl_estimator", self.kl_estimator, KLEstimator)
        if self.kl_placement is not None:
            require_choice("algo.kl_placement", self.kl_placement, KLPlacement)
        require_choice("algo.kl_control", self.kl_control, KLControl)
        require_choice("algo.reward", self.reward, RewardSource)
        require(
            self.temperature == 1.0,
            f"algo.temperature must be 1.0 (reference log-probs are untempered), got {self.temperature}",
        )
        require(self.kl_target > 0, f"algo.kl_target must be > 0, got {self.kl_target}")
        require(self.kl_horizon >= 1, f"algo.kl_horizon must be >= 1, got {self.kl_horizon}")

    #: where the KL term goes when ``kl_placement`` is unset and the estimator is not k1
    home_placement = "reward"

    def placement(self) -> str:
        """Where the KL term goes: ``kl_placement`` as written; unset, ``reward`` for k1 (k1 in the loss, the
        zero-gradient mistake, is never a default) and the algorithm's :attr:`home_placement` otherwise."""
        if self.kl_placement is not None:
            return self.kl_placement
        return "reward" if self.kl_estimator == "k1" else self.home_placement

    def zero_gradient_ablation(self) -> bool:
        """True when the run asked for k1 in the loss: on-policy its expected gradient is 0 (an ablation)."""
        return self.kl_estimator == "k1" and self.placement() == "loss"

    def summary_fields(self) -> dict[str, Any]:
        return {"kl_zero_gradient_ablation": self.zero_gradient_ablation()}


@dataclass
class GRPOAlgoConfig(OnlineAlgoConfig):
    name: str = "grpo"
    beta: float = 0.04  # KL coefficient (per token); 0 = no reference term (TRL's default)
    learning_rate: float = 1e-6
    batch_size: int = 8  # completions per optimiser step (prompts per step = batch_size / num_generations)
    num_generations: int = 4  # group size
    kl_target: float = 0.05  # adaptive: target per-token KL
    max_prompt_length: int = 128
    home_placement = "loss"  # k3 in the loss: TRL's own term

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
