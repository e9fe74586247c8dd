"""Model sources: the tiny model is deterministic and content-addressed; sampling is seeded and masked."""

from __future__ import annotations

import torch

from ablate.config import TinyModelConfig
from ablate.models.loading import load_model, resolve_source, tokenizer_fingerprint
from ablate.models.sampling import _response_mask, sample


def test_tiny_is_deterministic_and_cached(cache_root, tiny_source):
    again = resolve_source(TinyModelConfig(name="tiny"), cache_root)
    assert again.path == tiny_source.path and again.fingerprint == tiny_source.fingerprint
    a = load_model(tiny_source, torch.device("cpu"))
    b = load_model(again, torch.device("cpu"))
    for (na, ta), (nb, tb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert na == nb and torch.equal(ta, tb)
    other = resolve_source(TinyModelConfig(name="tiny", init_seed=1), cache_root)
    assert other.fingerprint != tiny_source.fingerprint


def test_tiny_dimensions_are_multiples_of_32(tiny_model):
    c = tiny_model.config
    assert c.hidden_size % 32 == 0 and c.intermediate_size % 32 == 0 and c.vocab_size % 32 == 0


def test_tokenizer_is_smollm2s_with_chat_template(tokenizer):
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.pad_token_id == tokenizer.eos_token_id
    assert "<|im_start|>assistant" in tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True
    )
    fp = tokenizer_fingerprint(tokenizer)
    old = tokenizer.chat_template
    tokenizer.chat_template = old + " "
    try:
        assert tokenizer_fingerprint(tokenizer) != fp  # the template is part of the fingerprint
    finally:
        tokenizer.chat_template = old


def test_response_mask_stops_after_first_eos():
    resp = torch.tensor([[5, 6, 2, 2, 2], [5, 2, 7, 2, 9], [5, 6, 7, 8, 9]])
    assert _response_mask(resp, eos_id=2).tolist() == [[1, 1, 1, 0, 0], [1, 1, 0, 0, 0], [1, 1, 1, 1, 1]]


def test_sampling_is_seeded_and_leaves_global_rng_alone(tiny_model, tokenizer):
    prompts = ["Write a review of a film.", "Continue: the movie was"]
    torch.manual_seed(0)
    before = torch.rand(1)
    torch.manual_seed(0)
    a = sample(tiny_model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, batch_size=2, seed=3)
    after = torch.rand(1)
    assert torch.equal(before, after)
    b = sample(tiny_model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, batch_size=2, seed=3)
    c = sample(tiny_model, tokenizer, prompts, max_new_tokens=8, temperature=1.0, batch_size=2, seed=4)
    assert a[0].texts == b[0].texts
    assert a[0].texts != c[0].texts
    batch = a[0].batch
    assert batch.input_ids.shape == batch.completion_mask.shape
    assert batch.completion_mask.sum(1).tolist() == a[0].lengths
    assert (batch.attention_mask >= batch.completion_mask).all()


def test_bf16_on_a_cpu_without_bf16_instructions_is_warned_of_once(caplog):
    """The warning follows the measured ratio of a bf16 to an fp32 matmul (60x on an AVX2-only host, about 1 with
    AVX-512 BF16): it is given exactly where the ratio passes the bound, and never for fp32 or a GPU."""
    import logging
    from types import SimpleNamespace

    import torch

    from ablate.models.precision import SLOW_BF16, bf16_slowdown
    from ablate.pipeline import warn_slow_bf16

    ratio = bf16_slowdown()
    assert 0 < ratio < float("inf")
    for precision, device in (("bf16", "cpu"), ("fp32", "cpu"), ("bf16", "meta")):
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="ablate.pipeline"):
            warn_slow_bf16(SimpleNamespace(model=SimpleNamespace(precision=precision)), torch.device(device))
        warned = [r for r in caplog.records if "without bf16 instructions" in r.getMessage()]
        if precision == "bf16" and device == "cpu" and ratio > 2 * SLOW_BF16:
            assert len(warned) == 1
        elif precision != "bf16" or device != "cpu" or ratio < SLOW_BF16 / 2:
            assert not warned
