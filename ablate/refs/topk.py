"""``ref=topk``: the reference as a service that returns only the top-k log-probs per position (as sparse-logit
caches, distillation pipelines and hosted scoring APIs do); a token outside the top k gets its log-prob from a
tail model. ``keep_sampled`` says which of the two real services it stands for:

- ``keep_sampled=true`` (default): a **scoring endpoint** (``/completions`` with ``echo`` + ``logprobs=k``,
  vLLM's ``prompt_logprobs=k``): it returns the scored token's own log-prob next to the top k, so the per-token
  log-probs training uses (:meth:`~ablate.refs.base.Reference.logprobs`) are the reference's, exactly (those of
  ``ref=full``); only the next-token distribution (what the KL audit reads) is the top-k + tail form.
- ``keep_sampled=false``: a **top-logprobs endpoint** (only the top k, e.g. ``k <= 20``): a scored token outside
  the top k gets the tail model's value in training too.

Tail models:

- ``tail=bucket``: the top-k keep their true log-probs; the remaining mass is spread evenly over the
  other ``V - k`` tokens. The answer's tail term is that mass's log, summed over the tail itself: where the top k
  hold all but a few ulps of the mass, ``1 - sum(top)`` would round to 0 and give the tail ``-inf``.
- ``tail=renorm``: every tail token gets the floor probability ``tail_floor``; the top-k are renormalised
  to the rest of the mass (so the top-k's own mass is overstated, the tail's understated).

Both are proper distributions. The model runs as for ``full``; what is measured is the fidelity lost by
keeping only ``k`` entries per position. Their storage is reported as ``stored_bytes_per_position`` (against
``4 V`` for the full distribution): ``k * (4 + 4) + 4`` bytes (value, index, tail term), plus 4 for the scored
token's value with ``keep_sampled`` (no index: the caller names the token it scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ablate.config import RefConfig, require
from ablate.models.logprobs import logits_logprobs
from ablate.refs.base import TokenBatch, register
from ablate.refs.model_backed import ModelReference, next_token_logits

FLOAT_BYTES = INDEX_BYTES = 4


@dataclass
class TopKRefConfig(RefConfig):
    name: str = "topk"
    k: int = 20
    tail: str = "bucket"  # bucket | renorm
    tail_floor: float = 1e-10  # renorm: probability given to each token outside the top-k
    keep_sampled: bool = True  # true: a scoring endpoint (the scored token's exact log-prob too); false: top k only

    def __post_init__(self) -> None:
        require(self.k >= 1, f"ref.k must be >= 1, got {self.k}")
        require(self.tail in ("bucket", "renorm"), f"ref.tail must be bucket or renorm, got {self.tail!r}")
        require(0.0 < self.tail_floor < 1e-3, f"ref.tail_floor must be in (0, 1e-3), got {self.tail_floor}")


def topk_distribution(logprobs: torch.Tensor, k: int, tail: str, tail_floor: float) -> torch.Tensor:
    """The top-k approximation of normalised log-probs ``[..., V]``, as a full ``[..., V]`` log-prob tensor."""
    vocab = logprobs.shape[-1]
    if k >= vocab:
        return logprobs.clone()
    vals, idx = logprobs.topk(k, dim=-1)
    n_tail = vocab - k
    out = logprobs.scatter(-1, idx, -math.inf)  # the tail alone; then the output, in the same buffer
    if tail == "bucket":  # the tail's own log-mass (the answer's tail term), not 1 - the top's: that rounds to 0
        out.copy_((out.logsumexp(-1, keepdim=True) - math.log(n_tail)).expand_as(out))
        top = vals
    else:
        out.fill_(math.log(tail_floor))
        top = vals - vals.logsumexp(-1, keepdim=True) + math.log1p(-n_tail * tail_floor)
    return out.scatter_(-1, idx, top)


def stored_bytes_per_position(k: int, vocab: int, keep_sampled: bool) -> int:
    """Bytes one position costs the service's answer: ``min(k, V)`` (value, index) pairs and the tail term, plus
    the scored token's value when the service returns it (``keep_sampled``)."""
    return min(k, vocab) * (FLOAT_BYTES + INDEX_BYTES) + FLOAT_BYTES + (FLOAT_BYTES if keep_sampled else 0)


@register(TopKRefConfig)
class TopKReference(ModelReference):
    rank = 60
    audited = True
    EXTRA_DOCS = {
        "stored_bytes_per_position": "bytes the top-k answer holds per position (k log-probs and ids, the sampled "
        "token's with keep_sampled)",
        "full_bytes_per_position": "bytes of the full next-token distribution per position (float32 x vocabulary)",
    }

    def __init__(self, cfg: TopKRefConfig, ctx):
        super().__init__(cfg, ctx)
        # a scoring endpoint returns the scored token's exact log-prob, not the top-k form's
        self.logprobs_match_distribution = not cfg.keep_sampled
        self._scored: tuple | None = None  # (batch, autocast state, its log-probs): see _distribution
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self._cost.extra.update(
            stored_bytes_per_position=stored_bytes_per_position(cfg.k, vocab, cfg.keep_sampled),
            full_bytes_per_position=FLOAT_BYTES * vocab,
        )

    def _approximation(self, logits: torch.Tensor) -> torch.Tensor:
        """The top-k approximation (normalised float32 log-probs) of the model's next-token logits."""
        return topk_distribution(torch.log_softmax(logits, dim=-1), self.cfg.k, self.cfg.tail, self.cfg.tail_floor)

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1, V] float32 log-scores: the model's logits when ``k >= V`` (every entry kept: the full
        distribution, exactly), else the top-k approximation's normalised log-probs (whatever ``keep_sampled``:
        a scoring endpoint returns one scored token per position, not a distribution)."""
        on = batch.to(self.ctx.device)
        logits = next_token_logits(self.model, on)
        if self.cfg.keep_sampled:  # an audit asks for the scored tokens' log-probs next: this forward has them
            self._scored = (batch, _autocast_state(logits.device), _scored_logprobs(logits, on))
        return logits if self.cfg.k >= logits.shape[-1] else self._approximation(logits)

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1] log-probs of the response tokens (0 elsewhere): the reference's own, exactly as ``ref=full``
        computes them, with ``keep_sampled``; else each token's value in the top-k approximation. An audit that
        has just asked for ``batch``'s distribution in the same precision gets them from that forward (read off its
        float32 logits: within float rounding of the fused head's, docs/measured.md); training never does."""
        if self.cfg.keep_sampled:
            scored, self._scored = self._scored, None
            if (
                scored is not None
                and not self.counting
                and scored[0] is batch
                and scored[1] == _autocast_state(self.ctx.device)
            ):
                return scored[2]
            return super()._logprobs(batch)
        batch = batch.to(self.ctx.device)
        approx = self._approximation(next_token_logits(self.model, batch))
        lp = approx.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return torch.where(batch.target_mask, lp, torch.zeros_like(lp))


def _autocast_state(device: torch.device) -> tuple[bool, torch.dtype]:
    return torch.is_autocast_enabled(device.type), torch.get_autocast_dtype(device.type)


def _scored_logprobs(logits: torch.Tensor, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1] the response tokens' log-probs under ``logits`` (float32; 0 elsewhere)."""
    lp = logits_logprobs(logits, batch.input_ids[:, 1:])
    return torch.where(batch.target_mask, lp, torch.zeros_like(lp))
