"""Memory-lean stand-ins for the CPU fallback tiles of TRL's fused LM head (``trl/kernels/chunked_logprob.py``).

Without Triton (CPU), TRL folds each ``[tokens, vocabulary chunk]`` logits tile in torch ops that each allocate a
new whole-tile float32 tensor: with the outputs TRL's DPO trainer asks for, its forward holds up to 3.3 such tiles
at once and its backward 7.25 (the largest transient allocation of the policy's step). :func:`forward_tile` and
:func:`backward_tile` run the same elementwise operations on the same operands in the same order, reusing their
own buffers in place, so every result is bit for bit TRL's (tests/algos/test_lean_head.py holds them to it, for
every flag combination), with at most 2.3 and 2 tiles alive. They never write into the logits tile where TRL
does not.

:func:`install` puts them in place of TRL's only when TRL's functions are exactly the ones they copy (their
source's hash); :mod:`ablate.algos.trl_fence` calls it for the TRL versions it was checked with.
"""

from __future__ import annotations

import hashlib
import inspect
import math

import torch

#: sha256 of the source of the TRL functions these replicate (trl 1.16.0): any other source keeps TRL's own
REPLICATES = {
    "_forward_tile": "adf891da0123196110c50da4d4c15099a1f4a04e9949fcc56778bdfa4df0f84d",
    "_backward_tile": "9b01548ea9d1c3ff821f1a94816e6b5c91aad48db936f9e0495cc27f0d99261c",
}
_trl_tiles: dict[str, object] = {}  # TRL's own tile functions, kept when replaced


def _own_float(tile: torch.Tensor, logit_scale: float) -> torch.Tensor:
    """``tile.float() * logit_scale`` as a new tensor, never the tile itself (an fp32 tile's ``float()`` is)."""
    y = tile.float()
    return y * logit_scale if y.data_ptr() == tile.data_ptr() else y.mul_(logit_scale)


def _add_one_at_targets(term: torch.Tensor, local: torch.Tensor, n_cols: int) -> None:
    """``term[i, local[i]] += 1`` for each row whose target column ``local[i]`` is in the tile."""
    rows = ((local >= 0) & (local < n_cols)).nonzero().squeeze(-1)
    term[rows, local[rows]] += 1.0


def forward_tile(
    tile,
    tile_stride,
    targets,
    running_max,
    sum_exp,
    x_sum_exp,
    sq_sum_exp,
    z_sum,
    max_before_target,
    target_logit,
    vocab_start,
    n_cols,
    logit_scale,
    softcap,
    inv_t,
    HAS_SOFTCAP,
    HAS_ENTROPY,
    HAS_LOG_SUM_SQ_PROBS,
    HAS_MEAN_LOGITS,
    HAS_IS_TOP1,
    BLOCK_SIZE,
):
    """TRL's ``_forward_tile`` (fold one tile into the online-logsumexp statistics), with fewer whole-tile
    temporaries: the same operations, in place where TRL allocates."""
    z = _own_float(tile, logit_scale)
    if HAS_SOFTCAP:
        z.div_(softcap).tanh_().mul_(softcap)  # softcap * tanh(z / softcap)
    z.mul_(inv_t)
    local = targets - vocab_start
    if HAS_MEAN_LOGITS:
        z_sum += z.sum(-1)
    if HAS_IS_TOP1:
        # `argmax` returns the first maximum, so a tie with an earlier token does not count as a top-1 prediction
        not_before = (torch.arange(n_cols, device=z.device) < local.unsqueeze(-1)).logical_not_()
        before_max = z.masked_fill(not_before, -math.inf).amax(-1)
        del not_before
        max_before_target.copy_(torch.maximum(max_before_target, before_max))
    new_m = torch.maximum(running_max, z.amax(-1))
    rescale = torch.exp(running_max - new_m)
    e = (z - new_m.unsqueeze(-1)).exp_()
    sum_exp.mul_(rescale).add_(e.sum(-1))
    if HAS_LOG_SUM_SQ_PROBS:  # before the entropy term, which reuses e
        sq_sum_exp.mul_(rescale * rescale).add_((e * e if HAS_ENTROPY else e.mul_(e)).sum(-1))
    if HAS_ENTROPY:
        x_sum_exp.mul_(rescale).add_(e.mul_(z).sum(-1))
    del e
    running_max.copy_(new_m)
    in_tile = (local >= 0) & (local < n_cols)
    target_z = z.gather(-1, local.clamp(0, n_cols - 1).unsqueeze(-1)).squeeze(-1)
    target_logit.copy_(torch.where(in_tile, target_z, target_logit))


