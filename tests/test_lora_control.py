"""The control of ``ref=shared``: ``ref=full`` with the same LoRA policy. The adapter-disabled policy is the frozen
SFT model, so the two runs must agree metric for metric; only what the reference costs may differ."""

from __future__ import annotations

import math

import pytest

from ablate.run import run_job
from tests.conftest import TINY_FAST, compose

TINY = [
    *(o for o in TINY_FAST if not o.startswith(("algo.max_steps=", "eval.interval="))),
    "algo=dpo",
    "algo.learning_rate=1e-4",
    "checkpoint.interval=0",
    "model.adapter.enabled=true",
    "algo.max_steps=2",
    "eval.interval=0",
]
#: what a regime's cost and the run's own bookkeeping may change
COST = (
    "ref_",
    "wall_s",
    "train_s",
    "eval_s",
    "eval_phases_s",
    "peak_rss",
    "disk_bytes_written",
    "sft_baseline_cache_hit",
    "pairs_cache_hit",
)


def _run(tmp_path, ref: str) -> dict:
    raw = compose(*TINY, f"ref={ref}")
    raw.out_dir = str(tmp_path / ref)
    summary = run_job(raw)
    assert summary["status"] == "finished"
    return summary


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


@pytest.mark.slow
def test_full_with_the_lora_policy_equals_shared_metric_for_metric(tmp_path):
    shared, full = _run(tmp_path, "shared"), _run(tmp_path, "full")
    metrics = [k for k in shared if not k.startswith(COST) and isinstance(shared[k], int | float | None)]
    assert {"reward_delta", "kl_true", "kl_approx", "margin_err_sd", "grad_cos", "win_rate"} <= set(metrics)
    differ = {k: (shared[k], full.get(k)) for k in metrics if not _same(shared[k], full.get(k))}
    assert not differ
    assert full["ref_bytes"] > 0 == shared["ref_bytes"]


def test_the_adapter_trains_at_a_multiple_of_the_full_fine_tuning_rate(tmp_path):
    import torch

    from ablate.algos.trl_common import common_args
    from tests.conftest import typed_config

    cpu = torch.device("cpu")
    full = typed_config(tmp_path, "model=tiny", "algo.learning_rate=2e-6")
    lora = typed_config(tmp_path, "model=tiny", "algo.learning_rate=2e-6", "model.adapter.enabled=true")
    assert common_args(full, tmp_path, cpu)["learning_rate"] == 2e-6
    assert common_args(lora, tmp_path, cpu)["learning_rate"] == 2e-6 * lora.model.adapter.lr_multiplier > 2e-6
