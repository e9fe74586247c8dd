"""End to end on the real SmolLM2-135M-Instruct (converted from the wheel's GGUF): a few DPO steps."""

from __future__ import annotations

import json
import math

import pytest

from ablate.tracking.run_dir import SUMMARY_KEYS
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_smollm2_dpo_few_steps(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli("model=smollm2", "algo.max_steps=2", "algo.batch_size=2", "algo.learning_rate=2e-5",
                  "task.n_train=6", "task.n_eval=6", "task.max_new_tokens=24", "task.samples_per_prompt=3",
                  "eval.interval=0", "eval.batch_size=6", f"hydra.run.dir={run_dir}", cwd=tmp_path, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= set(s) and s["status"] == "finished" and s["steps"] == 2
    assert s["kl_true_step0"] == 0.0
    assert s["kl_true"] > 0 and s["kl_approx"] == s["kl_true"]
    # a real pretrained model: fluent text has low perplexity (random weights give ~50,000)
    assert 2 < s["ppl"] < 200
    assert s["ref_bytes"] > 500e6  # a full fp32 copy of 134.5M parameters
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sum(len(x["policy_response"].split()) for x in samples) > 20
    assert not math.isnan(s["win_rate"])
