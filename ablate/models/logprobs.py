"""Token log-probs and next-token scores of a causal LM: the one place they are computed from a model.

Per-token log-probs of given tokens go through TRL's fused LM head (no [B, T, V] logits; the same kernel
TRL's trainers use for the policy, so a reference equal to the policy gives exactly equal log-probs). The
fused head is TRL's private business: :mod:`ablate.models.fused_head` installs and calls it (checked by
:mod:`ablate.algos.trl_fence`).
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING

import torch

from ablate.models import fused_head

if TYPE_CHECKING:
    from ablate.batch import TokenBatch


def add_logprob_head(model: torch.nn.Module) -> None:
    """Install TRL's fused LM head on ``model`` unless it has one (ours, or a TRL trainer's on the policy)."""
    fused_head.add_fused_head(model)


def has_logprob_head(model: torch.nn.Module) -> bool:
    """True when ``model`` already has TRL's fused LM head."""
    return fused_head.has_fused_head(model)


def response_labels(batch: TokenBatch) -> torch.Tensor:
    """The batch's tokens with every non-response position set to -100 (not scored)."""
    return batch.input_ids.masked_fill(batch.completion_mask == 0, -100)


def head_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1] float32 log-probs of the response tokens (0 elsewhere) through a fused head already installed
    on ``model`` or on the model it wraps (a peft model's base model), without gradients."""
    with torch.no_grad():
        out = fused_head.fused_logprobs(model, batch.input_ids, batch.attention_mask, response_labels(batch))
    return out.float()


def token_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1] log-probs of the response tokens under ``model`` (0 at non-response positions)."""
    add_logprob_head(model)
    return head_logprobs(model, batch)


def forward_parameters(model: torch.nn.Module) -> set[str]:
    """The keyword arguments ``model``'s forward names (a peft model's: its base model's, which it passes them to)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return set(inspect.signature(base.forward).parameters)


def next_token_logits(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1, V] float32 next-token logits at each position (unnormalised log-scores: no copy is made
    when the model's logits are float32; the audit normalises them in float64, a chunk at a time).

    Positions before the first that scores a response token (:attr:`TokenBatch.target_mask`, in any row) are 0:
    where the model takes ``logits_to_keep``, its LM head runs from that position on only (a prompt's positions
    need no vocabulary-wide logits; every caller reads the response positions)."""
    scored = batch.target_mask.any(0).nonzero()
    first = int(scored[0]) if len(scored) else 0
    keep = (
        {"logits_to_keep": batch.input_ids.shape[1] - first}
        if first and "logits_to_keep" in forward_parameters(model)
        else {}
    )
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False, **keep).logits
    if not keep:
        return logits[:, :-1].float()
    out = logits.new_zeros(logits.shape[0], batch.input_ids.shape[1] - 1, logits.shape[-1], dtype=torch.float32)
    out[:, first:] = logits[:, :-1]
    return out


def next_token_logprobs(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1, V] float32 next-token log-probs at each position (normalised in float32)."""
    return torch.log_softmax(next_token_logits(model, batch), dim=-1)


def logits_logprobs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """[B, T] float32 log-probs of ``tokens`` [B, T] under next-token ``logits`` [B, T, V] (full log-softmax;
    keeps the gradient)."""
    return torch.log_softmax(logits.float(), -1).gather(-1, tokens[..., None]).squeeze(-1)
