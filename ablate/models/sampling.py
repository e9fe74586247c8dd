"""Sampling responses from a chat model, as token batches ready for scoring.

Samples are drawn at the given temperature with no top-k/top-p truncation, so they are samples
from the model's own distribution: the per-token log-probs the evaluator scores are the ones
the sampler used (at temperature 1).

Two samplers:

- ``coupled`` (the default): Gumbel-max with noise keyed by (seed, prompt id, sample index, position, token)
  (:mod:`ablate.models.coupled`), decoded by :func:`ablate.models.decode.decode`, which stops running a row once
  its response has ended (its EOS, or the stop rule has :func:`ablate.stop_rule.settled` it). A row's response
  depends only on its key and the model, not on the batch it is in (in exact arithmetic, and in fp32 here; in bf16
  a matmul's rounding depends on its rows, so callers that cache samples key on the rows); two models that agree
  give the same responses. The global RNG is not used.
- ``multinomial``: ``generate(do_sample=True)`` under ``torch.manual_seed(seed)`` (in a forked RNG), the former
  sampler, kept as a baseline: its draws depend on the batch size and composition.

A response ends at its first EOS, at ``max_new_tokens``, or where the task's stop rule cuts it (``max_sentences``,
:mod:`ablate.stop_rule`): tokens after the end are masked out, never decoded or scored.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ablate.batch import TokenBatch
from ablate.chat import as_chat
from ablate.models import batching
from ablate.models.coupled import CoupledGumbel
from ablate.models.decode import decode
from ablate.models.precision import autocast, is_bf16
from ablate.stop_rule import cut_completion, settled

SAMPLERS = ("coupled", "multinomial")


@dataclass
class SampledBatch:
    prompts: list[str]
    texts: list[str]  # decoded responses, special tokens removed
    batch: TokenBatch  # prompt (left-padded) + response; completion_mask covers the response (to its EOS or the cut)
    lengths: list[int]  # response tokens, EOS included
    truncated: list[bool]  # the response reached max_new_tokens without an EOS or the stop rule's end
    index: list[int] | None = None  # a chunk's rows' places in the generate call's batch (:meth:`chunks`)
    # kept with ``sample(keep_scores=True)``: the sampler's own float32 next-token logits at each generated step,
    # [rows of the generate call, steps, V], shared by a batch and its chunks (:meth:`policy_logits` reads them)
    scores: torch.Tensor | None = None
    prompt_width: int = 0  # the generate call's (left-padded) prompt width: step s scored the token at column P + s
    offset: int = 0  # the first column of the generate call's batch this batch holds (a chunk trims columns)

    def policy_logits(self) -> torch.Tensor:
        """[rows, T-1, V] float32 next-token logits of the model that sampled this batch, laid out as
        :func:`ablate.models.logprobs.next_token_logits` lays out a forward's, read off the sampler's kept
        :attr:`scores` instead of a forward: exact at the response positions (the only ones an audit reads), 0 at
        the prompt's. The sampler decoded with a KV cache, a forward scores all positions at once: the two differ by
        float rounding only (a test bounds it)."""
        if self.scores is None:
            raise ValueError("this batch was sampled without keep_scores: its logits were not kept")
        rows = list(range(self.scores.shape[0])) if self.index is None else self.index
        n, width = self.batch.input_ids.shape
        first = self.prompt_width - 1 - self.offset  # the next-token position that scored the first response token
        out = self.scores.new_zeros(n, width - 1, self.scores.shape[-1])
        out[:, first:] = self.scores[rows, : width - 1 - first]
        return out

    def chunks(self, rows: int) -> list[SampledBatch]:
        """This batch as batches of at most ``rows`` rows for scoring: shortest first (tokens in use), each trimmed to
        the columns its own rows use, so a chunk's forwards pay for its own padding, not for the longest row of the
        whole batch (a third of the audit's positions at the default evaluation). ``index``: each chunk's rows'
        places in this batch. Trimming leaves every row's tokens, and their relative positions, as they were."""
        b = self.batch
        used = b.attention_mask.bool()
        order = sorted(range(len(self.texts)), key=lambda i: (int(used[i].sum()), i))
        out = []
        for start in range(0, len(order), rows):
            idx = order[start : start + rows]
            cols = used[idx].any(0).nonzero().flatten()
            lo, hi = (int(cols[0]), int(cols[-1]) + 1) if len(cols) else (0, used.shape[1])
            part = TokenBatch(*(t[idx, lo:hi] for t in (b.input_ids, b.attention_mask, b.completion_mask)))
            out.append(
                SampledBatch(
                    [self.prompts[i] for i in idx],
                    [self.texts[i] for i in idx],
                    part,
                    [self.lengths[i] for i in idx],
                    [self.truncated[i] for i in idx],
                    idx if self.index is None else [self.index[i] for i in idx],
                    self.scores,
                    self.prompt_width,
                    self.offset + lo,
                )
            )
        return out


def chat_prompt_texts(tokenizer, prompts: list[str]) -> list[str]:
    return [tokenizer.apply_chat_template(as_chat(p), tokenize=False, add_generation_prompt=True) for p in prompts]


def sampling_rows(
    model_config,
    tokenizer,
    prompts: list[str],
    *,
    n_per_prompt: int = 1,
    max_new_tokens: int,
    precision: str,
    device: torch.device,
    keep_scores: bool = False,
) -> int:
    """Rows per generate call when the caller does not fix them: as many of the ``len(prompts) * n_per_prompt``
    sequences as fit :func:`ablate.models.batching.budget_bytes` at the longest chat prompt's width (with
    ``keep_scores``, each row's kept logits too)."""
    widths = [
        len(ids) for ids in tokenizer(chat_prompt_texts(tokenizer, prompts), add_special_tokens=False)["input_ids"]
    ]
    return batching.rows_that_fit(
        model_config,
        n=len(prompts) * n_per_prompt,
        prompt_width=max(widths, default=1),
        max_new_tokens=max_new_tokens,
        dtype=torch.bfloat16 if is_bf16(precision) else torch.float32,
        budget=batching.budget_bytes(device),
        keep_scores=keep_scores,
    )


def _response_mask(resp: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for response tokens up to and including the first EOS, 0 after it."""
    is_eos = resp == eos_id
    after_first = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_first).long()


def _multinomial_config(tokenizer, max_new_tokens: int, temperature: float):
    """``generate``'s untruncated multinomial sampling at ``temperature`` (the coupled sampler decodes itself)."""
    from transformers import GenerationConfig

    return GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )


def _rng_scope(sampler: str, seed: int, device: torch.device):
    """The multinomial sampler draws from the global RNG, seeded and forked; the coupled one needs no RNG."""
    if sampler == "coupled":
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def forked():
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            yield

    return forked()


@contextlib.contextmanager
def _paused(model, was_training: bool):
    """While a caller works on a yielded batch, the model is in the mode it was given in (a caller may train or
    evaluate it in between); sampling resumes in eval mode."""
    model.train(was_training)
    try:
        yield
    finally:
        model.eval()


def _stop_rule_mask(resp: torch.Tensor, mask: torch.Tensor, tokenizer, max_sentences: int) -> torch.Tensor:
    """``mask`` (1 up to the first EOS) with each row also ended where the stop rule cuts it."""
    mask = mask.clone()
    eos = {tokenizer.eos_token_id}
    for i, row in enumerate(resp.tolist()):
        n = int(mask[i].sum())  # response tokens, the EOS included if there is one
        mask[i, len(cut_completion(tokenizer, row[:n], eos, max_sentences)) :] = 0
    return mask


class ScoreKeeper:
    """A logits processor that keeps each decode step's scores as it receives them (the model's float32
    next-token logits: placed before the sampler's own processor, and after ``generate``'s, of which greedy and
    untruncated sampling at temperature 1 have none) in one [rows, max_new_tokens, V] tensor allocated at the
    first step, and passes them on unchanged."""

    def __init__(self, max_new_tokens: int):
        self.max_new_tokens = max_new_tokens
        self.scores: torch.Tensor | None = None
        self.steps = 0

    def __call__(self, input_ids: torch.LongTensor, scores: torch.Tensor) -> torch.Tensor:
        self.keep(torch.arange(scores.shape[0], device=scores.device), self.steps, scores)
        return scores

    def keep(self, rows: torch.Tensor, step: int, scores: torch.Tensor) -> None:
        """Keeps the scores of the batch's rows ``rows`` at ``step`` (all rows run the first step). Rows that ended
        before a step keep zeros there (:func:`ablate.models.decode.decode` runs only the rows still going)."""
        if self.scores is None:
            self.scores = scores.new_zeros(scores.shape[0], self.max_new_tokens, scores.shape[-1], dtype=torch.float32)
        self.scores[rows, step] = scores
        self.steps = max(self.steps, step + 1)

    def kept(self) -> torch.Tensor | None:
        """The steps taken (a view: generate stops early when every row has ended)."""
        return None if self.scores is None else self.scores[:, : self.steps]


def _assemble(chunk: list[str], enc, seqs: torch.Tensor, tokenizer, max_sentences: int | None) -> SampledBatch:
    """The SampledBatch of one generated chunk: masks up to the first EOS (or the stop rule's end) and the
    decoded responses."""
    eos_id = tokenizer.eos_token_id
    prompt_len = enc["input_ids"].shape[1]
    resp = seqs[:, prompt_len:]
    resp_mask = _response_mask(resp, eos_id)
    if max_sentences is not None:
        resp_mask = _stop_rule_mask(resp, resp_mask, tokenizer, max_sentences)
    attention = torch.cat([enc["attention_mask"], resp_mask], dim=1)
    completion = torch.cat([torch.zeros_like(enc["attention_mask"]), resp_mask], dim=1)
    texts = tokenizer.batch_decode(resp.masked_fill(resp_mask == 0, tokenizer.pad_token_id), skip_special_tokens=True)
    return SampledBatch(
        chunk,
        [t.strip() for t in texts],
        TokenBatch(seqs, attention, completion),
        resp_mask.sum(1).tolist(),
        (resp_mask.sum(1) == resp.shape[1]).logical_and(~(resp == eos_id).any(1)).tolist(),
        prompt_width=prompt_len,
    )


def sample(model, tokenizer, prompts: list[str], **kw) -> list[SampledBatch]:
    """:func:`iter_sample`'s batches as a list (see it for the arguments)."""
    return list(iter_sample(model, tokenizer, prompts, **kw))


@torch.no_grad()
def iter_sample(
    model,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float,
    batch_size: int | None,
    seed: int,
    precision: str = "fp32",
    n_per_prompt: int = 1,
    desc: str | None = None,
    sampler: str = "coupled",
    prompt_ids: list[int] | None = None,
    max_sentences: int | None = None,
    keep_scores: bool = False,
) -> Iterator[SampledBatch]:
    """Sample ``n_per_prompt`` responses per prompt, a generate call's batch at a time. Deterministic for a seed;
    leaves the global RNG alone (also between the batches it yields).

    With ``sampler="coupled"`` the response to prompt ``i``, sample ``j`` is keyed by (seed, ``prompt_ids[i]``,
    ``j``) (``prompt_ids`` defaults to 0..len(prompts)-1): the same key gives the same response at any batch size.
    ``batch_size``: rows per generate call; None: as many as fit in memory (:func:`sampling_rows`).
    ``max_sentences``: the task's stop rule (a response ends after that many sentences); None: no rule.
    The coupled sampler hands each batch over as it is drawn (a caller may score it before the next is drawn); the
    multinomial one after the last, since its draws come from the global RNG.
    ``keep_scores``: each batch keeps the sampler's own next-token logits (:attr:`SampledBatch.scores`, rows x
    max_new_tokens x V float32 per generate call: :func:`sampling_rows` counts them), so a caller that scores the
    samples with the same model need not run it again (:meth:`SampledBatch.policy_logits`)."""
    from transformers import LogitsProcessorList

    if sampler not in SAMPLERS:
        raise ValueError(f"sampler must be one of {', '.join(SAMPLERS)}, got {sampler!r}")
    ids = list(range(len(prompts))) if prompt_ids is None else [int(i) for i in prompt_ids]
    if len(ids) != len(prompts):
        raise ValueError(f"prompt_ids has {len(ids)} ids for {len(prompts)} prompts")
    device = next(model.parameters()).device
    if batch_size is None:
        batch_size = sampling_rows(
            model.config,
            tokenizer,
            prompts,
            n_per_prompt=n_per_prompt,
            max_new_tokens=max_new_tokens,
            precision=precision,
            device=device,
            keep_scores=keep_scores,
        )
    expanded = [p for p in prompts for _ in range(n_per_prompt)]
    keys = [(i, j) for i in ids for j in range(n_per_prompt)]

    def draw(start: int) -> SampledBatch:
        chunk = expanded[start : start + batch_size]
        enc = tokenizer(
            chat_prompt_texts(tokenizer, chunk), return_tensors="pt", padding=True, add_special_tokens=False
        ).to(device)
        keeper = ScoreKeeper(max_new_tokens) if keep_scores else None
        with autocast(device, precision):
            if sampler == "coupled":
                seqs = decode(
                    model,
                    enc["input_ids"],
                    enc["attention_mask"],
                    max_new_tokens=max_new_tokens,
                    eos_id=tokenizer.eos_token_id,
                    pad_id=tokenizer.pad_token_id,
                    choose=CoupledGumbel(seed, keys[start : start + batch_size], 0, temperature).choose,
                    ended=None if max_sentences is None else lambda _, ids: settled(tokenizer, ids, max_sentences),
                    keep=None if keeper is None else keeper.keep,
                )
            else:
                processors = LogitsProcessorList([keeper] if keeper is not None else [])
                config = _multinomial_config(tokenizer, max_new_tokens, temperature)
                seqs = model.generate(**enc, generation_config=config, logits_processor=processors)
        sampled = _assemble(chunk, enc, seqs, tokenizer, max_sentences)
        sampled.scores = None if keeper is None else keeper.kept()
        return sampled

    was_training = model.training
    starts = tqdm(
        range(0, len(expanded), batch_size), desc=desc or "sampling", unit="batch", leave=False, disable=desc is None
    )
    model.eval()
    try:
        if sampler == "coupled":  # no RNG: each batch is handed over as soon as it is drawn
            for start in starts:
                sampled = draw(start)
                with _paused(model, was_training):
                    yield sampled
            return
        with _rng_scope(sampler, seed, device):  # the seeded global RNG is the sampler's until every batch is drawn
            batches = [draw(start) for start in starts]
    finally:
        model.train(was_training)
    yield from batches
