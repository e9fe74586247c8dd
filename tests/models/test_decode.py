"""Decoding that drops the rows that have ended (ablate.models.decode) draws the tokens ``generate`` draws."""

from __future__ import annotations

import torch
from transformers import GenerationConfig, LogitsProcessorList

from ablate.models.coupled import CoupledGumbel
from ablate.models.decode import decode
from ablate.models.sampling import chat_prompt_texts

PROMPTS = ["A film about a dog.", "A thriller on a boat.", "A comedy.", "Space travel, reviewed at length.", "Hi"]
KEYS = [(i, 0) for i in range(len(PROMPTS))]
STEPS = 10


def _enc(tokenizer):
    return tokenizer(chat_prompt_texts(tokenizer, PROMPTS), return_tensors="pt", padding=True, add_special_tokens=False)


def _decode(model, tokenizer, enc, choose, **kw):
    return decode(
        model,
        enc["input_ids"],
        enc["attention_mask"],
        max_new_tokens=STEPS,
        eos_id=tokenizer.eos_token_id,
        pad_id=tokenizer.pad_token_id,
        choose=choose,
        **kw,
    )


def test_decode_draws_generates_tokens_and_runs_a_row_only_until_it_ends(tiny_model, tokenizer):
    """Each row's tokens are ``generate``'s (greedy, the coupled sampler's noise) up to its end (``ended``, or an EOS:
    row 4 is made to draw one), pads after it; a row is run (its logits seen) only at the steps before its end, and
    the output is as wide as the longest response."""
    enc, eos, pad = _enc(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id
    width = enc["input_ids"].shape[1]
    noise = CoupledGumbel(0, KEYS, width, 1.0)
    config = GenerationConfig(do_sample=False, max_new_tokens=STEPS, pad_token_id=pad, eos_token_id=eos)
    out = tiny_model.generate(
        **enc,
        generation_config=config,
        logits_processor=LogitsProcessorList([noise]),
        return_dict_in_generate=True,
        output_logits=True,
    )
    want, want_logits = out.sequences[:, width:], torch.stack(out.logits, dim=1)  # [rows, steps, V]
    ends_after = [2, 3, 5, 7, 9]  # the row-th response ends after this many tokens (unless its EOS comes first)
    seen: list[list[int]] = []

    def choose(rows, step, logits):  # row 4 draws EOS at its second step
        return torch.where((rows == 4) & (step == 1), eos, noise.choose(rows, step, logits))

    got = _decode(
        tiny_model,
        tokenizer,
        enc,
        choose,
        ended=lambda row, ids: len(ids) >= ends_after[row],
        keep=lambda rows, step, logits: seen.append((rows.tolist(), step, logits.clone())),
    )
    assert torch.equal(got[:, :width], enc["input_ids"])
    got = got[:, width:]
    lengths = []
    for row, end in enumerate(ends_after):
        eos_at = (want[row] == eos).nonzero().flatten().tolist()
        n = same = min(end, eos_at[0] + 1) if eos_at else end
        if row == 4:  # its forced EOS at the second step, after generate's first token
            assert not eos_at or eos_at[0] > 1
            n, same = 2, 1
            assert got[row, 1] == eos
        lengths.append(n)
        assert got[row, :same].tolist() == want[row, :same].tolist()
        assert (got[row, n:] == pad).all()
    assert got.shape[1] == max(lengths)
    assert [sum(row in rows for rows, _, _ in seen) for row in range(len(PROMPTS))] == lengths
    assert len(seen[-1][0]) < len(PROMPTS)  # rows were dropped
    for rows, step, logits in seen:  # each row's logits are generate's, to float rounding
        if step < 2:  # row 4's forced EOS changes its later steps
            assert torch.allclose(logits, want_logits[rows, step], atol=1e-5)
        else:
            going = [i for i, r in enumerate(rows) if r != 4]
            assert torch.allclose(logits[going], want_logits[[rows[i] for i in going], step], atol=1e-5)


def test_rows_of_one_prompt_share_its_prefill_and_draw_generates_tokens(tiny_model, tokenizer):
    """Without ``ended``, every row runs to its EOS or the cap, token for token as ``generate`` runs it; rows with the
    same prompt (two samples each, keys (prompt, 0) and (prompt, 1)) share one prefill: the first forward has a
    row per prompt."""
    prompts = [p for p in PROMPTS for _ in range(2)]
    enc = tokenizer(chat_prompt_texts(tokenizer, prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    eos, pad, width = tokenizer.eos_token_id, tokenizer.pad_token_id, enc["input_ids"].shape[1]
    noise = CoupledGumbel(3, [(i, j) for i in range(len(PROMPTS)) for j in range(2)], width, 0.7)
    config = GenerationConfig(do_sample=False, max_new_tokens=STEPS, pad_token_id=pad, eos_token_id=eos)
    want = tiny_model.generate(**enc, generation_config=config, logits_processor=LogitsProcessorList([noise]))
    rows: list[int] = []
    hook = tiny_model.register_forward_hook(
        lambda module, args, kwargs, out: rows.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    try:
        got = _decode(tiny_model, tokenizer, enc, noise.choose)
    finally:
        hook.remove()
    assert got.tolist() == want.tolist()
    assert rows[0] == len(PROMPTS) and rows[1] == len(prompts)
    assert got[0, width:].tolist() != got[1, width:].tolist()  # one prompt, two keys: two responses
