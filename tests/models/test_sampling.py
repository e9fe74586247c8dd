"""What a sampled batch records about each response: where it ends, and whether max_new_tokens cut it off."""

from __future__ import annotations

import pytest
import torch

from ablate.models.sampling import _assemble


def test_a_response_without_an_eos_is_truncated_and_one_with_it_is_not(tokenizer):
    eos, pad, word = tokenizer.eos_token_id, tokenizer.pad_token_id, 5
    enc = {"input_ids": torch.tensor([[word, word], [word, word], [word, word]]), "attention_mask": torch.ones(3, 2)}
    responses = torch.tensor(
        [
            [word, word, word],  # cut off: no EOS in max_new_tokens = 3
            [word, eos, pad],  # ended early
            [word, word, eos],  # ended exactly at the cap: not truncated
        ]
    )
    sb = _assemble(["a", "b", "c"], enc, torch.cat([enc["input_ids"], responses], dim=1), tokenizer, None)
    assert sb.truncated == [True, False, False]
    assert sb.lengths == [3, 2, 3]
    assert [len(c.truncated) for c in sb.chunks(2)] == [2, 1]


PROMPTS = ["A film about a dog.", "A thriller on a boat.", "A comedy.", "Space travel, reviewed at length."]


def _draw(model, tokenizer, **kw):
    from ablate.models.sampling import sample

    args = dict(max_new_tokens=12, temperature=1.0, batch_size=5, seed=0, n_per_prompt=2)
    return sample(model, tokenizer, PROMPTS, **{**args, **kw})


def test_kept_scores_are_a_forwards_logits_at_every_response_position(tiny_model, tokenizer):
    """The sampler's kept logits, laid out as a forward's (batch by batch and chunk by chunk, trimmed columns and
    all), match a forward of the sampled tokens in fp32 at every response position to float rounding (the
    tolerance the KL audit relies on: ``Evaluator.keeps_scores``), and are 0 at the prompt's; keeping them
    changes no sample."""
    from ablate.eval.kl import exact_kl_per_token
    from ablate.models.logprobs import next_token_logits

    kept, plain = _draw(tiny_model, tokenizer, keep_scores=True), _draw(tiny_model, tokenizer)
    assert [b.batch.input_ids.tolist() for b in kept] == [b.batch.input_ids.tolist() for b in plain]
    assert all(b.scores is None for b in plain)
    positions = 0
    for b in kept:
        for part in (b, *b.chunks(3), *b.chunks(3)[0].chunks(2)):
            got, want = part.policy_logits(), next_token_logits(tiny_model, part.batch)
            assert got.shape == want.shape
            m = part.batch.target_mask
            assert float((got - want)[m].abs().max()) < 1e-5
            assert float(exact_kl_per_token(got[m].double(), want[m].double()).max()) < 1e-12
            assert not got[:, : part.prompt_width - 1 - part.offset].any()  # the prompt's positions
            positions += int(m.sum())
    assert positions > 3 * sum(len(b.texts) for b in kept)  # responses of several tokens were compared


def test_a_batch_sampled_without_kept_scores_says_so(tiny_model, tokenizer):
    (b, *_) = _draw(tiny_model, tokenizer)
    with pytest.raises(ValueError, match="without keep_scores"):
        b.policy_logits()


def test_kept_scores_take_their_room_in_the_rows_of_a_generate_call(tiny_model, tokenizer):
    from ablate.models.batching import bytes_per_row
    from ablate.models.sampling import sampling_rows

    kw = dict(prompt_width=20, max_new_tokens=64, dtype=torch.float32)
    extra = bytes_per_row(tiny_model.config, keep_scores=True, **kw) - bytes_per_row(tiny_model.config, **kw)
    assert extra == 64 * tiny_model.config.vocab_size * 4
    rows = [
        sampling_rows(
            tiny_model.config,
            tokenizer,
            PROMPTS * 64,
            max_new_tokens=64,
            precision="fp32",
            device=torch.device("cpu"),
            keep_scores=keep,
        )
        for keep in (False, True)
    ]
    assert rows[1] < rows[0]


def test_the_multinomial_sampler_leaves_the_global_rng_alone_between_batches(tiny_model, tokenizer):
    """Its draws come from the seeded global RNG: every batch is drawn before the first is handed over, so work done
    on a batch cannot move the next one's draws, and the caller's RNG is its own again."""
    from ablate.models.sampling import iter_sample

    args = dict(max_new_tokens=8, temperature=1.0, batch_size=3, seed=0, sampler="multinomial")
    want = [b.texts for b in iter_sample(tiny_model, tokenizer, PROMPTS, **args)]
    torch.manual_seed(123)
    alone = [torch.rand(5) for _ in want] + [torch.rand(1)]  # the caller's draws, with no sampling
    torch.manual_seed(123)
    got, mine = [], []
    for b in iter_sample(tiny_model, tokenizer, PROMPTS, **args):
        mine.append(torch.rand(5))  # the caller's own use of the RNG, between batches
        got.append(b.texts)
    mine.append(torch.rand(1))
    assert got == want and len(got) == 2
    assert all(torch.equal(a, b) for a, b in zip(alone, mine, strict=True))


def test_next_token_logits_run_the_lm_head_from_the_first_response_position_only(tiny_model, tokenizer):
    """The LM head runs on the positions from the first that scores a response token on (any row's); there the
    logits are a full forward's (to float rounding), before it 0; a batch scored from its first position (plain
    text: perplexity) runs it everywhere."""
    from ablate.batch import TokenBatch
    from ablate.models.logprobs import next_token_logits

    (b, *_) = _draw(tiny_model, tokenizer)
    heads: list[int] = []
    hook = tiny_model.lm_head.register_forward_hook(lambda module, args, out: heads.append(args[0].shape[1]))
    try:
        got = next_token_logits(tiny_model, b.batch)
        full = TokenBatch(b.batch.input_ids, b.batch.attention_mask, b.batch.attention_mask)
        want = next_token_logits(tiny_model, full)
    finally:
        hook.remove()
    first = int(b.batch.target_mask.any(0).nonzero()[0])
    width = b.batch.input_ids.shape[1]
    assert first > 0 and heads == [width - first, width]
    assert got.shape == want.shape and not got[:, :first].any()
    assert torch.allclose(got[:, first:], want[:, first:], atol=1e-5)
