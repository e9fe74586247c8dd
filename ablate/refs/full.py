"""``ref=full``: a frozen full-precision copy of the SFT model. The truth every other regime is judged by."""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config import RefConfig
from ablate.refs.base import register
from ablate.refs.model_backed import ModelReference


@dataclass
class FullRefConfig(RefConfig):
    name: str = "full"


@register(FullRefConfig)
class FullReference(ModelReference):
    """The SFT weights in full precision, in eval mode, without gradients: loaded once more, or the run's frozen
    copy when it holds one (the model is only read). ``ref_bytes`` counts the copy either way."""

    rank = 10  # the truth: first everywhere, the denominator of every ratio
    audited = True

    reads_sft_copy = True
