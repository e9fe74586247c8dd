"""Per-prompt values from each run's ``samples.jsonl`` (the final evaluation's samples), for intervals over
prompts and seeds.

A sample row holds ``step``, ``prompt``, ``sample``, ``policy_reward``, ``sft_reward`` (the SFT model's
coupled sample: same prompt, same sample index, same noise), ``kl_true`` and, in newer runs,
``sft_indep_reward`` (an independent SFT sample, for the win rate). The prompt is the unit: a prompt's samples
are averaged first, giving per prompt

- ``reward_delta``: mean of policy_reward - sft_reward;
- ``win_rate``: mean of win (1 if the policy's reward beats the SFT sample's, 0.5 on a tie, 0 otherwise)
  against ``sft_indep_reward``; older runs without it are scored against the coupled ``sft_reward``, as those
  runs' own win rate was, and say so in ``win_against``;
- ``kl_true``: mean true KL per response.

A missing or null value is NaN, never a made-up number.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ablate.eval.metrics import distinct_n, win_score
from ablate.tracking.run_dir import SAMPLES_FILE

#: the metrics samples.jsonl gives per prompt
PER_PROMPT = ("reward_delta", "win_rate", "kl_true", "length")
INDEPENDENT, COUPLED = "independent SFT samples", "coupled SFT samples (older run)"


def _num(v) -> float:
    return math.nan if v is None else float(v)


def _all_rows(path: str | Path) -> list[dict]:
    f = Path(path) / SAMPLES_FILE
    if not f.is_file():
        return []
    rows = [json.loads(line) for line in f.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [r for r in rows if isinstance(r, dict) and "prompt" in r]


def read_samples(path: str | Path) -> list[dict] | None:
    """The rows of ``samples.jsonl`` of the last evaluation step in it; None when the run folder has none."""
    rows = _all_rows(path)
    if not rows:
        return None
    last = max(int(r.get("step", 0)) for r in rows)
    return [r for r in rows if int(r.get("step", 0)) == last]


def first_response_distinct_2(path: str | Path) -> dict[int, float]:
    """Per evaluation step of the run's ``samples.jsonl``: the distinct word bigrams
    (:func:`ablate.eval.metrics.distinct_n`) over each prompt's first response (``sample`` 0), so that every
    evaluation counts the same number of responses however many it drew; ``{}`` without samples."""
    texts: dict[int, list[str]] = {}
    for r in _all_rows(path):
        if int(r.get("sample", 0)) == 0:
            texts.setdefault(int(r.get("step", 0)), []).append(str(r.get("policy_response", "")))
    return {step: distinct_n(t, 2) for step, t in sorted(texts.items())}


def prompt_values(rows: list[dict]) -> pd.DataFrame:
    """One row per prompt: its number of samples and the mean of each :data:`PER_PROMPT` metric over them."""
    indep = all(r.get("sft_indep_reward") is not None for r in rows)
    per_sample = pd.DataFrame(
        {
            "prompt": [str(r["prompt"]) for r in rows],
            "reward_delta": [_num(r.get("policy_reward")) - _num(r.get("sft_reward")) for r in rows],
            "win_rate": [
                win_score(_num(r.get("policy_reward")), _num(r.get("sft_indep_reward" if indep else "sft_reward")))
                for r in rows
            ],
            "kl_true": [_num(r.get("kl_true")) for r in rows],
            "length": [_num(r.get("length")) for r in rows],
        }
    )
    out = per_sample.groupby("prompt", sort=False).agg(
        n_samples=("reward_delta", "size"), **{m: (m, "mean") for m in PER_PROMPT}
    )
    out["win_against"] = INDEPENDENT if indep else COUPLED
    return out.reset_index()


def prompt_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """Per-prompt values of every finished run that has a ``samples.jsonl``, with its ``path``, ``condition``,
    ``regime`` and ``seed`` (empty frame when none has)."""
    parts = []
    done = runs[runs["status"] == "finished"] if "status" in runs else runs.iloc[0:0]
    for _, run in done.iterrows():
        rows = read_samples(run["path"]) if isinstance(run["path"], str) and Path(run["path"]).is_dir() else None
        if rows:
            part = prompt_values(rows)
            part.insert(0, "seed", run["seed"])
            part.insert(0, "regime", run["regime"])
            part.insert(0, "condition", run["condition"])
            part.insert(0, "path", run["path"])
            parts.append(part)
    if not parts:
        return pd.DataFrame(columns=["path", "condition", "regime", "seed", "prompt", "n_samples", *PER_PROMPT])
    return pd.concat(parts, ignore_index=True)


def by_seed(frame: pd.DataFrame, metric: str) -> dict:
    """seed -> the Series prompt -> value of one run group (the last run of a seed when repeated)."""
    out = {}
    for seed, g in frame.groupby("seed", sort=True):
        last = g[g["path"] == g["path"].iloc[-1]]
        out[seed] = last.set_index("prompt")[metric].astype(float)
    return out


def paired_series(regime: pd.DataFrame, baseline: pd.DataFrame, metric: str) -> dict:
    """seed -> the Series prompt -> difference regime - baseline on the prompts both evaluated (same seed, same
    prompt)."""
    a, b = by_seed(regime, metric), by_seed(baseline, metric)
    out = {}
    for seed in sorted(set(a) & set(b)):
        both = pd.concat([a[seed].rename("r"), b[seed].rename("b")], axis=1, join="inner")
        out[seed] = (both["r"] - both["b"]).astype(float)
    return out


def groups(frame: pd.DataFrame, metric: str) -> list[np.ndarray]:
    """Per seed, one run's per-prompt values of ``metric``."""
    return [s.to_numpy(dtype=float) for s in by_seed(frame, metric).values()]
