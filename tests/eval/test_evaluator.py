"""The shared evaluator on the tiny model: exact numbers where the truth is known."""

from __future__ import annotations

import math

import pytest
import torch

from ablate.models.loading import load_model
from ablate.refs.base import AUDIT
from ablate.refs.full import FullRefConfig, FullReference
from ablate.tasks.prompts import make_prompts
from ablate.tasks.reward import GoldReward
from ablate.tasks.safety import SafetyJudge
from tests.conftest import tiny_evaluator


@pytest.fixture
def evaluator(tiny_source, tokenizer):
    return tiny_evaluator(tiny_source, tokenizer)


def test_policy_equal_to_reference_has_zero_kl(evaluator, tiny_source, ref_ctx):
    policy = load_model(tiny_source, torch.device("cpu"))
    res = evaluator.evaluate(policy, FullReference(FullRefConfig(), ref_ctx), step=0)
    m = res.metrics
    assert m["kl/true"] == 0.0 and m["kl/approx"] == 0.0 and m["kl/abs_err"] == 0.0
    assert "kl/rel_err" not in m and "kl_rel_err" not in res.nan_reasons  # no ratio to a (small) true KL
    assert m["kl/true_k1"] == 0.0 and m["kl/true_k3"] == 0.0
    assert m["kl/logp_max_err"] < 1e-4
    assert len(res.samples) == 6
    # a t interval over 6 prompts, not clipped to [0, 1]: the win rate is against independent SFT samples
    assert m["eval/win_rate_lo"] <= m["eval/win_rate"] <= m["eval/win_rate_hi"] and 0.0 <= m["eval/win_rate"] <= 1.0
    assert m["eval/ppl"] > 1.0 and m["eval/length"] > 0


def test_at_step_0_a_policy_equal_to_the_sft_model_is_evaluated_through_the_judge(evaluator, tiny_source, ref_ctx):
    """Step 0 of a full fine-tune: the policy's weights are the judge's, so the evaluation draws no sample of its own
    (the SFT baseline's are its own, same keys) and runs no policy forward; every figure is the policy's own
    evaluation's. A policy that differs in one weight, or any later step, is evaluated itself."""
    policy = load_model(tiny_source, torch.device("cpu"))
    reference = FullReference(FullRefConfig(), ref_ctx)
    assert evaluator.is_sft(policy)
    policy_calls, judge_calls = _forwards(policy), _forwards(evaluator.judge)
    at_0 = evaluator.evaluate(policy, reference, step=0)
    assert policy_calls == []
    baseline_draws = len(judge_calls)
    at_1 = evaluator.evaluate(policy, reference, step=1)  # the same weights, evaluated as the policy
    assert policy_calls and len(judge_calls) > baseline_draws
    # every figure the same; the KL figures and the SFT model's perplexity to float rounding: at step 1 the policy's
    # logits are its sampler's (a KV-cached decode: Evaluator.keeps_scores), the judge's a forward's on its cached
    # prompts (Evaluator.shared_prompts), at step 0 one forward of the whole rows stands for both
    kl = {"kl_true", "kl_k1", "kl_k3", "kl_approx", "sft_nll"}
    drop = lambda r: {c: v for c, v in r.items() if c not in kl}  # noqa: E731
    assert [drop(r) for r in at_0.samples] == [drop({**r, "step": 0}) for r in at_1.samples]
    for c in kl:
        assert [r[c] for r in at_0.samples] == pytest.approx([r[c] for r in at_1.samples], rel=1e-6, abs=1e-6)
    same = lambda a, b: a == b or (math.isnan(a) and math.isnan(b))  # noqa: E731
    rounded = ("kl/true", "kl/approx", "kl/true_k1", "kl/true_k3", "eval/ppl_sft")
    assert all(
        same(at_0.metrics[k], at_1.metrics[k]) for k in at_1.metrics if not k.startswith("kl/") and k not in rounded
    )
    assert all(at_0.metrics[k] == pytest.approx(at_1.metrics[k], rel=1e-6, abs=1e-6) for k in rounded)
    with torch.no_grad():
        next(policy.parameters()).view(-1)[0] += 1e-3
    assert not evaluator.is_sft(policy)


