"""``ref=full`` reads the run's one frozen copy of the SFT model (the evaluator's judge) instead of loading the same
weights again: it computes exactly what a copy of its own computes, counts the copy in its cost all the same, and
leaves the judge's own numbers as they were; every regime that changes, quantises or wraps its copy loads its own."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from ablate.inputs import RunInputs
from ablate.models.logprobs import next_token_logits
from ablate.refs import regime_class
from ablate.refs.base import AUDIT, module_bytes
from tests.conftest import TINY_FAST, token_batch, typed_config

PROMPTS = ["Review the film:", "Continue: I watched it and"]
RESPONSES = ["It was a wonderful, moving story.", "regretted every minute"]


def _config(tmp_path, ref: str):
    return typed_config(tmp_path / ref, *TINY_FAST, f"ref={ref}")


def _regime(cfg, inputs: RunInputs):
    return regime_class(cfg.ref.name)(cfg.ref, inputs.ref_context(cfg))


@pytest.fixture
def inputs_with_judge(tmp_path):
    """The run's inputs after the evaluator took its judge (as the pipeline builds them)."""
    inputs = RunInputs.build(_config(tmp_path, "full"))
    inputs.frozen_copy()
    return inputs


def test_ref_full_reads_the_judges_copy_and_computes_what_its_own_copy_computes(tmp_path, inputs_with_judge):
    cfg = _config(tmp_path, "full")
    judge = inputs_with_judge.frozen_copy()
    assert judge is inputs_with_judge.frozen_copy()  # one copy per run
    assert not judge.training and not any(p.requires_grad for p in judge.parameters())
    shared = _regime(cfg, inputs_with_judge)
    assert shared.model is judge
    own = _regime(cfg, replace(inputs_with_judge))  # the same inputs without the frozen copy (the bench's) load one
    assert own.model is not judge
    assert shared.cost().bytes_held == own.cost().bytes_held == module_bytes(judge) > 0  # ref_bytes unchanged
    batch = token_batch(inputs_with_judge.tokenizer, PROMPTS, RESPONSES)
    for precision in ("fp32", "bf16"):  # training calls run in the policy's precision
        shared.ctx.precision = own.ctx.precision = precision
        assert torch.equal(shared.logprobs(batch), own.logprobs(batch))
    assert torch.equal(shared.logprobs(batch, AUDIT), own.logprobs(batch, AUDIT))
    assert torch.equal(shared.distribution(batch), own.distribution(batch))


def test_the_judge_scores_and_samples_the_same_after_ref_full_used_it(tmp_path, inputs_with_judge):
    """The regime installs TRL's fused head on the shared model: the evaluator's logits and generations from it
    do not change."""
    judge = inputs_with_judge.frozen_copy()
    tok = inputs_with_judge.tokenizer
    batch = token_batch(tok, PROMPTS, RESPONSES)
    enc = tok(PROMPTS, return_tensors="pt", padding=True)

    def evaluator_view():
        with torch.no_grad():
            sampled = judge.generate(**enc, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
        return next_token_logits(judge, batch), sampled

    logits, sampled = evaluator_view()
    shared = _regime(_config(tmp_path, "full"), inputs_with_judge)
    shared.logprobs(batch)
    assert shared.model is judge
    logits_after, sampled_after = evaluator_view()
    assert torch.equal(logits, logits_after) and torch.equal(sampled, sampled_after)


@pytest.mark.slow
@pytest.mark.parametrize("ref", ["ema", "snapshot", "topk", "int8", "nf4"])
def test_regimes_that_change_quantise_or_wrap_their_copy_load_their_own(tmp_path, inputs_with_judge, ref):
    reference = _regime(_config(tmp_path, ref), inputs_with_judge)
    assert reference.model is not inputs_with_judge.frozen_copy()


def test_a_run_without_a_frozen_copy_does_not_make_one(tmp_path):
    """Building a regime never loads the run's frozen copy (the bench measures each regime's memory alone)."""
    cfg = _config(tmp_path, "full")
    inputs = RunInputs.build(cfg)
    assert _regime(cfg, inputs).model is not None
    assert inputs._frozen is None
