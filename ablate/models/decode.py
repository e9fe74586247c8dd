"""Greedy decoding that stops computing a row as soon as its response has ended.

``generate`` keeps every row of a batch in each decode step until the last one ends: a row that has reached its EOS
(or the task's stop rule) is still run through the model, its output discarded. With one-sentence responses of ~29
tokens under a 64-token cap that is over half of the decode's work (the committed default job: 46% of the positions
a batch paid for were response tokens). :func:`decode` runs the same model forwards on the same KV cache, but drops
the rows that have ended from the batch and from the cache (``Cache.batch_select_indices``, transformers' own), so a
step costs the rows still running. Rows that share a prompt (several samples per prompt) share its prefill.

A row's tokens are those ``generate(do_sample=False)`` with the same logits processors would give it: the prefill
and every step are the same forwards (left-padded prompts, positions counted from each row's first token), and a
row's logits do not depend on the other rows in fp32 (``tests/models/test_decode.py`` compares the two). Only the
coupled sampler decodes this way; its choice of token needs a row's key and the step, nothing else
(:meth:`ablate.models.coupled.CoupledGumbel.choose`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ablate.models.logprobs import forward_parameters

#: what the caches of sampled responses key on for this decoder: a row's rounding (and so, rarely, a token) can differ
#: from ``generate``'s, whose samples earlier caches hold
NAME = "rows-dropped-when-ended"
#: ``choose(rows, step, logits)``: the token each row in ``rows`` (indices into the batch) takes at ``step``
Chooser = Callable[[torch.Tensor, int, torch.Tensor], torch.Tensor]
#: ``ended(row, tokens)``: whether row ``row``'s response, ``tokens`` so far (its last one not EOS), has ended
Ended = Callable[[int, list[int]], bool]


def forward_kwargs(model, cache) -> tuple[dict, dict]:
    """The prefill's and the decode steps' extra keyword arguments for ``model``'s forward: the KV cache under the
    name the architecture takes (transformers 5.24 renamed ``past_key_values`` to ``cache``, with a deprecation
    period), and ``logits_to_keep=1`` in the prefill where it is taken (the logits of the prompt's last position
    only)."""
    params = forward_parameters(model)
    step = {"cache" if "cache" in params else "past_key_values": cache, "use_cache": True}
    return ({**step, "logits_to_keep": 1} if "logits_to_keep" in params else step), step


def distinct_prompts(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's distinct prompts, for a shared prefill (several samples per prompt): each one's first row, in row
    order (distinct prompts keep theirs), and each row's prompt's index among them."""
    _, inverse = torch.unique(torch.cat([input_ids, attention_mask], dim=1), dim=0, return_inverse=True)
    firsts: dict[int, int] = {}  # a distinct prompt's torch.unique index -> its first row
    for row, u in enumerate(inverse.tolist()):
        firsts.setdefault(u, row)
    index = {u: i for i, u in enumerate(firsts)}
    device = input_ids.device
    return (
        torch.tensor(list(firsts.values()), device=device),
        torch.tensor([index[u] for u in inverse.tolist()], device=device),
    )


def position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """Each token's position counted from its row's first token (left padding skipped), as ``generate`` counts them;
    1 at padding (never attended)."""
    positions = attention_mask.long().cumsum(-1) - 1
    return positions.masked_fill_(attention_mask == 0, 1)


@torch.no_grad()
def decode(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
    choose: Chooser,
    ended: Ended | None = None,
    keep: Callable[[torch.Tensor, int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """``[B, P + steps]``: the left-padded prompts ``input_ids`` followed by each row's response, ``pad_id`` after
    its end. A row ends at its EOS, after ``max_new_tokens``, or when ``ended`` says so (checked after each token);
    ``steps`` is the longest response. ``keep(rows, step, logits)`` sees each step's float32 logits of the rows
    still running, before ``choose``."""
    from transformers import DynamicCache

    n = input_ids.shape[0]
    device = input_ids.device
    out = torch.full((n, max_new_tokens), pad_id, dtype=input_ids.dtype, device=device)
    cache = DynamicCache(config=model.config)
    positions = position_ids(attention_mask)
    prefill, step_kwargs = forward_kwargs(model, cache)
    first, row_prompt = distinct_prompts(input_ids, attention_mask)
    logits = model(
        input_ids=input_ids[first], attention_mask=attention_mask[first], position_ids=positions[first], **prefill
    ).logits[:, -1]
    if len(first) < n:  # each prompt's KV cache and last logits copied to its rows
        cache.batch_select_indices(row_prompt)
    logits = logits[row_prompt]
    rows = torch.arange(n, device=device)
    mask = attention_mask
    steps = 0
    for step in range(max_new_tokens):
        scores = logits.float()
        if keep is not None:
            keep(rows, step, scores)
        tokens = choose(rows, step, scores)
        out[rows, step] = tokens
        steps = step + 1
        done = tokens == eos_id
        if ended is not None:
            for i, (r, t) in enumerate(zip(rows.tolist(), tokens.tolist(), strict=True)):
                if t != eos_id and ended(r, out[r, :steps].tolist()):
                    done[i] = True
        if steps == max_new_tokens or bool(done.all()):
            break
        if bool(done.any()):
            going = (~done).nonzero().flatten()
            cache.batch_select_indices(going)
            rows, tokens, mask = rows[going], tokens[going], mask[going]
        mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
        logits = model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=mask.long().sum(-1, keepdim=True) - 1,
            **step_kwargs,
        ).logits[:, -1]
    return torch.cat([input_ids, out[:, :steps]], dim=1)
