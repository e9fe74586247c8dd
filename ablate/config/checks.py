"""The checks every config schema runs, and the choices of its string settings."""

from __future__ import annotations

from typing import Any, Literal, get_args

from ablate.errors import ConfigError

# The choices of each string setting. OmegaConf 2.3 refuses Literal annotations in structured configs
# ("Unexpected type annotation"): the fields are typed str and __post_init__ checks them with require_choice.
Precision = Literal["bf16", "fp32"]  # bf16: fp32 weights, bf16 autocast for compute (fast with avx512_bf16)
# auto: bf16 where the device computes it natively (a GPU with bf16, a CPU with AVX-512 BF16 or AMX), else fp32;
# settled when the job is validated, and config.yaml holds the choice made (ablate.models.precision.resolve)
ModelPrecision = Literal["auto", "bf16", "fp32"]
# sigmoid: the DPO paper's loss; simpo: SimPO (Meng et al. 2024), reference-free (ref=none only)
DPOLoss = Literal["sigmoid", "ipo", "hinge", "simpo"]
KLControl = Literal["fixed", "adaptive"]  # adaptive: Ziegler et al. 2019
# with l = log ref - log pi on a sample of pi: k1 = -l (unbiased, often < 0), k2 = l^2 / 2 (biased, >= 0),
# k3 = (e^l - 1) - l (unbiased, >= 0; TRL's GRPO term)
KLEstimator = Literal["k1", "k2", "k3"]
# reward: the per-token penalty, detached, enters the reward (advantages); loss: it is differentiated in the loss
KLPlacement = Literal["reward", "loss"]
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
