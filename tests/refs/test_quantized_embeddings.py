"""``ref.quantize_embeddings=true`` for int8 and nf4: the token embedding becomes bitsandbytes' quantised embedding
and the LM head a quantised Linear (int8: reading the embedding's int8 rows and scales, one copy; nf4: a copy of its
own); the bytes held drop by most of the fp32 embedding's, the log-probs stay close to full's (KL small but not
zero), and a row still scores as if alone. Every regime reports its bytes against a bf16 full copy
(``ref_bytes_vs_bf16``).

On the tiny model (its 49152 x 64 embedding is 97% of its parameters): bytes / full 0.98 -> 0.27 (int8) and
0.98 -> 0.28 (nf4); mean per-token KL(full || regime) 1.1e-6 -> 2.7e-6 (int8) and 1.3e-4 -> 3.3e-4 (nf4).
"""

from __future__ import annotations

import pytest
import torch

from ablate.eval.kl import exact_kl_per_token
from ablate.refs.base import bf16_copy_bytes, module_bytes
from ablate.refs.int8 import Int8RefConfig, Int8Reference
from ablate.refs.nf4 import Nf4RefConfig, Nf4Reference
from tests.conftest import token_batch
from tests.refs.test_quantized import PROMPTS, RESPONSES, left_padded, scores

pytestmark = pytest.mark.filterwarnings("ignore")

# regime, its config, the bnb classes of embedding and head, whether the tied head shares the embedding's quantised
# weights, the least share of the fp32 embedding's bytes saved (int8: 4 bytes per weight -> 1 plus a scale per row;
# nf4: -> 2 x 0.5625, each copy 4 bits plus a 4-byte scale per block of 64)
CASES = {
    "int8": (Int8Reference, Int8RefConfig, ("Embedding8bit", "Linear8bitLt"), True, 0.7),
    "nf4": (Nf4Reference, Nf4RefConfig, ("Embedding4bit", "Linear4bit"), False, 0.7),
}


@pytest.fixture(scope="module")
def batch(tokenizer):
    return token_batch(tokenizer, PROMPTS, RESPONSES)


@pytest.fixture(scope="module")
def full(tiny_source, tokenizer):
    from ablate.models.loading import load_model
    from ablate.refs.base import RefContext
    from ablate.refs.full import FullRefConfig, FullReference

    cpu = torch.device("cpu")
    ctx = RefContext(
        str(tiny_source.path),
        tiny_source.fingerprint,
        tokenizer,
        cpu,
        load_model=lambda **kw: load_model(tiny_source, cpu, **kw),
    )
    return FullReference(FullRefConfig(), ctx)


@pytest.mark.parametrize("regime", list(CASES))
def test_the_embedding_and_the_head_are_quantised_and_the_bytes_drop(ref_ctx, regime):
    cls, config, (emb_cls, head_cls), shared, least_saved = CASES[regime]
    plain = cls(config(), ref_ctx)
    ref = cls(config(quantize_embeddings=True), ref_ctx)
    emb, head = ref.model.get_input_embeddings(), ref.model.get_output_embeddings()
    assert emb_cls in [c.__name__ for c in type(emb).__mro__] and type(head).__name__ == head_cls
    assert (emb.weight.data_ptr() == head.weight.data_ptr()) == shared and not ref.model.config.tie_word_embeddings
    # the embedding's state dict (bnb's own refuses one) lists its quantised rows and their constants
    assert len(emb.state_dict()) > 1 and ref.cost().bytes_held == module_bytes(ref.model)
    fp32_embedding = plain.model.get_input_embeddings().weight.numel() * 4
    saved = plain.cost().bytes_held - ref.cost().bytes_held
    assert least_saved * fp32_embedding < saved < fp32_embedding


