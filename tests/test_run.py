"""End to end on the tiny model, through the real command line."""

from __future__ import annotations

import json
import math

import pytest
import torch

from ablate.models.precision import native_bf16, resolve
from ablate.tracking.run_dir import SUMMARY_KEYS
from tests.conftest import TINY_FAST, run_cli, run_sweep


@pytest.mark.slow
def test_tiny_dpo_run_end_to_end(tmp_path):
    run_dir = tmp_path / "run"
    args = [a for a in TINY_FAST if a != "logger=none"]
    res = run_cli(*args, "model.precision=auto", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= set(summary)
    assert summary["status"] == "finished" and summary["steps"] == 3
    assert summary["kl_true_step0"] == 0.0  # before training, policy == reference
    assert summary["kl_approx"] == summary["kl_true"]  # ref=full
    assert summary["ref_bytes"] > 0 and summary["ref_ms_per_step"] > 0
    for key in ("win_rate", "reward_gold", "ppl", "length", "distinct_2", "unsafe_rate", "wall_s"):
        assert not math.isnan(summary[key]), key
    # the time split: training and evaluations (3 of them) apart, the evaluations by phase, within the wall time
    assert 0 < summary["train_s"] and 0 < summary["eval_s"]
    assert summary["train_s"] + summary["eval_s"] < summary["wall_s"]
    phases = summary["eval_phases_s"]
    assert {"SFT baseline", "sampling", "KL audit", "perplexity", "fidelity"} <= set(phases)
    assert sum(phases.values()) == pytest.approx(summary["eval_s"], rel=0.05, abs=0.05)
    # metrics.jsonl: one object per logged step, train/ eval/ kl/ cost/ sections
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = set().union(*rows)
    assert {"train/loss", "eval/win_rate", "kl/true", "kl/approx", "cost/ref_bytes"} <= keys
    assert [r["step"] for r in rows if "eval/win_rate" in r] == [0, 2, 3]
    # samples.jsonl: the policy's and the SFT model's responses with their scores
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert [r["step"] for r in samples] == [0] * 4 + [2] * 4 + [3] * 4  # every evaluation's, in order
    assert {"prompt", "policy_response", "sft_response", "policy_reward", "sft_reward", "kl_true"} <= set(samples[0])
    # the resolved config and a W&B offline run
    config = (run_dir / "config.yaml").read_text()
    assert "name: tiny" in config
    # model.precision=auto as this machine settled it, and why
    assert f"precision: {resolve('auto', torch.device('cpu'))[0]}\n" in config and "precision: auto" not in config
    assert summary["provenance"]["bf16"] == native_bf16(torch.device("cpu"))[1]
    assert list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))


@pytest.mark.slow
def test_second_run_reuses_the_cached_pairs(tmp_path):
    for name in ("a", "b"):
        res = run_cli(
            *TINY_FAST, "algo.max_steps=1", "eval.at_start=false", f"hydra.run.dir={tmp_path / name}", cwd=tmp_path
        )
        assert res.returncode == 0, res.stderr[-3000:]
    a = json.loads((tmp_path / "a" / "summary.json").read_text())
    b = json.loads((tmp_path / "b" / "summary.json").read_text())
    assert b["pairs_cache_hit"] is True and a["pairs_cache"] == b["pairs_cache"]


@pytest.mark.slow
def test_bf16_policy_and_reference_agree_at_step_0(tmp_path):
    """A reference must run in the policy's precision: with bf16 autocast, DPO's implicit rewards and the
    true KL are exactly 0 before the first update (a fp32 reference against a bf16 policy gives neither)."""
    run_dir = tmp_path / "run"
    res = run_cli(
        *TINY_FAST,
        "model.precision=bf16",
        "algo.max_steps=1",
        "eval.interval=0",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["kl_true_step0"] == 0.0
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if "train/rewards/chosen" in r)
    assert first["train/rewards/chosen"] == 0.0 and first["train/rewards/rejected"] == 0.0


@pytest.mark.slow
def test_online_algorithms_with_a_learned_reward_end_to_end(tmp_path):
    """PPO and GRPO train on the proxy reward model; gold is logged alongside and used for evaluation."""
    for algo in ("ppo", "grpo"):
        run_dir = tmp_path / algo
        res = run_cli(
            *TINY_FAST,
            f"algo={algo}",
            "algo.batch_size=4",
            "algo.reward=learned",
            "algo.reward_model.epochs=1",
            "algo.max_steps=2",
            "eval.interval=0",
            *(["algo.num_generations=2"] if algo == "grpo" else ["algo.minibatch_size=2"]),
            f"hydra.run.dir={run_dir}",
            cwd=tmp_path,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        s = json.loads((run_dir / "summary.json").read_text())
        assert s["status"] == "finished" and s["steps"] == 2
        assert not math.isnan(s["reward_proxy"]) and not math.isnan(s["reward_gold"])
        assert s["kl_coef_final"] > 0 and s["reward_model_n_pairs"] > 0
        final = [r for r in map(json.loads, (run_dir / "samples.jsonl").read_text().splitlines()) if r["step"] == 2]
        assert s["reward_proxy"] == pytest.approx(sum(r["policy_proxy_reward"] for r in final) / len(final))
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        keys = set().union(*rows)
        gold_key = "train/reward_gold" if algo == "ppo" else "train/rewards/gold/mean"
        assert gold_key in keys, sorted(keys)


@pytest.mark.slow
def test_hf_model_from_a_local_folder(tmp_path, tiny_source):
    """model=hf takes any local folder (a hub id works the same way where a hub is reachable)."""
    run_dir = tmp_path / "run"
    args = [a for a in TINY_FAST if a != "model=tiny"]
    res = run_cli(
        "model=hf",
        f"model.name_or_path={tiny_source.path}",
        "model.precision=fp32",
        *args,
        "algo.max_steps=1",
        "eval.interval=0",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["status"] == "finished" and s["model"] == "hf" and s["kl_true_step0"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dpo", "grpo"])
def test_an_evaluation_at_step_0_leaves_training_and_the_final_evaluation_as_they_were(tmp_path, algo):
    """``eval.at_start`` only adds an evaluation: the evaluator draws from generators of its own, so the run trains
    and ends the same (which is why analysis.load does not split runs by it: seeds with and without it pool)."""
    extra = ["algo.num_generations=2"] if algo == "grpo" else []
    res, folders = run_sweep(
        *TINY_FAST, f"algo={algo}", *extra, "eval.interval=0", "eval.at_start=true,false", sweep=tmp_path / "sweep",
        cwd=tmp_path,
    )  # fmt: skip
    assert res.returncode == 0 and len(folders) == 2, res.stderr[-3000:]
    out = {}
    for at_start, run_dir in zip(("true", "false"), folders):
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        losses = [r["train/loss"] for r in rows if "train/loss" in r]
        final = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
        out[at_start] = (
            losses,
            [r for r in final if r["step"] == 3],
            json.loads((run_dir / "summary.json").read_text()),
        )
    (l_with, s_with, with_), (l_without, s_without, without) = out["true"], out["false"]
    assert len(l_with) == 3 and l_with == l_without
    assert s_with == s_without and len(s_with) == 4
    for key in ("kl_true", "reward_delta", "win_rate", "length", "ppl", "ppl_sft", "rep_2"):
        assert with_[key] == without[key], key
    assert with_["kl_true_step0"] == 0.0 and math.isnan(without.get("kl_true_step0", math.nan))
