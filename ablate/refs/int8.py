"""``ref=int8``: a bitsandbytes LLM.int8() copy of the SFT model (weights int8, outlier features in 16 bit).

LLM.int8() picks its outlier columns over the whole batch, so sequences are scored one at a time
(:class:`ablate.refs.quantized.QuantizedReference`). With ``quantize_embeddings`` the token embedding is an int8
embedding (bitsandbytes' ``Embedding8bit``: int8 rows, one scale per row) and the LM head a ``Linear8bitLt`` with the
same outlier threshold; a tied head reads the embedding's int8 rows and scales (one copy: a Linear8bitLt quantises
its weight row-wise too, to exactly those values).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.config import require
from ablate.refs.base import register
from ablate.refs.quantized import QuantizedRefConfig, QuantizedReference, held_embeddings


@dataclass
class Int8RefConfig(QuantizedRefConfig):
    name: str = "int8"
    threshold: float = 6.0  # LLM.int8() outlier threshold; 0 disables the mixed-precision decomposition

    def __post_init__(self) -> None:
        require(self.threshold >= 0, f"ref.threshold must be >= 0, got {self.threshold}")


def int8_params(weight: torch.Tensor, device: torch.device):
    """``weight`` quantised row-wise to int8 on ``device`` (bitsandbytes quantises a CPU tensor as it moves)."""
    import bitsandbytes as bnb

    return bnb.nn.Int8Params(weight.cpu(), requires_grad=False, has_fp16_weights=False).to(device)


def shared_int8_params(quantized):
    """Int8 weights holding ``quantized``'s int8 rows and row scales (the same tensors, not a copy), for a
    ``Linear8bitLt`` (which moves them into its own state on first use, leaving ``quantized`` as it is)."""
    import bitsandbytes as bnb

    rows = quantized.data
    return bnb.nn.Int8Params(rows, requires_grad=False, has_fp16_weights=False, CB=rows, SCB=quantized.SCB)


@register(Int8RefConfig)
class Int8Reference(QuantizedReference):
    rank = 20
    audited = True

    def quantization_config(self):
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=self.cfg.threshold)

    def quantized_embedding(self, weight: torch.Tensor) -> torch.nn.Module:
        embedding = held_embeddings()[0](*weight.shape, device="meta", dtype=weight.dtype)
        embedding.weight = int8_params(weight, self.ctx.device)
        return embedding

    def quantized_head(self, weight: torch.Tensor, bias: torch.Tensor | None, tied) -> torch.nn.Module:
        import bitsandbytes as bnb

        out_features, in_features = weight.shape
        head = bnb.nn.Linear8bitLt(
            in_features,
            out_features,
            bias=bias is not None,
            has_fp16_weights=False,
            threshold=self.cfg.threshold,
            device="meta",
        )
        head.weight = int8_params(weight, self.ctx.device) if tied is None else shared_int8_params(tied.weight)
        if bias is not None:
            head.bias = torch.nn.Parameter(bias.to(self.ctx.device), requires_grad=False)
        return head