@pytest.mark.parametrize("regime", list(CASES))
def test_log_probs_stay_close_to_full(ref_ctx, full, batch, regime):
    cls, config, *_ = CASES[regime]
    ref = cls(config(quantize_embeddings=True), ref_ctx)
    lp, dist = ref.logprobs(batch), ref.distribution(batch)
    mask = batch.target_mask
    # the log-probs (from the full logits: TRL's fused head cannot read a quantised head) are the distribution's
    own = torch.log_softmax(dist, -1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    assert torch.allclose(lp[mask], own[mask], atol=1e-5) and torch.count_nonzero(lp[~mask]) == 0
    d = (lp - full.logprobs(batch))[mask].abs()
    assert 0 < d.mean() < 0.5
    kl = exact_kl_per_token(full.distribution(batch), dist)[mask]
    assert (kl > 0).any() and kl.mean() < 0.1


@pytest.mark.parametrize("regime", list(CASES))
def test_a_row_scores_as_if_alone(ref_ctx, tokenizer, batch, regime):
    """As ``tests/refs/test_quantized.py`` holds the default regimes to, under bf16."""
    from ablate.refs.quantized import real_span

    cls, config, *_ = CASES[regime]
    ref_ctx.precision = "bf16"
    ref = cls(config(quantize_embeddings=True), ref_ctx)
    padded = left_padded(batch, tokenizer.pad_token_id)
    lp, dist = scores(ref, padded, "bf16")
    for i in range(len(PROMPTS)):
        start, end = real_span(padded.attention_mask[i])
        lp1, dist1 = scores(ref, token_batch(tokenizer, PROMPTS[i : i + 1], RESPONSES[i : i + 1]), "bf16")
        assert torch.equal(lp[i, start : end - 1], lp1[0]) and torch.equal(dist[i, start : end - 1], dist1[0])


def test_bytes_against_a_bf16_full_copy(ref_ctx, full):
    """``ref_bytes_vs_bf16``: the fp32 truth holds 2x a bf16 copy; a regime without weights 0; the summary has it."""
    from ablate.ref_metrics import cost_metrics
    from ablate.refs.none import NoneRefConfig, NoReference
    from ablate.run import JobState, build_summary
    from ablate.tracking import schema

    params = sum(p.numel() for p in full.model.parameters())
    assert bf16_copy_bytes(ref_ctx) == 2 * params and full.cost().bytes_held == 4 * params
    assert full.cost().extra["bytes_vs_bf16"] == 2.0
    assert NoReference(NoneRefConfig(), ref_ctx).cost().extra["bytes_vs_bf16"] == 0.0
    int8 = Int8Reference(Int8RefConfig(quantize_embeddings=True), ref_ctx).cost()
    assert int8.extra["bytes_vs_bf16"] == int8.bytes_held / (2 * params) < 1
    summary = build_summary(JobState(steps=1), cost_metrics(full, 1), 1.0, {})
    assert summary["ref_bytes_vs_bf16"] == 2.0 and schema.metric("ref_bytes_vs_bf16").unit == "ratio"


def test_the_tied_int8_head_holds_the_int8_rows_a_head_of_its_own_would(ref_ctx, batch):
    """The shared rows and scales are exactly a separate quantisation of the fp32 matrix, so sharing them changes
    no number, only the bytes; and they stay shared after a forward (Linear8bitLt moves them into its state)."""
    from ablate.refs.int8 import int8_params

    ref = Int8Reference(Int8RefConfig(quantize_embeddings=True), ref_ctx)
    ref.logprobs(batch)
    head, emb = ref.model.get_output_embeddings(), ref.model.get_input_embeddings()
    own = int8_params(Int8Reference(Int8RefConfig(), ref_ctx).model.get_input_embeddings().weight.detach(), "cpu")
    assert torch.equal(head.state.CB, own.data) and torch.equal(head.state.SCB, own.SCB)
    assert head.state.CB.data_ptr() == emb.weight.data_ptr() and head.state.SCB is emb.weight.SCB
