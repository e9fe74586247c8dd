"""The SFT baseline cache: a second evaluator with the same settings samples nothing and gets the same numbers;
any change to what the responses depend on is a miss; a corrupted entry is rebuilt."""

from __future__ import annotations

import shutil

import pytest
import torch

from ablate.config import EvalConfig, TaskConfig
from ablate.eval.baseline_cache import BASELINE_FILE, KIND
from ablate.eval.evaluator import Evaluator
from ablate.models.decode import NAME as DECODER
from ablate.models.loading import load_model
from ablate.stop_rule import RULE
from ablate.tasks.prompts import make_prompts
from ablate.tasks.reward import GoldReward
from ablate.tasks.safety import SafetyJudge
from tests.conftest import tiny_evaluator

CPU = torch.device("cpu")
PROMPTS = make_prompts(1, 4, 1)["eval"]


class CountingJudge:
    """The tiny SFT model with a forward hook that counts its forward calls (each sampled token is one)."""

    def __init__(self, tiny_source):
        self.model = load_model(tiny_source, CPU)
        self.calls = 0
        self.model.register_forward_hook(self._count)

    def _count(self, *_):
        self.calls += 1


def _evaluator(tiny_source, tokenizer, judge, cache_root, *, prompts=PROMPTS, max_new_tokens=6, **eval_kw):
    eval_kw.setdefault("batch_size", 4)
    eval_kw.setdefault("samples_per_prompt", 1)
    return tiny_evaluator(
        tiny_source,
        tokenizer,
        n_heldout=2,
        judge=judge.model,
        prompts=prompts,
        eval_cfg=EvalConfig(**eval_kw),
        task_cfg=TaskConfig(max_new_tokens=max_new_tokens),
        cache_root=cache_root,
        model_fingerprint=None if cache_root is None else tiny_source.fingerprint,
    )


def _entries(cache_root):
    folder = cache_root / KIND
    return sorted(p for p in folder.iterdir() if not p.name.startswith(".")) if folder.exists() else []


@pytest.fixture(scope="module")
def _filled(tiny_source, tokenizer, tmp_path_factory):
    """A cache holding one baseline, filled by a miss (sampled once for the module)."""
    root = tmp_path_factory.mktemp("baseline_cache")
    judge = CountingJudge(tiny_source)
    ev = _evaluator(tiny_source, tokenizer, judge, root)
    base = ev.sft_baseline()
    assert ev.baseline_cache_hit is False and judge.calls > 0
    return base, root


@pytest.fixture
def first(_filled, tmp_path):
    """The cached baseline, and a copy of the cache holding it that the test may change."""
    base, root = _filled
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    return base, tmp_path


def _same(a: dict, b: dict) -> bool:
    """Two baselines: the same texts, rewards and unsafe probabilities, and the same token batches, exactly."""
    scores = lambda d: {k: v for k, v in d.items() if k != "batches"}  # noqa: E731
    tensors = lambda d: [  # noqa: E731
        (x.prompts, x.texts, x.lengths, x.truncated, x.batch.input_ids.tolist(), x.batch.completion_mask.tolist())
        for x in d["batches"]
    ]
    return scores(a) == scores(b) and tensors(a) == tensors(b)


def test_a_second_evaluator_loads_the_baseline_without_sampling(first, tiny_source, tokenizer):
    base, root = first
    judge = CountingJudge(tiny_source)
    ev = _evaluator(tiny_source, tokenizer, judge, root)
    again = ev.sft_baseline()
    assert ev.baseline_cache_hit is True
    assert judge.calls == 0  # nothing sampled: the judge never ran
    assert _same(again, base)  # texts, rewards, unsafe probabilities and token batches, exactly (JSON, torch.save)
    assert len(again["texts"]) == len(PROMPTS) and len(_entries(root)) == 1


def test_at_step_0_a_policy_that_is_the_sft_model_reads_the_cached_token_batches(
    first, tiny_source, tokenizer, ref_ctx
):
    """Nothing is sampled: the policy never runs, and the judge (standing in for it) runs once per chunk of the audit
    and once for the perplexity; the responses are the cached baseline's."""
    from ablate.refs.full import FullRefConfig, FullReference

    base, root = first
    judge = CountingJudge(tiny_source)
    ev = _evaluator(tiny_source, tokenizer, judge, root)
    assert ev.sft_baseline()["batches"] is not None and ev.baseline_cache_hit is True
    ev.sft_baseline(1, independent=True)  # the win rate's opponent: another draw, not the one reused
    policy = CountingJudge(tiny_source)
    judge.calls = 0
    res = ev.evaluate(policy.model, FullReference(FullRefConfig(), ref_ctx), step=0)
    assert policy.calls == 0 and judge.calls == 2
    assert [r["policy_response"] for r in res.samples] == base["texts"] and res.metrics["kl/true"] == 0.0


def test_cached_values_equal_an_uncached_evaluators(first, tiny_source, tokenizer):
    base, _ = first
    ev = _evaluator(tiny_source, tokenizer, CountingJudge(tiny_source), None)
    assert _same(ev.sft_baseline(), base) and ev.baseline_cache_hit is None


