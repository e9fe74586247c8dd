"""ref=int8 / ref=nf4: a sequence's reference numbers must not depend on its batch-mates or its padding.

Batched scoring fails these tests on the tiny model: under bf16 (a bf16 run's training precision, and the
evaluator's bf16 scoring) both regimes move a row's log-probs by about 1e-3 between scoring it alone and in
a padded batch of 3; under fp32 with a lowered LLM.int8() threshold (2.0: the tiny model's activations
then make outlier columns, which LLM.int8() picks over the whole batch) int8 moves them by about 2e-3.
"""

from __future__ import annotations

import pytest
import torch

from ablate.models.precision import autocast
from ablate.refs.base import TokenBatch
from ablate.refs.int8 import Int8RefConfig, Int8Reference
from ablate.refs.nf4 import Nf4RefConfig, Nf4Reference
from ablate.refs.quantized import real_span
from tests.conftest import token_batch

PROMPTS = [
    "Review the film:",
    "Continue: I watched it and",
    "Write a review of Iron Summer, a film about a long summer.",
]
RESPONSES = [
    "It was a wonderful, moving story.",
    "regretted every minute",
    "Great acting, lovely score. I would watch it again and again.",
]

CASES = {
    "int8-low-threshold-fp32": (Int8Reference, Int8RefConfig(threshold=2.0), "fp32"),
    "int8-bf16": (Int8Reference, Int8RefConfig(), "bf16"),
    "nf4-bf16": (Nf4Reference, Nf4RefConfig(), "bf16"),
}


def left_padded(batch: TokenBatch, pad_id: int) -> TokenBatch:
    """The same rows with their padding moved to the left."""
    ids, att, comp = batch.input_ids.clone(), batch.attention_mask.clone(), batch.completion_mask.clone()
    for i in range(ids.shape[0]):
        n = int(batch.attention_mask[i].sum())
        for t, src in ((ids, batch.input_ids), (att, batch.attention_mask), (comp, batch.completion_mask)):
            t[i] = torch.cat([src[i, n:], src[i, :n]])
        ids[i, : ids.shape[1] - n] = pad_id
    return TokenBatch(ids, att, comp)


def scores(ref, batch, precision):
    """Training log-probs (the regime's own autocast) and the audit distribution (under the caller's, as the
    evaluator scores)."""
    lp = ref.logprobs(batch)
    with autocast(torch.device("cpu"), precision):
        dist = ref.distribution(batch)
    return lp, dist


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("case", list(CASES))
def test_each_row_scores_as_if_alone_whatever_its_batch_and_padding(ref_ctx, tokenizer, case):
    cls, cfg, precision = CASES[case]
    ref_ctx.precision = precision
    ref = cls(cfg, ref_ctx)
    right = token_batch(tokenizer, PROMPTS, RESPONSES)
    for batch in (right, left_padded(right, tokenizer.pad_token_id)):
        lp, dist = scores(ref, batch, precision)
        assert lp.shape == batch.input_ids[:, 1:].shape and dist.shape[:2] == lp.shape
        for i in range(len(PROMPTS)):
            start, end = real_span(batch.attention_mask[i])
            lp1, dist1 = scores(ref, token_batch(tokenizer, PROMPTS[i : i + 1], RESPONSES[i : i + 1]), precision)
            assert torch.equal(lp[i, start : end - 1], lp1[0]), f"row {i}: log-probs depend on the batch"
            assert torch.equal(dist[i, start : end - 1], dist1[0]), f"row {i}: distribution depends on the batch"
            pad = torch.ones(lp.shape[1], dtype=torch.bool)
            pad[start : end - 1] = False
            assert torch.count_nonzero(lp[i, pad]) == 0 and torch.count_nonzero(dist[i, pad]) == 0


def test_real_span_of_left_right_and_holed_rows():
    assert real_span(torch.tensor([0, 0, 1, 1, 1])) == (2, 5)
    assert real_span(torch.tensor([1, 1, 0])) == (0, 2)
    assert real_span(torch.tensor([0, 0])) == (0, 0)
    with pytest.raises(ValueError, match="holes"):
        real_span(torch.tensor([1, 0, 1]))


@pytest.mark.filterwarnings("ignore")
def test_a_quantised_stand_in_is_scored_a_row_alone_whatever_the_audit_cached(ref_ctx, tiny_model, tokenizer):
    """The KL audit hands each stand-in the chunk's cached prompts (``ablate.models.prompt_cache``); a quantised one
    ignores them, so what the audit measures is still each row's forward alone, what training receives."""
    from ablate.models.prompt_cache import SharedPrompts
    from ablate.models.sampling import sample

    cls, cfg, _ = CASES["int8-low-threshold-fp32"]
    ref = cls(cfg, ref_ctx)
    args = dict(max_new_tokens=8, temperature=1.0, batch_size=6, seed=0, n_per_prompt=2)
    (sampled, *_) = sample(tiny_model, tokenizer, PROMPTS, **args)
    shared = SharedPrompts(sampled.batch)
    for part in sampled.chunks(4):
        prompts = shared.chunk(part.index, part.offset)
        assert torch.equal(ref.distribution(part.batch, prompts), ref.distribution(part.batch))
