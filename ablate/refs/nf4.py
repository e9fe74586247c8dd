"""``ref=nf4``: a bitsandbytes 4-bit copy of the SFT model (NF4 by default, FP4 as an option).

Its low-precision compute rounds differently with the batch's shape and padding, so sequences are scored
one at a time (:class:`ablate.refs.quantized.QuantizedReference`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ablate.config import Precision, RefConfig, require, require_choice
from ablate.refs.base import register
from ablate.refs.quantized import QuantizedReference


@dataclass
class Nf4RefConfig(RefConfig):
    name: str = "nf4"
    quant_type: str = "nf4"  # nf4 | fp4
    double_quant: bool = False  # also quantise the quantisation constants
    compute_dtype: str = "bf16"  # Precision: dtype of the dequantised matmuls

    def __post_init__(self) -> None:
        require(self.quant_type in ("nf4", "fp4"), f"ref.quant_type must be nf4 or fp4, got {self.quant_type!r}")
        require_choice("ref.compute_dtype", self.compute_dtype, Precision)


@register(Nf4RefConfig)
class Nf4Reference(QuantizedReference):
    def quantization_config(self):
        from transformers import BitsAndBytesConfig

        dtype = torch.bfloat16 if self.cfg.compute_dtype == "bf16" else torch.float32
        return BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type=self.cfg.quant_type,
            bnb_4bit_use_double_quant=self.cfg.double_quant,
            bnb_4bit_compute_dtype=dtype,
        )
