"""``ref=int8``: a bitsandbytes LLM.int8() copy of the SFT model (weights int8, outlier features in 16 bit).

LLM.int8() picks its outlier columns over the whole batch, so sequences are scored one at a time
(:class:`ablate.refs.quantized.QuantizedReference`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config import RefConfig, require
from ablate.refs.base import register
from ablate.refs.quantized import QuantizedReference


@dataclass
class Int8RefConfig(RefConfig):
    name: str = "int8"
    threshold: float = 6.0  # LLM.int8() outlier threshold; 0 disables the mixed-precision decomposition

    def __post_init__(self) -> None:
        require(self.threshold >= 0, f"ref.threshold must be >= 0, got {self.threshold}")


@register(Int8RefConfig)
class Int8Reference(QuantizedReference):
    def quantization_config(self):
        from transformers import BitsAndBytesConfig

        return BitsAndBytesConfig(load_in_8bit=True, llm_int8_threshold=self.cfg.threshold)
