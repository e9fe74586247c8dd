"""A model's KV cache of a sampled batch's distinct prompts, computed once and shared by every chunk scored from it.

The KL audit scores a generate call's responses a chunk at a time, each chunk through the judge over prompt and
response. The prompt is most of a row (about 54 of 83 tokens at the default evaluation) and several rows share it (the
samples per prompt), so most of the judge's forward recomputed the same prompts. :class:`PromptCache` runs the model
once over each distinct prompt of the generate call's batch and keeps its keys and values and its last position's
logits; :meth:`PromptCache.next_token_logits` then runs only a chunk's response columns, on top of its rows' cached
prompts, and lays the logits out as :func:`ablate.models.logprobs.next_token_logits` lays out a forward's. The two
differ by float rounding only (``tests/models/test_prompt_cache.py`` bounds it, as it does for the sampler's kept
logits), so the evaluator takes it in fp32 only.

:class:`SharedPrompts` holds one such cache per model for a generate call's batch (the judge's, and a stand-in's
whose distribution is a frozen model's plain forward: ``ModelReference``), each built on first use, and
:meth:`SharedPrompts.chunk` hands a chunk's view of them to whoever scores it: the judge and a stand-in then run the
same computation, so a stand-in identical to the judge still audits to exactly the judge's figures. A cache is kept
per model object (and state) for the generate call's audit: the model must not change during it.

The batch must be laid out as the samplers lay it out: left-padded prompts, every response starting at the same
column. :meth:`PromptCache.of` returns None for any other layout, or a model whose forward takes no KV cache; the
caller then runs the plain forward.
"""

from __future__ import annotations

import copy

import torch

from ablate.batch import TokenBatch
from ablate.models.decode import distinct_prompts, forward_kwargs, position_ids
from ablate.models.logprobs import forward_parameters
from ablate.models.logprobs import next_token_logits as plain_next_token_logits


def response_start(batch: TokenBatch) -> int | None:
    """The column every response of ``batch`` starts at, or None when it has none, a prompt token lies at or after
    the first response token's column, or that column holds no prompt before it."""
    completion, used = batch.completion_mask.bool(), batch.attention_mask.bool()
    cols = completion.any(0).nonzero()
    if not len(cols):
        return None
    start = int(cols[0])
    if start == 0 or bool((used[:, start:] & ~completion[:, start:]).any()) or not bool(used[:, :start].any(1).all()):
        return None
    return start


class PromptCache:
    """``model``'s keys, values and last-position logits for each distinct prompt of ``batch`` (a generate call's
    batch, columns as it was sampled), under ``torch.no_grad``."""

    def __init__(self, model, batch: TokenBatch, start: int) -> None:
        from transformers import DynamicCache

        self.model, self.start = model, start
        ids, self.mask = batch.input_ids[:, :start], batch.attention_mask[:, :start]
        first, self.row_prompt = distinct_prompts(ids, self.mask)
        self.cache = DynamicCache(config=model.config)
        prefill, _ = forward_kwargs(model, self.cache)
        with torch.no_grad():
            out = model(
                input_ids=ids[first],
                attention_mask=self.mask[first],
                position_ids=position_ids(self.mask[first]),
                **prefill,
            )
        self.last = out.logits[:, -1].float()  # [distinct prompts, V]: the next-token logits after each prompt

    @classmethod
    def of(cls, model, batch: TokenBatch) -> PromptCache | None:
        """The cache of ``batch``'s prompts under ``model``, or None where it does not apply (module docstring)."""
        params = forward_parameters(model)
        if not ({"past_key_values", "cache"} & params and "position_ids" in params):
            return None
        start = response_start(batch)
        return None if start is None else cls(model, batch, start)

    def next_token_logits(self, part: TokenBatch, rows: list[int], offset: int) -> torch.Tensor:
        """[b, T-1, V] float32 next-token logits of ``part``, rows ``rows`` of the cached batch and its columns from
        ``offset`` on (:meth:`ablate.models.sampling.SampledBatch.chunks`), laid out as
        :func:`ablate.models.logprobs.next_token_logits` lays out a forward's (0 before the last prompt position)."""
        width = part.input_ids.shape[1]
        start = self.start - offset  # the first response column in ``part``
        if not 0 < start < width:
            raise ValueError(f"a chunk from column {offset}, {width} wide, holds no response after column {self.start}")
        index = self.row_prompt[torch.as_tensor(rows, device=self.row_prompt.device)]
        cache = copy.deepcopy(self.cache)
        cache.batch_select_indices(index)
        mask = torch.cat([self.mask[rows], part.attention_mask[:, start:]], dim=1)
        _, step = forward_kwargs(self.model, cache)
        with torch.no_grad():
            logits = self.model(
                input_ids=part.input_ids[:, start:],
                attention_mask=mask,
                position_ids=position_ids(mask)[:, self.start :],
                **step,
            ).logits
        out = torch.zeros(len(rows), width - 1, logits.shape[-1], dtype=torch.float32, device=logits.device)
        out[:, start - 1] = self.last[index]
        out[:, start:] = logits[:, :-1]
        return out


class SharedPrompts:
    """Each frozen model's :class:`PromptCache` of one generate call's ``batch`` (already on the models' device), built
    the first time a chunk asks for that model's logits."""

    def __init__(self, batch: TokenBatch) -> None:
        self.batch = batch
        self._caches: dict[tuple[int, str], PromptCache | None] = {}

    def cache(self, model, state: str = "") -> PromptCache | None:
        """``model``'s cache, built on first use; ``state`` names what else its forward depends on (a peft model's
        adapter disabled: ``ref=shared``), so that one model object in two states never shares one."""
        key = (id(model), state)
        if key not in self._caches:
            self._caches[key] = PromptCache.of(model, self.batch)
        return self._caches[key]

    def chunk(self, rows: list[int], offset: int) -> ChunkPrompts:
        """The view of a chunk: rows ``rows`` of the batch, its columns from ``offset`` on."""
        return ChunkPrompts(self, rows, offset)


class ChunkPrompts:
    """One chunk's view of a :class:`SharedPrompts`: a model's next-token logits of the chunk on its cached prompts."""

    def __init__(self, shared: SharedPrompts, rows: list[int], offset: int) -> None:
        self.shared, self.rows, self.offset = shared, rows, offset

    def next_token_logits(self, model, part: TokenBatch, state: str = "") -> torch.Tensor:
        """As :func:`ablate.models.logprobs.next_token_logits` of ``model`` on ``part`` (this chunk's tokens), run
        on ``model``'s cached prompts where it has them (its plain forward otherwise); ``state``:
        :meth:`SharedPrompts.cache`'s."""
        cache = self.shared.cache(model, state)
        if cache is None:
            return plain_next_token_logits(model, part)
        return cache.next_token_logits(part, self.rows, self.offset)
