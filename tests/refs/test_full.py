"""The full reference: frozen, in eval mode, equal to the SFT policy, and consistent between its two views."""

from __future__ import annotations

import torch

from ablate.eval.kl import exact_kl_per_token, gather_token_logprobs
from ablate.refs import REGISTRY
from ablate.refs.base import AUDIT
from ablate.refs.full import FullRefConfig, FullReference
from ablate.refs.model_backed import next_token_logits, token_logprobs
from tests.conftest import token_batch

PROMPTS = ["Review the film:", "Continue: I watched it and"]
RESPONSES = ["It was a wonderful, moving story.", "regretted every minute"]


def test_registered_under_its_name():
    assert REGISTRY["full"] is FullReference


def test_frozen_and_eval_mode(ref_ctx):
    ref = FullReference(FullRefConfig(), ref_ctx)
    assert not ref.model.training
    assert all(not p.requires_grad for p in ref.model.parameters())
    assert all(not m.training for m in ref.model.modules())


def test_equals_the_sft_policy_and_kl_is_zero(ref_ctx, tiny_model, tokenizer):
    ref = FullReference(FullRefConfig(), ref_ctx)
    batch = token_batch(tokenizer, PROMPTS, RESPONSES)
    tiny_model.train()  # the policy trains with dropout layers present; the reference must not care
    assert torch.equal(ref.logprobs(batch), token_logprobs(tiny_model.eval(), batch))
    pol = next_token_logits(tiny_model, batch)
    kl = exact_kl_per_token(pol, ref.distribution(batch))
    assert torch.count_nonzero(kl[batch.target_mask]) == 0


def test_logprobs_and_distribution_agree_on_response_tokens(ref_ctx, tokenizer):
    ref = FullReference(FullRefConfig(), ref_ctx)
    batch = token_batch(tokenizer, PROMPTS, RESPONSES)
    lp = ref.logprobs(batch)
    gathered = gather_token_logprobs(ref.distribution(batch).log_softmax(-1), batch.input_ids[:, 1:])
    mask = batch.target_mask
    assert torch.allclose(lp[mask], gathered[mask], atol=1e-4)
    assert (lp[~mask] == 0).all()
    assert (lp[mask] < 0).all()


def test_cost_counts_training_calls_not_audits(ref_ctx, tokenizer):
    ref = FullReference(FullRefConfig(), ref_ctx)
    batch = token_batch(tokenizer, PROMPTS, RESPONSES)
    ref.logprobs(batch)
    ref.logprobs(batch, "training")
    ref.logprobs(batch, AUDIT)
    ref.logprobs(batch, AUDIT, "bf16")
    ref.distribution(batch)
    c = ref.cost()
    assert c.forward_calls == 2 and c.forward_s > 0
    n_params = sum(p.numel() for p in ref.model.parameters())
    assert c.bytes_held >= 4 * n_params  # fp32 weights, tied embeddings counted once