def test_the_win_rate_is_against_independent_sft_samples_scored_per_prompt(evaluator, tiny_source, ref_ctx):
    policy = load_model(tiny_source, torch.device("cpu"))
    res = evaluator.evaluate(policy, FullReference(FullRefConfig(), ref_ctx), step=0)
    rows = res.samples
    assert [r["policy_response"] for r in rows] == [r["sft_response"] for r in rows]  # coupled: the SFT's own
    indep = evaluator.sft_baseline(1, independent=True)
    assert indep["texts"] != evaluator.sft_baseline(1)["texts"]  # another draw
    wins = [1.0 if r["policy_reward"] > r["sft_indep_reward"] else 0.5 if r["policy_reward"] == r["sft_indep_reward"]
            else 0.0 for r in rows]  # fmt: skip
    assert res.metrics["eval/win_rate"] == pytest.approx(sum(wins) / len(wins), abs=1e-12)
    assert res.metrics["eval/reward_delta"] == 0.0


def test_a_moved_policy_has_positive_kl_and_full_audits_exactly(evaluator, tiny_source, ref_ctx):
    policy = load_model(tiny_source, torch.device("cpu"))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.02 * torch.randn_like(p))
    res = evaluator.evaluate(policy, FullReference(FullRefConfig(), ref_ctx), step=5)
    m = res.metrics
    assert m["kl/true"] > 0
    assert m["kl/approx"] == m["kl/true"]  # ref=full is the truth: no approximation error
    assert m["kl/abs_err"] == 0.0
    # per-sample KL is the sum of exact per-token KLs: each is >= 0
    assert all(s["kl_true"] >= 0 for s in res.samples)
    # k1 (sampled) can be negative per sample, but the mean tracks the exact value's sign over enough samples
    assert any(s["kl_k3"] > 0 for s in res.samples)


def _moved(tiny_source):
    policy = load_model(tiny_source, torch.device("cpu"))
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.02 * torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())))
    return policy


def _forwards(model: torch.nn.Module) -> list:
    calls: list = []
    model.register_forward_hook(lambda *_: calls.append(1))
    return calls


def test_the_audit_runs_each_model_once_per_chunk_and_full_not_at_all(evaluator, tiny_source, ref_ctx):
    """A regime whose log-probs are its distribution's is run as often as the judge, once per chunk of responses (its
    log-probs read off the distribution) and once per generate call over its prompts (which each chunk runs on:
    ``Evaluator.shared_prompts``), and ``ref=full`` reading the judge's own copy not at all; the figures are those of
    the separate calls: the stand-in divergence bit for bit, the log-probs to fused-head precision."""
    from dataclasses import replace

    policy = _moved(tiny_source)
    evaluator.sft_baseline(1), evaluator.sft_baseline(1, independent=True)  # sampled with the judge before counting
    own = FullReference(FullRefConfig(), ref_ctx)  # its own copy of the SFT weights, as ema or int8 hold theirs
    assert own.logprobs_match_distribution and not own.reads(evaluator.judge)
    own_calls, judge_calls = _forwards(own.model), _forwards(evaluator.judge)
    m_own = evaluator.evaluate(policy, own, step=5).metrics
    forwards = len(judge_calls)  # the judge's: one per chunk of responses, one per generate call over its prompts
    assert forwards > math.ceil(len(evaluator.prompts) / evaluator.cfg.batch_size) and len(own_calls) == forwards

    reader = FullReference(FullRefConfig(), replace(ref_ctx, load_model=lambda **_: evaluator.judge))
    assert reader.reads(evaluator.judge)
    m_reader = evaluator.evaluate(policy, reader, step=5).metrics
    assert len(judge_calls) == 2 * forwards  # the judge's forwards only: the regime is not run again

    for m in (m_own, m_reader):
        assert m["kl/approx"] == m["kl/true"] > 0 and m["kl/abs_err"] == 0.0
        assert m["kl/logp_mae"] == m["kl/logp_max_err"] == 0.0  # the same logits as the judge's, in float64
    assert m_own.keys() == m_reader.keys()
    assert all(m_own[k] == m_reader[k] or (math.isnan(m_own[k]) and math.isnan(m_reader[k])) for k in m_own)
    # the log-probs read off the distribution are the fused head's, to its float32 precision
    batch = next(evaluator._sample(policy, "test", 1, 0)).batch
    fused = own.logprobs(batch, AUDIT, "fp32")
    mask = batch.target_mask
    from ablate.eval.kl import token_logprobs

    read = token_logprobs(own.distribution(batch), batch.input_ids[:, 1:], mask)
    assert torch.allclose(fused[mask].double(), read[mask], atol=1e-5)


