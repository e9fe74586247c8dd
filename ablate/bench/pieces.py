"""What every bench measurement shares: the run's inputs and the preference pairs, built once."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.inputs import RunInputs


@dataclass
class Pieces:
    """What every measurement shares: the run's inputs (as a run builds them: ``ablate.inputs.RunInputs``) and
    the preference pairs."""

    inputs: RunInputs
    pairs: list

    @property
    def source(self):
        return self.inputs.source

    @property
    def tokenizer(self):
        return self.inputs.tokenizer

    @property
    def device(self) -> torch.device:
        return self.inputs.device

    @property
    def prompts(self) -> list[str]:
        """The train prompts."""
        return self.inputs.prompts["train"]

    @property
    def reward(self):
        return self.inputs.reward

    @property
    def cache_root(self) -> Path:
        return self.inputs.cache_root

    def load(self, **overrides) -> torch.nn.Module:
        return self.inputs.load(**overrides)


def build_pieces(cfg) -> Pieces:
    inputs = RunInputs.build(cfg)
    pairs, _, _ = inputs.pairs(cfg)
    return Pieces(inputs, pairs)
