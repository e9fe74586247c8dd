"""Quantised frozen copies of the SFT model through bitsandbytes (forward only), scored one sequence at a time.

A quantised model's output for one sequence depends on what else is in its batch: LLM.int8() picks its
16-bit outlier columns over every token of the (padded) batch, and 4-bit/bf16 compute rounds differently
with the batch's shape and with left padding (which shifts positions). A DPO pair's reference must not
depend on which pairs share its batch, so :class:`QuantizedReference` cuts each row to its real tokens,
scores it alone through the parent :class:`ModelReference`, and puts the result back at its padded
positions. This costs one forward per sequence instead of one per batch.

bitsandbytes, through transformers, quantises the Linear layers only: the token embedding and the LM head (one
tied matrix in SmolLM2, 21% of its parameters) stay in full precision. ``ref.quantize_embeddings=true`` quantises
them too, after loading: the embedding becomes bitsandbytes' quantised embedding and the LM head a quantised Linear.
Where the two were tied, int8 keeps them tied (the head's Linear reads the embedding's int8 rows and scales: both
quantise the matrix row-wise, identically), and 4-bit unties them (its CPU kernel repacks the head's weights on first
use, so the head holds a copy of its own). TRL's fused LM head multiplies by ``lm_head.weight`` as a float matrix,
which a quantised head does not hold, so log-probs then come from the model's full logits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch

from ablate.config import RefConfig
from ablate.models.logprobs import logits_logprobs, next_token_logits
from ablate.refs.base import TokenBatch
from ablate.refs.model_backed import ModelReference
from ablate.versions import required

BNB = required("bitsandbytes", "bitsandbytes", "ref=int8 / ref=nf4")


@dataclass
class QuantizedRefConfig(RefConfig):
    """The settings ``ref=int8`` and ``ref=nf4`` share."""

    quantize_embeddings: bool = False  # also the token embedding, and the LM head as a quantised Linear


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


def logprobs_from_logits(model: torch.nn.Module, batch: TokenBatch) -> torch.Tensor:
    """[B, T-1] float32 log-probs of the response tokens (0 elsewhere) from the model's full next-token logits
    (a full log-softmax), for a model whose LM head TRL's fused head cannot read (a quantised one)."""
    with torch.no_grad():
        lp = logits_logprobs(next_token_logits(model, batch), batch.input_ids[:, 1:])
    return lp.masked_fill(~batch.target_mask, 0.0)


@cache
def held_embeddings() -> tuple[type, type]:
    """bitsandbytes' 8-bit and 4-bit embeddings with a state dict listing what they hold (quantised rows and their
    constants, as bnb's quantised Linears list theirs): bnb's own refuse to give one, and ``module_bytes`` counts
    a module's bytes from its state dict. For counting only: the state dict does not load back."""
    import bitsandbytes as bnb

    class Embedding8bit(bnb.nn.Embedding8bit):
        def _save_to_state_dict(self, destination, prefix, keep_vars):
            torch.nn.Module._save_to_state_dict(self, destination, prefix, keep_vars)
            destination[prefix + "SCB"] = self.weight.SCB if keep_vars else self.weight.SCB.detach()

    class Embedding4bit(bnb.nn.Embedding4bit):
        def _save_to_state_dict(self, destination, prefix, keep_vars):
            torch.nn.Module._save_to_state_dict(self, destination, prefix, keep_vars)
            for k, v in self.weight.quant_state.as_dict(packed=True).items():
                destination[prefix + "weight." + k] = v if keep_vars else v.detach()

    return Embedding8bit, Embedding4bit


def quantize_embedding_and_head(
    model: torch.nn.Module,
    embedding: Callable[[torch.Tensor], torch.nn.Module],
    head: Callable[[torch.Tensor, torch.Tensor | None, torch.nn.Module | None], torch.nn.Module],
) -> None:
    """Replace ``model``'s token embedding by ``embedding(weight)`` and its LM head by ``head(weight, bias, tied)``,
    each quantised from the full-precision weights; ``tied`` is the new quantised embedding when the model ties its
    head to its embedding (``head`` may then read its quantised weights), None otherwise."""
    emb, out = model.get_input_embeddings(), model.get_output_embeddings()
    tied = emb.weight.data_ptr() == out.weight.data_ptr() and emb.weight.shape == out.weight.shape
    new_emb = embedding(emb.weight.detach())
    new_out = head(out.weight.detach(), None if out.bias is None else out.bias.detach(), new_emb if tied else None)
    model.set_input_embeddings(new_emb)
    model.set_output_embeddings(new_out)
    model.config.tie_word_embeddings = False  # transformers must never re-tie them: they are different modules


class QuantizedReference(ModelReference):
    """A bitsandbytes-quantised frozen model whose log-probs and distributions are computed per sequence."""

    required_packages = BNB

    def quantization_config(self):  # pragma: no cover - abstract
        raise NotImplementedError

    def quantized_embedding(self, weight: torch.Tensor) -> torch.nn.Module:  # pragma: no cover - abstract
        """bitsandbytes' quantised embedding holding ``weight`` [V, H], on the reference's device."""
        raise NotImplementedError

    def quantized_head(
        self, weight: torch.Tensor, bias: torch.Tensor | None, tied: torch.nn.Module | None
    ) -> torch.nn.Module:  # pragma: no cover - abstract
        """bitsandbytes' quantised Linear holding the LM head ``weight`` [V, H] (and ``bias``), on the device;
        ``tied``: the quantised embedding of the same matrix, when the model ties the two (None otherwise)."""
        raise NotImplementedError

    def build_model(self) -> torch.nn.Module:
        quiet_bitsandbytes()
        model = self.ctx.load_model(quantization_config=self.quantization_config())
        if self.cfg.quantize_embeddings:
            quantize_embedding_and_head(model, self.quantized_embedding, self.quantized_head)
        return model

    def _row_logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """One sequence's log-probs: through TRL's fused head, or the full logits when the head is quantised."""
        if self.cfg.quantize_embeddings:
            return logprobs_from_logits(self.model, batch.to(self.ctx.device))
        return super()._logprobs(batch)

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        return score_each_row(batch, self._row_logprobs)

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        return score_each_row(batch, super()._distribution)
