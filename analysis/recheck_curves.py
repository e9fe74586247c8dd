"""The recheck of a report's ``overoptimisation.csv`` from its runs' ``samples.jsonl``, every evaluation step of them,
without :mod:`analysis.overoptimisation` (its rules restated here): per step, the gold gain (the mean over prompts of
each prompt's mean policy-minus-SFT reward), the true KL, the proxy reward, the share of degenerate responses
(half their word bigrams repeat an earlier one, or none) and the variety (the distinct word bigrams of the responses
with sample index 0 over all their bigrams, over step 0's); per run, the first highest gold gain, the last evaluation
and the first step with at least half the responses degenerate or a variety of at most three quarters; per regime,
the means over seeds with their 95% Student-t intervals and the counts. A figure the samples cannot give (runs older
than the proxy's column) is left unchecked."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.stats import t as scipy_t

from analysis.recheck_base import Findings, _f, mean_of, per_prompt

_WORD = re.compile(r"\w+")
_COLLAPSE, _TEMPLATE = 0.5, 0.75


def _bigrams(text: str) -> list[tuple[str, str]]:
    w = _WORD.findall(str(text).lower())
    return list(zip(w, w[1:]))


def _degenerate(text: str) -> float:
    grams = _bigrams(text)
    return 1.0 if not grams or 1 - len(set(grams)) / len(grams) >= _COLLAPSE else 0.0


def _distinct(texts: list[str]) -> float:
    grams = [g for t in texts for g in _bigrams(t)]
    return len(set(grams)) / len(grams) if grams else math.nan


def _firsts(rows) -> list[str]:
    """Each prompt's first response (sample index 0) among ``rows``."""
    return [str(r.get("policy_response", "")) for r in rows if not r.get("sample")]


def steps(run: Path) -> list[dict]:
    """Per evaluation step of ``run/samples.jsonl``, in step order: ``step, kl, gold, proxy, degenerate, variety``."""
    f = run / "samples.jsonl"
    rows = [json.loads(x) for x in f.read_text(encoding="utf-8").splitlines() if x.strip()] if f.is_file() else []
    rows = [r for r in rows if isinstance(r, dict) and "prompt" in r]
    first_variety = _distinct(_firsts(r for r in rows if int(r.get("step", 0)) == 0))  # with or without a true KL
    out = []
    for step in sorted({int(r.get("step", 0)) for r in rows}):
        at = [r for r in rows if int(r.get("step", 0)) == step]
        proxy = all("policy_proxy_reward" in r for r in at)
        kl = mean_of(per_prompt(at, lambda r: _f(r["kl_true"])).values())
        if not math.isfinite(kl):
            continue  # an evaluation without a true KL is no point of the curve (as the report reads it)
        out.append(
            {
                "step": float(step),
                "kl": kl,
                "gold": mean_of(per_prompt(at, lambda r: _f(r["policy_reward"]) - _f(r["sft_reward"])).values()),
                "proxy": math.fsum(_f(r["policy_proxy_reward"]) for r in at) / len(at) if proxy else math.nan,
                "degenerate": math.fsum(_degenerate(r.get("policy_response", "")) for r in at) / len(at),
                "variety": _distinct(_firsts(at)) / first_variety,
            }
        )
    first_proxy = out[0]["proxy"] if out and out[0]["step"] == 0 else math.nan
    for s in out:
        s["proxy"] -= first_proxy
    return out


def _run(evals: list[dict]) -> dict:
    gold = [e["gold"] for e in evals]
    peak, end = evals[int(np.nanargmax(gold))], evals[-1]
    hit = [e["step"] for e in evals if e["degenerate"] >= _COLLAPSE or e["variety"] <= _TEMPLATE]
    return {
        "end_kl": end["kl"],
        "end_gold": end["gold"],
        "end_proxy": end["proxy"],
        "end_degenerate": end["degenerate"],
        "end_variety": end["variety"],
        "peak_gold": peak["gold"],
        "peak_kl": peak["kl"],
        "peak_step": peak["step"],
        "early": peak["step"] < end["step"],
        "collapse": hit[0] if hit else math.nan,
    }


