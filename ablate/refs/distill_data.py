"""What ``ref=distilled`` distils on: the SFT distribution, as token sequences.

A sequence is ``(token ids, prompt length)``; the student learns the teacher's next-token distribution at every
position that predicts a response token. The sequences are the DPO pairs' chosen and rejected responses (each an
SFT sample), in the tokens DPO trains on (:mod:`ablate.tasks.pair_tokens`), plus, optionally, fresh responses
sampled from the teacher (the SFT model) at temperature 1 on the training prompts. The held-out sequences, on
which the student's KL is measured, are whole prompts' pairs: no held-out prompt is trained on or sampled.
"""

from __future__ import annotations

import hashlib
import json
import math

import torch

from ablate.errors import ConfigError

Seq = tuple[list[int], int]  # (prompt + response token ids, prompt length)

#: Added to ``ref.seed`` for the fresh samples' seed, so they are not the pairs' own samples redrawn (the pairs
#: come from the same coupled sampler, keyed by the task's seed, prompt and sample index).
FRESH_SEED_OFFSET = 1_000_003


def pair_sequences(tokenizer, pairs, max_length: int) -> list[tuple[str, list[int], int]]:
    """(prompt text, token ids, prompt length) of every pair's chosen then rejected sequence, in the pairs' one
    tokenisation, each truncated from the end to ``max_length``. Sequences with no response token left are
    dropped."""
    from ablate.tasks.pair_tokens import tokenize_pairs

    out = []
    for pair, row in zip(pairs, tokenize_pairs(tokenizer, pairs, None), strict=True):
        for ids, n_prompt in row.sequences():
            ids = ids[:max_length]
            if len(ids) > n_prompt >= 1:
                out.append((pair.prompt, ids, n_prompt))
    return out


def sequences_fingerprint(seqs) -> str:
    return hashlib.sha256(json.dumps(seqs).encode()).hexdigest()


def split_by_prompt(prompts: list[str], fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) indices into ``prompts`` (one per sequence): a seeded share ``fraction`` of the distinct
    prompts, at least one, and never all, is held out with every sequence it has."""
    distinct = list(dict.fromkeys(prompts))
    if len(distinct) < 2:
        raise ConfigError(
            f"ref=distilled needs pairs on at least 2 distinct prompts (one is held out to measure the student), "
            f"got {len(distinct)}"
        )
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(distinct), generator=g).tolist()
    n_held = max(1, min(len(distinct) - 1, int(math.floor(fraction * len(distinct) + 0.5))))
    held = {distinct[i] for i in perm[:n_held]}
    train_idx = [i for i, p in enumerate(prompts) if p not in held]
    held_idx = [i for i, p in enumerate(prompts) if p in held]
    return train_idx, held_idx


def fresh_sequences(
    teacher,
    tokenizer,
    prompts: list[str],
    *,
    n_per_prompt: int,
    max_new_tokens: int,
    max_length: int,
    seed: int,
    precision: str,
    max_sentences: int | None = None,
) -> list[Seq]:
    """``n_per_prompt`` responses to each prompt sampled from ``teacher`` at temperature 1 (coupled sampler, seed
    ``seed + FRESH_SEED_OFFSET``), ending as the task's responses end (EOS, ``max_sentences`` sentences: the stop
    rule, or ``max_new_tokens``), as sequences truncated from the end to ``max_length``."""
    from ablate.models.sampling import sample

    if n_per_prompt == 0 or not prompts:
        return []
    batches = sample(
        teacher,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        temperature=1.0,
        batch_size=None,
        seed=seed + FRESH_SEED_OFFSET,
        precision=precision,
        n_per_prompt=n_per_prompt,
        desc="sampling for distillation",
        max_sentences=max_sentences,
    )
    out: list[Seq] = []
    for sb in batches:
        b = sb.batch
        for ids, att, comp in zip(b.input_ids.tolist(), b.attention_mask.tolist(), b.completion_mask.tolist()):
            row = [t for t, a in zip(ids, att) if a][:max_length]
            n_prompt = sum(a and not c for a, c in zip(att, comp))
            if len(row) > n_prompt >= 1:
                out.append((row, n_prompt))
    return out


def collate(seqs: list[Seq], pad_id: int, device: torch.device):
    """Right-padded ids, attention mask and the [B, T-1] mask of positions that predict a response token."""
    width = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    resp = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (row, n_prompt) in enumerate(seqs):
        ids[i, : len(row)] = torch.tensor(row)
        att[i, : len(row)] = 1
        resp[i, n_prompt : len(row)] = True
    return ids.to(device), att.to(device), resp[:, 1:].to(device)