@pytest.mark.parametrize(
    "change",
    [
        {"seed": 99},
        {"max_new_tokens": 5},
        {"prompts": PROMPTS[:3]},
        {"sampler": "multinomial"},
        {"precision": "bf16"},
    ],
    ids=lambda c: next(iter(c)),
)
def test_a_change_of_any_key_input_is_a_miss(first, tiny_source, tokenizer, change):
    _, root = first
    judge = CountingJudge(tiny_source)
    ev = _evaluator(tiny_source, tokenizer, judge, root, **change)
    ev.sft_baseline()
    assert ev.baseline_cache_hit is False and judge.calls > 0
    assert len(_entries(root)) == 2  # a second entry beside the first, which is untouched


def test_the_rows_per_generate_call_are_in_the_key_and_the_audit_batch_is_not(tiny_source, tokenizer, tmp_path):
    def key(**kw):
        return _evaluator(tiny_source, tokenizer, CountingJudge(tiny_source), tmp_path, **kw).baseline_key()

    assert key(batch_size=4) == key(batch_size=2)  # the audit's batch does not change what is sampled
    for sampler in ("coupled", "multinomial"):  # a matmul's rounding depends on its rows; the RNG stream too
        assert key(sampler=sampler, sample_batch_size=4) != key(sampler=sampler, sample_batch_size=2)
    assert key(sample_batch_size=None)["sampling"]["batch_size"] == len(PROMPTS)  # memory-sized: all fit


def test_the_safety_threshold_is_not_in_the_key_but_the_judges_identities_are(tiny_source, tokenizer, tmp_path):
    ev = _evaluator(tiny_source, tokenizer, CountingJudge(tiny_source), tmp_path)
    key = ev.baseline_key()
    ev.safety = SafetyJudge(0.9)  # only which probabilities count as unsafe changes, not the probabilities
    assert ev.baseline_key() == key
    assert key["safety"] == SafetyJudge.ID and key["reward"] == GoldReward.ID
    assert key["sampling"] == {
        "max_new_tokens": 6,
        "temperature": 1.0,
        "samples_per_prompt": 1,
        "batch_size": ev.rows(1),
        "seed": ev.seed,
        "precision": "fp32",
        "sampler": "coupled",
        "device": "cpu",
        "max_sentences": 1,  # the task's stop rule
        "stop_rule": RULE,
        "decoder": DECODER,  # the coupled sampler's decode: its rounding, not generate's
    }


def test_the_key_does_not_depend_on_how_the_tokenizer_was_used(tiny_source, tmp_path):
    from ablate.models.loading import load_tokenizer

    tok = load_tokenizer(tiny_source)  # fresh: the session's tokenizer has padded batches already
    ev = _evaluator(tiny_source, tok, CountingJudge(tiny_source), tmp_path)
    key = ev.baseline_key()
    tok(["a padded", "batch of two"], padding=True, truncation=True, max_length=3)  # leaves its settings behind
    assert tok.backend_tokenizer.padding is not None
    assert ev.baseline_key() == key
    # at the source: the fingerprint every cache keys on ignores the padding/truncation settings left behind
    from ablate.models.loading import tokenizer_fingerprint

    assert tokenizer_fingerprint(tok) == tokenizer_fingerprint(load_tokenizer(tiny_source))


def test_a_corrupted_entry_is_detected_and_rebuilt(first, tiny_source, tokenizer):
    base, root = first
    (entry,) = _entries(root)
    (entry / BASELINE_FILE).write_text('{"prompt": "x", "text": "tampered", "reward": 1.0, "unsafe": 0.0}\n')
    judge = CountingJudge(tiny_source)
    ev = _evaluator(tiny_source, tokenizer, judge, root)
    assert _same(ev.sft_baseline(), base)
    assert ev.baseline_cache_hit is False and judge.calls > 0  # sampled again, not served the tampered file
    again = _evaluator(tiny_source, tokenizer, CountingJudge(tiny_source), root)
    assert _same(again.sft_baseline(), base) and again.baseline_cache_hit is True  # the rebuilt entry verifies


def test_caching_needs_the_judges_fingerprint(tiny_model, tokenizer, tmp_path):
    with pytest.raises(ValueError, match="model_fingerprint"):
        Evaluator(
            judge=tiny_model,
            tokenizer=tokenizer,
            prompts=PROMPTS,
            heldout=[],
            reward=GoldReward(),
            safety=SafetyJudge(),
            eval_cfg=EvalConfig(),
            task_cfg=TaskConfig(),
            run_seed=0,
            device=CPU,
            cache_root=tmp_path,
        )


def test_the_runs_evaluator_caches_under_the_runs_cache_root(tiny_source, tokenizer, tmp_path):
    from ablate.pipeline import make_evaluator
    from tests.conftest import typed_config

    cfg = typed_config(tmp_path, "model=tiny", "eval.n_prompts=4", "task.max_new_tokens=6", "eval.batch_size=4")
    ev = make_evaluator(
        cfg,
        judge=CountingJudge(tiny_source).model,
        tokenizer=tokenizer,
        prompts=PROMPTS,
        reward=GoldReward(),
        safety=SafetyJudge(),
        device=CPU,
        cache_root=tmp_path / "cache",
        model_fingerprint=tiny_source.fingerprint,
    )
    assert ev.cache_root == tmp_path / "cache" and ev.model_fingerprint == tiny_source.fingerprint
