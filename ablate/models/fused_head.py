"""TRL's fused LM head (per-token log-probs without [B, T, V] logits), installed and called for the models
layer: :mod:`ablate.models.logprobs` computes every log-prob through it, and TRL's trainers put one on the policy.
It is TRL's private business: :mod:`ablate.algos.trl_fence` checks what this module relies on against the
installed TRL at start-up.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch

from ablate.models import lean_head

#: TRL versions this fence was checked with (tests/algos/test_trl_fence.py holds it to the installed one).
CHECKED_WITH = ("1.16.0",)
#: the keyword TRL's fused head adds to ``model.forward`` (documented by ``add_fused_lm_head``)
FUSED_KWARG = "fused_lm_head"


def _fused_head_fn():
    from trl.trainer import add_fused_lm_head

    return add_fused_lm_head


def _trl_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("trl")
    except PackageNotFoundError:
        return "(not installed)"


# -------------------------------------------------------------------------------------- fused LM head
def has_fused_head(model: torch.nn.Module) -> bool:
    """True when ``model.forward`` takes TRL's ``fused_lm_head`` keyword (installed by us, or by a TRL trainer
    on the policy, possibly with more outputs than log-probs: never install a second one over it)."""
    forward = model.__dict__.get("forward")
    if forward is None:
        return False
    return FUSED_KWARG in inspect.signature(forward, follow_wrapped=False).parameters


def add_fused_head(model: torch.nn.Module) -> None:
    """TRL's fused LM head on ``model`` (per-token log-probs without [B, T, V] logits), unless it has one."""
    use_lean_head()
    if not has_fused_head(model):
        _fused_head_fn()(model)


@cache
def use_lean_head() -> bool:
    """Every fused head (ours, and the one TRL's trainers put on the policy) folds its logits tiles on CPU with
    :mod:`ablate.models.lean_head`'s functions (bit for bit TRL's, in fewer whole-tile temporaries), with a TRL
    this fence was checked with; any other keeps TRL's own. Returns whether the lean ones are in place."""
    return _trl_version() in CHECKED_WITH and lean_head.install()


def fused_logprobs(model: torch.nn.Module, input_ids, attention_mask, labels) -> torch.Tensor:
    """[B, T-1] per-token log-probs of ``labels`` (-100: not scored, 0 there) through the fused head of
    ``model`` (or of the model it wraps)."""
    out = model(
        input_ids=input_ids, attention_mask=attention_mask, labels=labels, use_cache=False, **{FUSED_KWARG: True}
    )
    return out.log_probs
