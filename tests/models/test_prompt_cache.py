"""The judge's logits of a chunk of sampled responses, run on top of its prompts' cached keys and values, are a plain
forward's to float rounding, laid out the same way; a batch laid out otherwise is refused, not misread."""

from __future__ import annotations

import torch

from ablate.batch import TokenBatch
from ablate.eval.kl import exact_kl_per_token
from ablate.models.logprobs import next_token_logits
from ablate.models.prompt_cache import PromptCache, response_start
from ablate.models.sampling import sample

PROMPTS = ["A film about a dog.", "A thriller on a boat.", "A comedy.", "Space travel, reviewed at length."]


def _draw(model, tokenizer):
    args = dict(max_new_tokens=12, temperature=1.0, batch_size=8, seed=0, n_per_prompt=3)
    return sample(model, tokenizer, PROMPTS, **args)


def test_a_chunks_logits_on_its_cached_prompts_are_a_forwards(tiny_model, tokenizer):
    positions = 0
    for b in _draw(tiny_model, tokenizer):
        prompts = PromptCache.of(tiny_model, b.batch)
        assert prompts is not None and prompts.start == b.prompt_width
        assert len(prompts.last) < len(b.texts)  # rows share their prompt's prefill
        for part in (*b.chunks(3), *b.chunks(3)[0].chunks(2), *b.chunks(100)):
            got = prompts.next_token_logits(part.batch, part.index, part.offset)
            want = next_token_logits(tiny_model, part.batch)
            assert got.shape == want.shape
            m = part.batch.target_mask
            assert float((got - want)[m].abs().max()) < 1e-5
            assert float(exact_kl_per_token(got[m].double(), want[m].double()).max()) < 1e-12
            assert not got[:, : b.prompt_width - 1 - part.offset].any()  # the prompt's positions, as a forward's
            positions += int(m.sum())
    assert positions > 3 * 2 * len(PROMPTS) * 3  # responses of several tokens were compared


def test_a_batch_not_laid_out_as_sampled_has_no_prompt_cache(tiny_model):
    ids = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8]])
    ones = torch.ones_like(ids)
    # right-padded prompts: the first row's prompt runs past the column where the second row's response starts
    staggered = TokenBatch(ids, ones, torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]]))
    assert response_start(staggered) is None
    assert PromptCache.of(tiny_model, staggered) is None
    assert response_start(TokenBatch(ids, ones, torch.zeros_like(ids))) is None  # no response at all
    assert response_start(TokenBatch(ids, ones, torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]]))) is None  # no prompt
    ended_early = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])  # the second response ended a column before the first
    assert response_start(TokenBatch(ids, ended_early, torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]]))) == 1