def backward_tile(
    tile,
    tile_stride,
    targets,
    log_z,
    entropy,
    grad_logprobs,
    grad_entropy,
    vocab_start,
    n_cols,
    logit_scale,
    softcap,
    inv_t,
    HAS_SOFTCAP,
    HAS_LOGPROB_GRAD,
    HAS_ENTROPY_GRAD,
    BLOCK_SIZE,
):
    """TRL's ``_backward_tile`` (overwrite the tile with the gradient of the loss with respect to it), with fewer
    whole-tile temporaries: the same operations, in place where TRL allocates."""
    y = _own_float(tile, logit_scale)
    t = None
    if HAS_SOFTCAP:
        t = y.div_(softcap).tanh_()  # tanh(y / softcap), kept for the chain rule
        z = (softcap * t).mul_(inv_t)
    else:
        z = y.mul_(inv_t)
    log_p = z.sub_(log_z.unsqueeze(-1))
    p = torch.exp(log_p)
    # TRL starts from zeros and adds each term; without the entropy term log_p is free to hold them
    grad = torch.zeros_like(log_p) if HAS_ENTROPY_GRAD else log_p.zero_()
    if HAS_LOGPROB_GRAD:
        # d(log p_target) / dz_j = 1[j = target] - p_j; TRL's 0 - p_j off the target is -p_j but for the sign of
        # a zero, which adding the term to grad's zeros erases (+0 + -0 = +0)
        term = p.neg() if HAS_ENTROPY_GRAD else p.neg_()  # p is still needed for the entropy term
        _add_one_at_targets(term, targets - vocab_start, n_cols)
        grad += term.mul_(grad_logprobs.unsqueeze(-1))
        del term
    if HAS_ENTROPY_GRAD:
        # d(entropy) / dz_j = -p_j * (log p_j + entropy), as TRL groups it: (g * p) * (log_p + entropy)
        grad -= p.mul_(grad_entropy.unsqueeze(-1)).mul_(log_p.add_(entropy.unsqueeze(-1)))
    del p
    grad.mul_(inv_t)
    if HAS_SOFTCAP:
        grad.mul_(t.mul_(t).neg_().add_(1))  # 1 - t * t
    tile.copy_(grad.mul_(logit_scale))


LEAN = {"_forward_tile": forward_tile, "_backward_tile": backward_tile}


def _source_hash(fn) -> str:
    try:
        return hashlib.sha256(inspect.getsource(fn).encode()).hexdigest()
    except (OSError, TypeError):
        return ""


def trl_tiles() -> dict[str, object]:
    """TRL's own CPU tile functions, by name (also where :func:`install` replaced them)."""
    import trl.kernels.chunked_logprob as ck

    current = {name: getattr(ck, name, None) for name in LEAN}
    return {name: _trl_tiles[name] if fn is LEAN[name] else fn for name, fn in current.items()}


def install() -> bool:
    """Replace TRL's CPU tile functions by the lean ones when TRL's are the functions they replicate (same
    source); otherwise leave TRL's in place. Returns whether the lean ones are in place. Idempotent."""
    import trl.kernels.chunked_logprob as ck

    originals = trl_tiles()
    if any(_source_hash(originals[name]) != digest for name, digest in REPLICATES.items()):
        return False
    _trl_tiles.update(originals)
    for name, fn in LEAN.items():
        setattr(ck, name, fn)
    return True