def _t(values: list[float]) -> tuple[float, float, float]:
    x = np.array([v for v in values if math.isfinite(v)], dtype=np.float64)
    if len(x) == 0:
        return math.nan, math.nan, math.nan
    if len(x) < 2:
        return float(x.mean()), math.nan, math.nan
    half = scipy_t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x))
    return float(x.mean()), float(x.mean() - half), float(x.mean() + half)


def _paired(what: str, row, mine: dict, base: dict, found: Findings, rtol: float) -> None:
    """The row's comparison with the baseline's runs of the same seeds: ratios on the log scale, differences."""
    seeds = sorted(set(mine) & set(base))
    found.compare(f"{what}: seeds paired", _f(row["n_paired"]), float(len(seeds)), rtol)
    for col, kind in (("end_kl", "ratio"), ("peak_kl", "ratio"), ("end_gold", "difference"),
                      ("end_degenerate", "difference"), ("end_variety", "difference")):  # fmt: skip
        if kind == "ratio":
            logs = [math.log(mine[s][col] / base[s][col]) for s in seeds if mine[s][col] > 0 and base[s][col] > 0]
            again = tuple(math.exp(v) for v in _t(logs))
        else:
            again = _t([mine[s][col] - base[s][col] for s in seeds])
        for suffix, v in zip(("", "_lo", "_hi"), again):
            found.compare(f"{what}: {col}_{kind}{suffix}", _f(row[f"{col}_{kind}{suffix}"]), v, rtol)


def recheck_overoptimisation(
    runs: pd.DataFrame, report: Path, found: Findings, rtol: float, baseline: str = "full"
) -> None:
    """Each row of ``report/overoptimisation.csv`` against its runs' samples (finished and diverged runs, as the
    report's section reads them), and its comparison with ``baseline`` where it has one."""
    table = report / "overoptimisation.csv"
    if not table.is_file():
        return
    ended = runs[runs["status"].isin(["finished", "diverged"])]

    def by_seed(condition: str, regime: str) -> dict:
        g = ended[(ended["condition"].astype(str) == condition) & (ended["regime"] == regime)]
        return {int(seed): steps(Path(p)) for seed, p in zip(g["seed"], g["path"])}

    for _, row in pd.read_csv(table).iterrows():
        what = f"overoptimisation: {row['condition']}: {row['regime']}"
        evals = by_seed(str(row["condition"]), row["regime"])
        per_run = [_run(e) for e in evals.values() if e]
        if len(per_run) != len(evals) or not per_run:
            found.errors.append(f"{what}: {len(evals) - len(per_run)} of its {len(evals)} runs have no samples")
            continue
        if "n_paired" in row and math.isfinite(_f(row["n_paired"])):
            base = {s: _run(e) for s, e in by_seed(str(row["condition"]), baseline).items() if e}
            _paired(what, row, {s: _run(e) for s, e in evals.items()}, base, found, rtol)
        found.rows += 1
        found.compare(f"{what}: seeds", _f(row["n_seeds"]), float(len(per_run)), rtol)
        for col in ("end_kl", "end_gold", "end_proxy", "end_degenerate", "end_variety", "peak_gold", "peak_kl",
                    "peak_step"):  # fmt: skip
            values = [r[col] for r in per_run]
            if col == "end_proxy" and not all(math.isfinite(v) for v in values):
                continue  # runs older than the proxy's column in the samples
            for suffix, again in zip(("", "_lo", "_hi"), _t(values)):
                found.compare(f"{what}: {col}{suffix}", _f(row[f"{col}{suffix}"]), again, rtol)
        found.compare(f"{what}: peaked early", _f(row["peaked_early"]), float(sum(r["early"] for r in per_run)), rtol)
        collapsed = [r["collapse"] for r in per_run if math.isfinite(r["collapse"])]
        found.compare(f"{what}: collapsed", _f(row["collapsed"]), float(len(collapsed)), rtol)
        found.compare(f"{what}: collapse step", _f(row["collapse_step"]), mean_of(collapsed), rtol)