def test_each_samples_kl_is_its_own_though_the_audit_runs_shortest_first(evaluator, tiny_source, ref_ctx):
    """The audit scores length-sorted, trimmed chunks; every per-sample figure must still land on its own sample:
    recomputed here one response at a time, untrimmed, in float64."""
    from ablate.models.logprobs import next_token_logits

    policy = _moved(tiny_source)
    res = evaluator.evaluate(policy, FullReference(FullRefConfig(), ref_ctx), step=5)
    batches = list(evaluator._sample(policy, "test", 1))
    texts = [t for b in batches for t in b.texts]
    assert [r["policy_response"] for r in res.samples] == texts
    lengths = [n for b in batches for n in b.batch.attention_mask.sum(1).tolist()]
    assert lengths != sorted(lengths)  # the shortest-first order is not the samples' order
    want, nll, tokens = [], [], []
    for b in batches:
        with torch.no_grad():
            lp = torch.log_softmax(next_token_logits(policy, b.batch).double(), -1)
            lq = torch.log_softmax(next_token_logits(evaluator.judge, b.batch).double(), -1)
        mask = b.batch.target_mask
        want += ((lp.exp() * (lp - lq)).sum(-1) * mask).sum(1).tolist()
        sampled = lq.gather(-1, b.batch.input_ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        nll += (-sampled * mask).sum(1).tolist()
        tokens += mask.sum(1).tolist()
    assert [r["kl_true"] for r in res.samples] == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert len(set(round(w, 6) for w in want)) == len(want)  # distinct values: a permutation would show
    # the SFT model's likelihood of each response, and their perplexity under it (the judge is the SFT model)
    assert [r["sft_nll"] for r in res.samples] == pytest.approx(nll, rel=1e-6)
    assert [r["length"] for r in res.samples] == tokens
    assert res.metrics["eval/ppl_sft"] == pytest.approx(math.exp(sum(nll) / sum(tokens)), rel=1e-6)


def test_sft_baseline_is_sampled_once(evaluator):
    a = evaluator.sft_baseline()
    assert evaluator.sft_baseline() is a


def test_no_reference_reports_nan_stand_in_with_reasons(evaluator, tiny_source, ref_ctx):
    from ablate.refs.none import NoneRefConfig, NoReference

    res = evaluator.evaluate(load_model(tiny_source, torch.device("cpu")), NoReference(NoneRefConfig(), ref_ctx), 0)
    m = res.metrics
    assert m["kl/true"] == 0.0
    for key in ("kl_approx", "kl_abs_err", "logp_mae", "logp_rmse", "logp_max_err"):
        assert math.isnan(m[f"kl/{key.removeprefix('kl_')}"]) and "stand-in" in res.nan_reasons[key], key


def test_a_distribution_lost_after_the_first_chunk_is_nan_for_the_whole_evaluation(evaluator, tiny_source, ref_ctx):
    """A regime that has a distribution for some chunks only (``ref=served``: a response the server tokenizes
    otherwise) gives no stand-in divergence at all, with its reason; every other figure as usual."""

    class Partly(FullReference):
        calls = 0

        def _distribution(self, batch):
            Partly.calls += 1
            if Partly.calls > 1:
                raise NotImplementedError("lost after the first chunk")
            return super()._distribution(batch)

    evaluator.cfg.batch_size = 2  # several chunks
    res = evaluator.evaluate(_moved(tiny_source), Partly(FullRefConfig(), ref_ctx), step=5)
    assert Partly.calls == 2 and math.isnan(res.metrics["kl/approx"]) and res.metrics["kl/true"] > 0
    assert res.nan_reasons["kl_approx"] == "lost after the first chunk"
    assert all(math.isnan(r["kl_approx"]) for r in res.samples)


# ------------------------------------------------------------ the run's evaluator: precision and seed
def _run_evaluator(tmp_path, tiny_source, tokenizer, *overrides):
    from ablate.pipeline import make_evaluator
    from tests.conftest import typed_config

    cfg = typed_config(
        tmp_path,
        "model=tiny",
        "eval.n_prompts=4",
        "eval.samples_per_prompt=1",
        "task.max_new_tokens=8",
        "eval.batch_size=4",
        *overrides,
    )
    return make_evaluator(
        cfg,
        judge=load_model(tiny_source, torch.device("cpu")),
        tokenizer=tokenizer,
        prompts=make_prompts(1, 4, 1)["eval"],
        reward=GoldReward(),
        safety=SafetyJudge(),
        device=torch.device("cpu"),
    )


def _bf16_sensitive_policy(tiny_source):
    """The tiny model with logits 10x wider plus a large offset common to every token (1000 times the first
    normalised hidden coordinate): softmax ignores the offset, bf16 rounds the logits to multiples of 4-8 and
    so draws other tokens than fp32 (on the plain tiny model the two samplers happen to agree)."""
    policy = load_model(tiny_source, torch.device("cpu"))
    with torch.no_grad():
        head = policy.get_output_embeddings().weight
        head.mul_(10.0)
        head[:, 0] = 1.0
        policy.model.norm.weight[0] = 1000.0
    return policy


def test_evaluation_samples_are_drawn_in_eval_precision_not_the_policys(tmp_path, tiny_source, tokenizer, ref_ctx):
    """A bf16-trained policy is still sampled in eval.precision (fp32), the precision its KL is scored in:
    the evaluation's samples are the fp32 sampler's, not the bf16 ones (as they were before)."""
    from ablate.models.sampling import sample

    ev = _run_evaluator(tmp_path, tiny_source, tokenizer, "model.precision=bf16")
    assert ev.precision == "fp32"
    policy = _bf16_sensitive_policy(tiny_source)
    res = ev.evaluate(policy, FullReference(FullRefConfig(), ref_ctx), step=0)
    got = [s["policy_response"] for s in res.samples]

    def texts(precision):
        return [
            t
            for b in sample(
                policy,
                tokenizer,
                ev.prompts,
                max_new_tokens=8,
                temperature=ev.task.temperature,
                batch_size=4,
                seed=ev.seed,
                precision=precision,
            )
            for t in b.texts
        ]

    assert got == texts("fp32")
    assert got != texts("bf16")


def test_evaluation_seed_is_derived_from_the_run_seed(tmp_path, tiny_source, tokenizer):
    seeds = {s: _run_evaluator(tmp_path, tiny_source, tokenizer, f"seed={s}").seed for s in (0, 1)}
    assert seeds == {0: 1234, 1: 2234}  # 1234 + 1000 * seed: each run seed its own evaluation noise
    assert _run_evaluator(tmp_path, tiny_source, tokenizer, "seed=1").seed == seeds[1]
    explicit = {_run_evaluator(tmp_path, tiny_source, tokenizer, f"seed={s}", "eval.seed=7").seed for s in (0, 1)}
    assert explicit == {7}  # an explicit eval.seed is honoured for every run


def test_samples_per_prompt_final_and_interim(tiny_source, tokenizer, ref_ctx):
    """The final evaluation draws eval.samples_per_prompt coupled samples per prompt, the interim ones their own
    count; the SFT baseline is drawn with the same keys at each count, so a policy equal to the SFT model has
    reward_delta exactly 0 at both, and the first sample of each prompt is the same at any count (keys (i, 0))."""
    from ablate.config import EvalConfig

    ev = tiny_evaluator(
        tiny_source,
        tokenizer,
        n_heldout=2,
        eval_cfg=EvalConfig(batch_size=4, samples_per_prompt=3, interim_samples_per_prompt=1),
    )
    policy = load_model(tiny_source, torch.device("cpu"))
    ref = FullReference(FullRefConfig(), ref_ctx)
    interim, final = ev.evaluate(policy, ref, step=0, final=False), ev.evaluate(policy, ref, step=0, final=True)
    assert (len(interim.samples), len(final.samples)) == (6, 18) and (interim.final, final.final) == (False, True)
    assert [s["sample"] for s in final.samples[:6]] == [0, 1, 2, 0, 1, 2]
    # with 3 samples per prompt the win rate's opponent is the SFT's sample of the next index: no third draw
    sft = [s["sft_reward"] for s in final.samples]
    assert [s["sft_indep_reward"] for s in final.samples[:3]] == [sft[1], sft[2], sft[0]]
    assert [s["prompt"] for s in final.samples[::3]] == ev.prompts == [s["prompt"] for s in interim.samples]
    assert [s["policy_response"] for s in final.samples[::3]] == [s["policy_response"] for s in interim.samples]
    for res in (interim, final):
        assert res.metrics["eval/reward_delta"] == 0.0  # (the win rate is against independent samples)
    assert len(ev.sft_baseline(3)["texts"]) == 18 and ev.sft_baseline(1)["texts"] == ev.sft_baseline(3)["texts"][::3]


def test_in_fp32_the_audit_reads_the_policys_logits_off_its_sampler(evaluator, tiny_source, ref_ctx, monkeypatch):
    """With the sampler's kept logits the KL audit runs no forward of the policy (one fewer per chunk: counted as
    the forwards without a KV cache, which generate does not make), and every figure is the forward's to float
    rounding."""
    policy = _moved(tiny_source)
    ref = FullReference(FullRefConfig(), ref_ctx)
    assert evaluator.keeps_scores()  # fp32, coupled: the defaults
    full_forwards: list = []
    policy.register_forward_pre_hook(
        lambda _m, _a, kw: full_forwards.append(1) if kw.get("use_cache") is False else None, with_kwargs=True
    )
    kept = evaluator.evaluate(policy, ref, step=5)
    with_kept = len(full_forwards)
    monkeypatch.setattr(evaluator, "keeps_scores", lambda: False)
    ran = evaluator.evaluate(policy, ref, step=5)
    chunks = len(full_forwards) - 2 * with_kept
    assert chunks >= math.ceil(len(evaluator.prompts) / evaluator.cfg.batch_size)
    assert [r["policy_response"] for r in kept.samples] == [r["policy_response"] for r in ran.samples]
    for col in ("kl_true", "kl_k1", "kl_k3", "kl_approx", "sft_nll"):
        assert [r[col] for r in kept.samples] == pytest.approx([r[col] for r in ran.samples], rel=1e-6, abs=1e-9)
    for key, value in ran.metrics.items():
        assert kept.metrics[key] == pytest.approx(value, rel=1e-6, abs=1e-9, nan_ok=True), key
