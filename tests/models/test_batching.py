"""Rows per generate call sized by memory: the estimate covers what generate really holds, and stays in budget."""

from __future__ import annotations

import torch

from ablate.models import batching
from ablate.models.sampling import chat_prompt_texts, sample, sampling_rows
from ablate.tasks.prompts import make_prompts

PROMPTS = make_prompts(1, 5, 1)["eval"]


def test_rows_fit_the_budget_and_never_exceed_the_sequences(tiny_model):
    cfg = tiny_model.config
    per_row = batching.bytes_per_row(cfg, prompt_width=40, max_new_tokens=8, dtype=torch.float32)
    fit = dict(prompt_width=40, max_new_tokens=8, dtype=torch.float32)
    assert batching.rows_that_fit(cfg, n=1000, budget=10 * per_row + 1, **fit) == 10
    assert batching.rows_that_fit(cfg, n=3, budget=10 * per_row, **fit) == 3
    assert batching.rows_that_fit(cfg, n=1000, budget=per_row // 2, **fit) == 1  # one row always runs
    wider = batching.bytes_per_row(cfg, prompt_width=80, max_new_tokens=8, dtype=torch.float32)
    assert wider > per_row > batching.bytes_per_row(cfg, prompt_width=40, max_new_tokens=8, dtype=torch.bfloat16)


def test_the_estimate_covers_the_kv_cache_generate_allocates(tiny_model, tokenizer):
    enc = tokenizer(chat_prompt_texts(tokenizer, PROMPTS[:2]), return_tensors="pt", padding=True)
    new = 6
    out = tiny_model.generate(
        **enc,
        max_new_tokens=new,
        min_new_tokens=new,
        do_sample=False,
        return_dict_in_generate=True,
        pad_token_id=tokenizer.pad_token_id,
    )
    cache = out.past_key_values
    kv = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    width = enc["input_ids"].shape[1]
    per_row = batching.bytes_per_row(tiny_model.config, prompt_width=width, max_new_tokens=new, dtype=torch.float32)
    assert kv / 2 == batching.kv_bytes_per_position(tiny_model.config, torch.float32) * (width + new - 1)
    assert per_row >= kv / 2


def test_memory_sized_sampling_takes_every_prompt_in_one_call_when_they_fit(tiny_model, tokenizer):
    rows = sampling_rows(
        tiny_model.config, tokenizer, PROMPTS, max_new_tokens=4, precision="fp32", device=torch.device("cpu")
    )
    assert rows == len(PROMPTS)
    batches = sample(tiny_model, tokenizer, PROMPTS, max_new_tokens=4, temperature=1.0, batch_size=None, seed=0)
    assert [len(b.texts) for b in batches] == [len(PROMPTS)]
    by_two = sample(tiny_model, tokenizer, PROMPTS, max_new_tokens=4, temperature=1.0, batch_size=2, seed=0)
    assert [t for b in by_two for t in b.texts] == batches[0].texts  # coupled: the rows do not change the draws


def test_chunks_split_a_sampled_batch_into_its_rows_shortest_first_each_trimmed_to_its_own_columns(
    tiny_model, tokenizer
):
    (sb,) = sample(tiny_model, tokenizer, PROMPTS, max_new_tokens=6, temperature=1.0, batch_size=None, seed=0)
    parts = sb.chunks(2)
    assert [len(p.texts) for p in parts] == [2, 2, 1]
    assert sorted(i for p in parts for i in p.index) == list(range(len(PROMPTS)))
    used = [int(sb.batch.attention_mask[i].sum()) for p in parts for i in p.index]
    assert used == sorted(used)  # shortest first
    for p in parts:
        assert [sb.texts[i] for i in p.index] == p.texts and [sb.lengths[i] for i in p.index] == p.lengths
        assert p.batch.attention_mask.bool().any(0).all()  # no column that every row pads
        for row, i in enumerate(p.index):  # each row's tokens, masks and relative positions as they were
            for name in ("input_ids", "completion_mask"):
                keep = sb.batch.attention_mask[i].bool()
                assert torch.equal(
                    getattr(p.batch, name)[row][p.batch.attention_mask[row].bool()], getattr(sb.batch, name)[i][keep]
                )
    assert sum(p.batch.input_ids.numel() for p in parts) < sb.batch.input_ids.numel()
