"""``ref=nf4``: a bitsandbytes 4-bit copy of the SFT model (NF4 by default, FP4 as an option).

Its low-precision compute rounds differently with the batch's shape and padding, so sequences are scored
one at a time (:class:`ablate.refs.quantized.QuantizedReference`). With ``quantize_embeddings`` the token
embedding is a 4-bit embedding (bitsandbytes' ``Embedding4bit``, the same ``quant_type``; its constants are never
double-quantised: its row lookup reads them per block) and the LM head its own ``Linear4bit`` (the same
``quant_type``, ``double_quant`` and ``compute_dtype`` as the other layers), untied from the embedding: the CPU kernel
repacks a Linear4bit's weights on first use, so the two cannot share them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.config import Precision, require, require_choice
from ablate.refs.base import register
from ablate.refs.quantized import QuantizedRefConfig, QuantizedReference, held_embeddings


@dataclass
class Nf4RefConfig(QuantizedRefConfig):
    name: str = "nf4"
    quant_type: str = "nf4"  # nf4 | fp4
    double_quant: bool = False  # also quantise the quantisation constants
    compute_dtype: str = "bf16"  # Precision: dtype of the dequantised matmuls

    def __post_init__(self) -> None:
        require(self.quant_type in ("nf4", "fp4"), f"ref.quant_type must be nf4 or fp4, got {self.quant_type!r}")
        require_choice("ref.compute_dtype", self.compute_dtype, Precision)


@register(Nf4RefConfig)
class Nf4Reference(QuantizedReference):
    rank = 30
    audited = True

    @property
    def compute_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.cfg.compute_dtype == "bf16" else torch.float32

    def quantization_config(self):
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.cfg.quant_type,
            bnb_4bit_use_double_quant=self.cfg.double_quant,
            bnb_4bit_compute_dtype=self.compute_dtype,
        )

    def params_4bit(self, weight: torch.Tensor, module: torch.nn.Module, double_quant: bool):
        """``weight`` quantised in blocks to 4 bits (``quant_type``) on the reference's device, for ``module``."""
        import bitsandbytes as bnb

        return bnb.nn.Params4bit(
            weight.cpu(),
            requires_grad=False,
            compress_statistics=double_quant,
            quant_type=self.cfg.quant_type,
            module=module,
        ).to(self.ctx.device)

    def quantized_embedding(self, weight: torch.Tensor) -> torch.nn.Module:
        embedding = held_embeddings()[1](
            *weight.shape, dtype=weight.dtype, quant_type=self.cfg.quant_type, device="meta"
        )
        embedding.weight = self.params_4bit(weight, embedding, double_quant=False)
        return embedding

    def quantized_head(self, weight: torch.Tensor, bias: torch.Tensor | None, tied) -> torch.nn.Module:
        import bitsandbytes as bnb

        out_features, in_features = weight.shape
        head = bnb.nn.Linear4bit(
            in_features,
            out_features,
            bias=bias is not None,
            compute_dtype=self.compute_dtype,
            compress_statistics=self.cfg.double_quant,
            quant_type=self.cfg.quant_type,
            device="meta",
        )
        head.weight = self.params_4bit(weight, head, self.cfg.double_quant)
        if bias is not None:
            head.bias = torch.nn.Parameter(bias.to(self.ctx.device), requires_grad=False)
        return head
