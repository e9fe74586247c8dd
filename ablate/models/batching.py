"""How many sequences one ``generate`` call samples at once: as many as fit a memory budget.

A sampled row holds, for the whole call, its KV cache (every layer's keys and values at every position of prompt
plus response) and, at each decode step, a few vocabulary-wide score vectors (the logits, the coupled sampler's
float64 working copy and its output); the prefill adds the prompt's activations for a moment. Larger batches make
each decode step's matmuls more efficient (the weights are read once per step for all rows), so the sampler takes
as many rows as this estimate lets it fit in :func:`budget_bytes`, and never more than there are sequences.
"""

from __future__ import annotations

import torch

CPU_BUDGET_MIB = 512  # what one generate call may hold on a CPU (the training step needs the rest)
CUDA_BUDGET_MIB = 4096
_SCORE_COPIES = 6  # vocabulary-wide fp32 vectors per row alive at a decode step (float64 copies count twice)
_PREFILL_WIDTHS = 12  # hidden-size activations per prompt token alive at once in the prefill (fp32)


def kv_bytes_per_position(config, dtype: torch.dtype) -> int:
    """Bytes of keys and values one sequence position holds in the KV cache, over every layer."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def bytes_per_row(
    config, *, prompt_width: int, max_new_tokens: int, dtype: torch.dtype, keep_scores: bool = False
) -> int:
    """Estimated bytes one sampled row needs: its KV cache at full length, the decode step's score vectors, and
    the prefill's activations and attention scores for its prompt (whichever of the two phases is larger); with
    ``keep_scores``, its kept float32 logits at every step (:class:`ablate.models.sampling.ScoreKeeper`)."""
    width = prompt_width + max_new_tokens
    kv = kv_bytes_per_position(config, dtype) * width
    if keep_scores:
        kv += max_new_tokens * config.vocab_size * 4
    decode = _SCORE_COPIES * config.vocab_size * 4
    intermediate = getattr(config, "intermediate_size", 4 * config.hidden_size)
    prefill = prompt_width * (_PREFILL_WIDTHS * config.hidden_size + 3 * intermediate) * 4
    prefill += config.num_attention_heads * prompt_width**2 * 4
    return kv + max(decode, prefill)


def budget_bytes(device: torch.device) -> int:
    """The memory one generate call may use on ``device`` (fixed, so that the rows, and with them the float
    rounding of the samples, are the same on every run of the same settings)."""
    return (CUDA_BUDGET_MIB if device.type == "cuda" else CPU_BUDGET_MIB) * 2**20


def rows_that_fit(
    config,
    *,
    n: int,
    prompt_width: int,
    max_new_tokens: int,
    dtype: torch.dtype,
    budget: int,
    keep_scores: bool = False,
) -> int:
    """Rows per generate call: as many of the ``n`` sequences as :func:`bytes_per_row` fits in ``budget`` (at
    least 1)."""
    per_row = bytes_per_row(
        config, prompt_width=prompt_width, max_new_tokens=max_new_tokens, dtype=dtype, keep_scores=keep_scores
    )
    return max(1, min(n, budget // per_row))
