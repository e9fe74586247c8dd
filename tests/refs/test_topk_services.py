"""``ref=topk`` as the two real services: a scoring endpoint (``keep_sampled=true``: the scored token's exact
log-prob next to the top k) and a top-logprobs endpoint (``keep_sampled=false``: the top k only)."""

from __future__ import annotations

import pytest
import torch

from ablate.refs.base import AUDIT
from ablate.refs.full import FullReference
from ablate.refs.topk import TopKRefConfig, TopKReference, topk_distribution
from tests.conftest import compose
from tests.test_cli_errors import assert_one_line, run_main  # noqa: F401  (run_main: the CLI fixture)


def scored_ranks(full: FullReference, batch) -> torch.Tensor:
    """[B, T-1] rank of each scored token under the full reference (0: its most likely token)."""
    logits = full.distribution(batch)
    own = logits.gather(-1, batch.input_ids[:, 1:, None])
    return (logits > own).sum(-1)


def straddling_k(ranks: torch.Tensor, mask: torch.Tensor) -> int:
    """A k with some scored tokens inside the top k and some outside it."""
    scored = ranks[mask]
    k = int(scored.float().median()) + 1
    assert (scored < k).any() and (scored >= k).any(), scored
    return k


def test_the_default_is_a_scoring_endpoint():
    assert compose("ref=topk").ref.keep_sampled is True
    assert TopKRefConfig().keep_sampled is True


def test_a_scoring_endpoint_gives_every_scored_token_its_exact_logprob(ref_ctx, full, batch):
    """Inside and outside the top k, training's log-probs are the full reference's, bit for bit; the
    distribution the KL audit reads stays the top-k + tail form."""
    k = straddling_k(scored_ranks(full, batch), batch.target_mask)
    ref = TopKReference(TopKRefConfig(k=k, keep_sampled=True), ref_ctx)
    assert torch.equal(ref.logprobs(batch), full.logprobs(batch))
    assert torch.equal(ref.logprobs(batch, AUDIT), full.logprobs(batch, AUDIT))
    assert torch.equal(ref.logprobs(batch, AUDIT, "bf16"), full.logprobs(batch, AUDIT, "bf16"))
    approx = topk_distribution(torch.log_softmax(full.distribution(batch), -1), k, "bucket", 1e-10)
    assert torch.equal(ref.distribution(batch), approx)


@pytest.mark.parametrize("tail", ["bucket", "renorm"])
def test_a_top_logprobs_endpoint_gives_a_token_outside_the_top_k_the_tail_value(ref_ctx, full, batch, tail):
    ranks = scored_ranks(full, batch)
    k = straddling_k(ranks, batch.target_mask)
    ref = TopKReference(TopKRefConfig(k=k, tail=tail, keep_sampled=False), ref_ctx)
    approx = topk_distribution(torch.log_softmax(full.distribution(batch), -1), k, tail, 1e-10)
    tail_value = approx.gather(-1, approx.argmin(-1, keepdim=True)).squeeze(-1)  # every tail token's log-prob
    outside = batch.target_mask & (ranks >= k)
    for got in (ref.logprobs(batch), ref.logprobs(batch, AUDIT)):
        assert torch.allclose(got[outside], tail_value[outside], rtol=0, atol=1e-5)
        assert (got[outside] - full.logprobs(batch)[outside]).abs().min() > 1e-3  # not the reference's own value
        inside = batch.target_mask & (ranks < k)
        expected = approx.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
        assert torch.allclose(got[inside], expected[inside], rtol=0, atol=1e-5)


def test_bytes_per_position_of_each_service(ref_ctx):
    """Top k (value, index) pairs and the tail term; a scoring endpoint adds the scored token's value (4 bytes: its
    index is the token the caller sent)."""
    kept = TopKReference(TopKRefConfig(k=5, keep_sampled=True), ref_ctx).cost().extra
    top = TopKReference(TopKRefConfig(k=5, keep_sampled=False), ref_ctx).cost().extra
    assert top["stored_bytes_per_position"] == 5 * (4 + 4) + 4
    assert kept["stored_bytes_per_position"] == 5 * (4 + 4) + 4 + 4
    assert kept["full_bytes_per_position"] == top["full_bytes_per_position"]


def test_a_bad_keep_sampled_is_one_line(run_main):  # noqa: F811  (the imported fixture)
    assert_one_line(
        *run_main("ref=topk", "ref.keep_sampled=maybe"), "ref.keep_sampled: 'maybe' is not a valid bool (true or false)"
    )


def test_an_audit_reads_a_scoring_endpoints_logprobs_off_the_distributions_forward(ref_ctx, full, batch):
    """The evaluator's audit asks for a batch's distribution, then its scored tokens' log-probs: with
    ``keep_sampled`` the second comes from the first's forward (within float rounding of the fused head's), once;
    training, another batch or another precision runs the model."""
    ref = TopKReference(TopKRefConfig(k=5, keep_sampled=True), ref_ctx)
    forwards = []
    ref.model.register_forward_hook(lambda *a: forwards.append(1))

    def calls(f):
        before = len(forwards)
        out = f()
        return out, len(forwards) - before

    with torch.autocast("cpu", enabled=False):  # the evaluator's fp32 audit
        ref.distribution(batch)
    got, n = calls(lambda: ref.logprobs(batch, AUDIT, "fp32"))
    assert n == 0 and torch.allclose(got, full.logprobs(batch, AUDIT, "fp32"), rtol=0, atol=1e-5)
    assert calls(lambda: ref.logprobs(batch, AUDIT, "fp32"))[1] == 1  # read once
    for other in (
        lambda: ref.logprobs(batch),  # training
        lambda: ref.logprobs(batch.to("cpu"), AUDIT, "fp32"),  # the same tokens, another batch
        lambda: ref.logprobs(batch, AUDIT, "bf16"),
    ):
        with torch.autocast("cpu", enabled=False):
            ref.distribution(batch)
        got, n = calls(other)
        assert n == 1
    assert torch.equal(ref.logprobs(batch), full.logprobs(batch))
