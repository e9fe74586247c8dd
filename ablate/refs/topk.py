"""``ref=topk``: only the top-k reference log-probs per position are kept (as sparse-logit caches and
distillation pipelines store them); a token outside the top-k gets its log-prob from a tail model.

- ``tail=bucket``: the top-k keep their true log-probs; the remaining mass is spread evenly over the
  other ``V - k`` tokens.
- ``tail=renorm``: every tail token gets the floor probability ``tail_floor``; the top-k are renormalised
  to the rest of the mass (so the top-k's own mass is overstated, the tail's understated).

Both are proper distributions. The model runs as for ``full``; what is measured is the fidelity lost by
keeping only ``k`` entries per position, whose storage, ``k * (4 + 4) + 4`` bytes (value, index, tail
term), is reported as ``stored_bytes_per_position`` (against ``4 V`` for the full distribution).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ablate.config import RefConfig, require
from ablate.refs.base import TokenBatch, register
from ablate.refs.model_backed import ModelReference, next_token_logits


@dataclass
class TopKRefConfig(RefConfig):
    name: str = "topk"
    k: int = 20
    tail: str = "bucket"  # bucket | renorm
    tail_floor: float = 1e-10  # renorm: probability given to each token outside the top-k

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
    if tail == "bucket":
        tail_mass = (1.0 - vals.double().exp().sum(-1)).clamp_min(0.0)  # rounding can make it -1e-8
        tail_lp = (tail_mass / n_tail).log().to(logprobs.dtype)
        top = vals
    else:
        tail_lp = torch.full(vals.shape[:-1], math.log(tail_floor), dtype=logprobs.dtype, device=logprobs.device)
        top = vals - vals.logsumexp(-1, keepdim=True) + math.log1p(-n_tail * tail_floor)
    out = tail_lp.unsqueeze(-1).expand_as(logprobs).clone()
    return out.scatter_(-1, idx, top)


@register(TopKRefConfig)
class TopKReference(ModelReference):
    def __init__(self, cfg: TopKRefConfig, ctx):
        super().__init__(cfg, ctx)
        vocab = self.model.get_output_embeddings().weight.shape[0]
        self._cost.extra.update(stored_bytes_per_position=min(cfg.k, vocab) * 8 + 4, full_bytes_per_position=4 * vocab)

    def _approximation(self, logits: torch.Tensor) -> torch.Tensor:
        """The top-k approximation (normalised float32 log-probs) of the model's next-token logits."""
        return topk_distribution(torch.log_softmax(logits, dim=-1), self.cfg.k, self.cfg.tail, self.cfg.tail_floor)

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1, V] float32 log-scores: the model's logits when ``k >= V`` (every entry kept: the full
        distribution, exactly), else the top-k approximation's normalised log-probs."""
        logits = next_token_logits(self.model, batch.to(self.ctx.device))
        return logits if self.cfg.k >= logits.shape[-1] else self._approximation(logits)

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        batch = batch.to(self.ctx.device)
        approx = self._approximation(next_token_logits(self.model, batch))
        lp = approx.gather(-1, batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        return torch.where(batch.target_mask, lp, torch.zeros_like(lp))
