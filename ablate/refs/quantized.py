"""Quantised frozen copies of the SFT model through bitsandbytes (forward only), scored one sequence at a time.

A quantised model's output for one sequence depends on what else is in its batch: LLM.int8() picks its
16-bit outlier columns over every token of the (padded) batch, and 4-bit/bf16 compute rounds differently
with the batch's shape and with left padding (which shifts positions). A DPO pair's reference must not
depend on which pairs share its batch, so :class:`QuantizedReference` cuts each row to its real tokens,
scores it alone through the parent :class:`ModelReference`, and puts the result back at its padded
positions. This costs one forward per sequence instead of one per batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch

from ablate.refs.base import TokenBatch
from ablate.refs.model_backed import ModelReference
from ablate.versions import required

BNB = required("bitsandbytes", "bitsandbytes", "ref=int8 / ref=nf4")


def quiet_bitsandbytes() -> None:
    """bnb's 8-bit layers log a float16 cast on every call; its import prints a kernels notice."""
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)


def real_span(attention_row: torch.Tensor) -> tuple[int, int]:
    """``(start, end)`` of a row's real tokens: one contiguous run (left or right padding); (0, 0) if none."""
    idx = attention_row.nonzero().flatten().tolist()
    if not idx:
        return 0, 0
    start, end = idx[0], idx[-1] + 1
    if end - start != len(idx):
        raise ValueError(
            "a row's attention_mask has holes: only left- or right-padded batches can be scored one sequence at a time"
        )
    return start, end


def score_each_row(batch: TokenBatch, score: Callable[[TokenBatch], torch.Tensor]) -> torch.Tensor:
    """``score`` applied to each row of ``batch`` alone, cut to its real tokens, with the per-position results
    ([1, L-1, ...]) placed back at their padded positions in a ``[B, T-1, ...]`` tensor, 0 at padding.

    A row's numbers are therefore exactly what it gets when scored by itself, whatever its batch-mates.
    """
    rows, n = batch.input_ids.shape
    out: torch.Tensor | None = None
    for i in range(rows):
        start, end = real_span(batch.attention_mask[i])
        if end - start < 2:  # nothing to predict inside the row's real tokens
            continue
        cut = slice(start, end)
        one = TokenBatch(
            batch.input_ids[i : i + 1, cut], batch.attention_mask[i : i + 1, cut], batch.completion_mask[i : i + 1, cut]
        )
        values = score(one)[0]
        if out is None:
            out = values.new_zeros((rows, n - 1, *values.shape[1:]))
        out[i, start : end - 1] = values
    if out is None:  # no row has two real tokens: only the shape is needed
        out = torch.zeros_like(score(batch))
    return out


class QuantizedReference(ModelReference):
    """A bitsandbytes-quantised frozen model whose log-probs and distributions are computed per sequence."""

    required_packages = BNB

    def quantization_config(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def build_model(self) -> torch.nn.Module:
        quiet_bitsandbytes()
        return self.ctx.load_model(quantization_config=self.quantization_config())

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return score_each_row(batch, super()._logprobs)

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        return score_each_row(batch, super()._distribution)
