"""The token batch every layer passes around (tasks build it, models sample it, references and algorithms score
it): at the bottom of the package, so none of them imports another for it."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class TokenBatch:
    """Prompt+response token ids, right- or left-padded. ``completion_mask`` marks response tokens.

    Per-token outputs are aligned with ``input_ids[:, 1:]`` (the token each position predicts),
    shape ``[B, T-1]``, and are 0 where ``completion_mask[:, 1:]`` is 0.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    completion_mask: torch.Tensor

    def to(self, device: torch.device | str) -> TokenBatch:
        return TokenBatch(self.input_ids.to(device), self.attention_mask.to(device), self.completion_mask.to(device))

    @property
    def target_mask(self) -> torch.Tensor:
        """[B, T-1] bool: positions whose next token is a response token."""
        return self.completion_mask[:, 1:].bool()
