"""Synthetic sweep folders for the statistics tests: run folders written as a run writes them (config.yaml,
summary.json, metrics.jsonl, samples.jsonl), with per-prompt numbers chosen by the test. No model runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ablate.tracking.run_dir import SUMMARY_KEYS, RunFolder


def samples(seed: int, n_prompts: int, k: int = 2, shift: float = 0.0, kl: float = 1.0, noise: float = 0.2) -> list:
    """Coupled samples of one run: the SFT rewards and prompt effects depend on ``seed`` only (so two regimes of
    one seed share them: paired); the policy's reward is the SFT sample's plus ``shift`` plus noise."""
    rng = np.random.default_rng(seed)
    rows = []
    for p in range(n_prompts):
        effect = rng.normal(0, noise)
        for i in range(k):
            sft = float(rng.uniform(-1, 1))
            rows.append(
                {
                    "step": 4,
                    "prompt": f"review of film {p}",
                    "sample": i,
                    "policy_reward": sft + effect + float(rng.normal(0, noise)),
                    "sft_reward": sft,
                    "sft_indep_reward": float(rng.uniform(-1, 1)),
                    "kl_true": kl * float(rng.lognormal(0, 0.3)),
                    "length": 20.0 + p % 5 + i,
                }
            )
    for r in rows:
        r["policy_reward"] += shift
    return rows


def write_run(
    root: Path,
    regime: str,
    seed: int,
    rows: list | None = None,
    status: str = "finished",
    reason: str = "",
    config: dict | None = None,
    **summary,
) -> Path:
    """One run folder ``root/ref=<regime>,seed=<seed>``: summary values from ``rows`` (or ``summary``), a short
    curve, and ``samples.jsonl`` when ``rows`` is given; ``config`` adds to its config.yaml's groups."""
    folder = RunFolder(root / f"ref={regime},seed={seed}")
    cfg = {"ref": {"name": regime}, "algo": {"name": "dpo"}, "model": {"name": "tiny"}, "seed": seed}
    for group, values in (config or {}).items():  # e.g. {"algo": {"beta": 0.3}}
        cfg[group] = {**cfg.get(group, {}), **values}
    folder.write_config(cfg)
    if status == "unfinished":
        return folder.path
    s = {k: 0.5 for k in SUMMARY_KEYS}
    s.update(status=status, reason=reason, steps=4, regime=regime, algo="dpo", model="tiny", seed=seed)
    if rows:
        s["reward_delta"] = float(np.mean([r["policy_reward"] - r["sft_reward"] for r in rows]))
        s["kl_true"] = float(np.mean([r["kl_true"] for r in rows]))
        s["win_rate"] = float(np.mean([r["policy_reward"] > r["sft_indep_reward"] for r in rows]))
        folder.write_samples(rows)
    s.update(summary)
    folder.write_summary(s)
    for step in (0, 2, 4):
        folder.log_metrics(
            step,
            {"kl/true": 0.1 * step + 0.01 * seed, "eval/reward_gold": 0.1, "eval/win_rate": 0.5, "train/loss": 0.69},
        )
    return folder.path
