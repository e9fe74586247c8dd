"""The one tokenisation of preference pairs: what DPO trains on, what ``ref=cached`` precomputes, what
``ref=distilled`` distils from and what a learned reward model is trained on.

A pair becomes a prompt and two responses in token ids, by TRL's rule for conversational data: the chat
template renders the prompt alone (with the generation prompt) and the prompt followed by each response; the
responses start where those renderings stop agreeing, so the template's own end-of-turn tokens belong to the
response. :func:`collate` lays a batch of pairs out as TRL's DPO collator does ([chosen rows; rejected rows],
each truncated from the end to ``max_length``, right-padded). DPO's trainer is handed these tokens and this
collator (see :mod:`ablate.algos.dpo`), so the sequences a regime prepares from are the ones DPO trains on;
``tests/tasks/test_pair_tokens.py`` checks them against TRL's own tokenisation and collator, token for token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from ablate.batch import TokenBatch
    from ablate.tasks.pairs import Pair

COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")


@dataclass(frozen=True)
class PairTokens:
    """One pair in token ids: the shared prompt and each response (end-of-turn tokens included)."""

    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]

    def sequences(self) -> list[tuple[list[int], int]]:
        """(prompt + response ids, prompt length) of the chosen then the rejected sequence, untruncated."""
        return [(self.prompt_ids + r, len(self.prompt_ids)) for r in (self.chosen_ids, self.rejected_ids)]


def _chat_ids(tok, messages: list[dict], **kwargs) -> list[int]:
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)
    return list(out["input_ids"])


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def tokenize_pair(tok, pair: Pair) -> PairTokens:
    """``pair`` in token ids, by the rule of the module docstring."""
    from ablate.tasks.prompts import as_chat

    user = as_chat(pair.prompt)
    prompt = _chat_ids(tok, user, add_generation_prompt=True)
    chosen, rejected = (
        _chat_ids(tok, user + [{"role": "assistant", "content": r}]) for r in (pair.chosen, pair.rejected)
    )
    n = min(_common_prefix(prompt, chosen), _common_prefix(prompt, rejected))
    return PairTokens(prompt[:n], chosen[n:], rejected[n:])


def tokenize_pairs(tok, pairs: Sequence[Pair], max_length: int | None) -> list[PairTokens]:
    """Every pair in token ids, in order, less those whose prompt alone fills ``max_length`` (truncation from
    the end would leave them no response token: TRL drops them too)."""
    rows = [tokenize_pair(tok, p) for p in pairs]
    return [r for r in rows if max_length is None or len(r.prompt_ids) < max_length]


def pad_id(tok) -> int:
    """The padding id DPO's collator uses: the tokenizer's pad token, else its EOS (as TRL)."""
    return tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id


def _right_padded(rows: list[list[int]], value: int) -> torch.Tensor:
    width = max(len(r) for r in rows)
    return torch.tensor([r + [value] * (width - len(r)) for r in rows], dtype=torch.long)


def collate(rows: Sequence[PairTokens], pad: int, max_length: int | None) -> TokenBatch:
    """A batch of pairs as DPO sees it: the chosen sequences then the rejected ones, each truncated from the
    end to ``max_length``, right-padded to the longest."""
    from ablate.batch import TokenBatch

    cut = slice(None, max_length)
    seqs = [r.prompt_ids + r.chosen_ids for r in rows] + [r.prompt_ids + r.rejected_ids for r in rows]
    masks = [[0] * len(r.prompt_ids) + [1] * len(r.chosen_ids) for r in rows]
    masks += [[0] * len(r.prompt_ids) + [1] * len(r.rejected_ids) for r in rows]
    seqs, masks = [s[cut] for s in seqs], [m[cut] for m in masks]
    return TokenBatch(_right_padded(seqs, pad), _right_padded([[1] * len(s) for s in seqs], 0), _right_padded(masks, 0))


@dataclass(frozen=True)
class PairCollator:
    """:func:`collate` as a data collator over rows of :data:`COLUMNS` (what DPO's trainer is given)."""

    pad: int
    max_length: int | None

    def __call__(self, examples: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
        b = collate([PairTokens(*(e[c] for c in COLUMNS)) for e in examples], self.pad, self.max_length)
        return {"input_ids": b.input_ids, "attention_mask": b.attention_mask, "completion_mask": b.completion_mask}


def pair_batches(tok, pairs: Sequence[Pair], batch_size: int, max_length: int | None) -> list[TokenBatch]:
    """The pairs as DPO's batches of ``batch_size`` pairs (``2 * batch_size`` sequences), in order."""
    rows = tokenize_pairs(tok, pairs, max_length)
    return [collate(rows[i : i + batch_size], pad_id(tok), max_length) for i in range(0, len(rows), batch_size)]


def tokenized_dataset(tok, pairs: Sequence[Pair], max_length: int | None):
    """The pairs in token ids as a ``datasets.Dataset`` with the columns of :data:`COLUMNS`."""
    from datasets import Dataset

    rows = tokenize_pairs(tok, pairs, max_length)
    return Dataset.from_dict({c: [getattr(r, c) for r in rows] for c in COLUMNS})


def reward_dataset(tok, pairs: Sequence[Pair]):
    """The pairs as TRL's reward trainer takes them already tokenised: the whole chosen and rejected
    conversations (``chosen_ids``, ``rejected_ids``); TRL drops those longer than its ``max_length``."""
    from datasets import Dataset

    rows = tokenize_pairs(tok, pairs, None)
    return Dataset.from_dict(
        {
            "chosen_ids": [r.prompt_ids + r.chosen_ids for r in rows],
            "rejected_ids": [r.prompt_ids + r.rejected_ids for r in rows],
        }
    )
