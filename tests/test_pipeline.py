"""The audit at an evaluation step, and the final one, is against the reference the last step trained with:
the reference is stepped after the evaluation, and never after the final optimiser step."""

from __future__ import annotations

import json

import pytest

from ablate.run import run_job
from tests.conftest import TINY_FAST, compose

# TINY_FAST's task (so the session's cached pairs are reused): 3 DPO steps, evaluations at 0, 2 and 3
TINY = [*TINY_FAST, "algo=dpo", "algo.learning_rate=1e-3", "checkpoint.interval=0"]


@pytest.mark.slow
def test_snapshot_audits_the_reference_each_step_trained_with(tmp_path):
    """ref=snapshot with tau=1: step s trains against the policy after step s-1. An evaluation after step s
    must audit that reference (one update fewer than steps taken, and not the policy itself: KL > 0)."""
    raw = compose(*TINY, "ref=snapshot", "ref.tau=1")
    raw.out_dir = str(tmp_path / "run")
    summary = run_job(raw)
    assert summary["status"] == "finished" and summary["steps"] == 3
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    evals = {r["step"]: r for r in rows if "kl/approx" in r}
    assert sorted(evals) == [0, 2, 3]
    assert evals[0]["kl/approx"] == 0.0  # before training the reference is the policy
    # at step 2: the reference of step 2 is the snapshot taken after step 1 (before: after step 2, the policy)
    assert evals[2]["cost/ref_updates"] == 1 and evals[2]["kl/approx"] > 0
    # at the end: the snapshot taken after step 2, which step 3 trained with; no update after the last step
    assert evals[3]["cost/ref_updates"] == 2 and evals[3]["kl/approx"] > 0
    assert summary["ref_updates"] == 2


@pytest.mark.slow
def test_checkpoints_by_policy_and_the_bytes_they_cost(tmp_path):
    """checkpoint.interval=1 with keep: steps 1 and 2 are saved then pruned, the last step's is kept, and
    ``disk_bytes_written`` counts all three (the kernel's count of what the job wrote). The default policy
    (by wall time, 10 minutes) saves nothing in a run this short."""
    raw = compose(*TINY, "ref=full", "checkpoint.interval=1", "checkpoint.keep=true")
    raw.out_dir = str(tmp_path / "kept")
    summary = run_job(raw)
    kept = tmp_path / "kept" / "checkpoints"
    assert sorted(p.name for p in kept.glob("checkpoint-*")) == ["checkpoint-3"]
    one = sum(f.stat().st_size for f in (kept / "checkpoint-3").rglob("*") if f.is_file())
    assert summary["disk_bytes_written"] >= 3 * one > 0
    raw = compose(*[o for o in TINY if not o.startswith("checkpoint.")], "ref=full")
    raw.out_dir = str(tmp_path / "default")
    lean = run_job(raw)
    assert lean["disk_bytes_written"] < one  # no checkpoint written
    assert lean["sft_baseline_cache_hit"] is True  # the first run's SFT baseline, sampled once


def test_algorithms_are_looked_up_in_a_registry():
    """The pipeline picks the trainer from the registry (no if/elif on algorithm names); DPO trains on the pairs,
    the online algorithms do not."""
    import pytest

    from ablate.algos.registry import algorithm
    from ablate.errors import ConfigError

    dpo, grpo, ppo = algorithm("dpo"), algorithm("grpo"), algorithm("ppo")
    assert dpo.needs_pairs and not any(a.needs_pairs for a in (grpo, ppo))
    with pytest.raises(ConfigError, match="unknown algorithm 'sft'"):
        algorithm("sft")


def test_the_run_reads_top_to_bottom():
    """No function in pipeline.py or run.py is longer than about 50 lines, and neither names an algorithm."""
    import ast
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "ablate"
    for name in ("pipeline.py", "run.py"):
        source = (root / name).read_text()
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 55, f"{name}: {node.name} is too long"
        assert '"dpo"' not in source and '"grpo"' not in source and '"ppo"' not in source, name


@pytest.mark.slow
def test_the_final_evaluation_draws_samples_per_prompt_and_the_others_the_interim_count(tmp_path):
    raw = compose(*TINY, "ref=full", "eval.samples_per_prompt=2", "eval.interim_samples_per_prompt=1")
    raw.out_dir = str(tmp_path / "run")
    summary = run_job(raw)
    every = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    samples = [s for s in every if s["step"] == 3]  # each evaluation keeps its samples: step 0's first
    assert summary["status"] == "finished" and len(samples) == 2 * raw.eval.n_prompts
    assert [s["sample"] for s in samples[:4]] == [0, 1, 0, 1] and every[0]["step"] == 0
    assert len([s for s in every if s["step"] == 0]) == raw.eval.n_prompts  # interim: one sample each
    assert summary["reward_delta_step0"] == 0.0  # step 0 (interim, one sample each): the SFT model's responses


def test_the_training_state_is_released_before_the_final_evaluation():
    """After the last step the optimiser's moments and the gradients are dropped (the torch optimiser inside
    Accelerate's wrapper): the final evaluation of a full fine-tune does not hold twice its weights for
    nothing. Training could not go on without them; nothing after training reads them."""
    from types import SimpleNamespace

    import torch

    from ablate.pipeline import release_training_state

    model = torch.nn.Linear(64, 32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    weights = sum(p.numel() * 4 for p in model.parameters())
    # as Accelerate's AcceleratedOptimizer holds it (building a real one needs a process-wide Accelerator state)
    trainer = SimpleNamespace(optimizer=SimpleNamespace(optimizer=opt), model=model)
    freed = release_training_state(trainer)
    assert freed >= 3 * weights  # two moments and a gradient per parameter (and AdamW's step counters)
    assert not opt.state and all(p.grad is None for p in model.parameters())
    assert release_training_state(SimpleNamespace()) == 0  # a trainer without them: nothing to do
