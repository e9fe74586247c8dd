"""The benchmark's markdown report and CSV, with each target met or missed (and by how much)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

MIB = 2**20


def _f(x: float, fmt: str = "{:.3g}") -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else fmt.format(x)


def sampling_lines(tp: dict) -> list[str]:
    """The sampling section: each set-up's tokens/s and its fractions of the decode bounds."""
    lines = [
        "",
        "## Sampling against the bounds of decoding",
        "",
        f"Measured memory bandwidth (streaming read): {_f(tp['sample_memory_bandwidth'] / 1e9, '{:.1f}')} GB/s. A "
        "decode step of batch B costs at least 2 x matmul params x B FLOPs at the matmul ceiling (compute) and "
        "the weights plus B sequences' KV cache read at that bandwidth (memory); the slower one binds.",
        "",
        "| set-up | sampler | batch | precision | new tokens | tokens/s | compute bound tok/s | memory bound "
        "tok/s | binds | fraction of the binding bound |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    labels = {"baseline": "today's generate", "harness": "evaluation's sampler", "harness_bf16": "... in bf16"}
    for name, label in labels.items():
        if f"sample_{name}_tokens_per_s" not in tp:
            continue
        g = {k.removeprefix(f"sample_{name}_"): v for k, v in tp.items() if k.startswith(f"sample_{name}_")}.get
        lines.append(
            f"| {label} | {g('sampler')} | {g('batch_size')} | {g('precision')} | {g('max_new_tokens')} | "
            f"{_f(g('tokens_per_s'), '{:.1f}')} | {_f(g('batch_size') / g('bound_compute_s'), '{:.0f}')} | "
            f"{_f(g('batch_size') / g('bound_memory_s'), '{:.0f}')} | {g('bound_bound')} | "
            f"**{_f(g('fraction_of_bound') * 100, '{:.1f}')}%** |"
        )
    if "sample_kept_kept_over_forward" in tp:
        lines += [
            "",
            "The evaluation's policy side, sampling then the policy's logits for the KL audit: with the sampler's "
            f"kept logits ({_f(tp['sample_kept_kept_rows'], '{:.0f}')} rows a generate call, no policy forward) "
            f"{_f(tp['sample_kept_kept_s'], '{:.1f}')} s, with a policy forward per audit chunk "
            f"({_f(tp['sample_kept_forward_rows'], '{:.0f}')} rows a call) {_f(tp['sample_kept_forward_s'], '{:.1f}')} "
            f"s: **{_f(tp['sample_kept_kept_over_forward'], '{:.2f}')}x** (fp32 evaluations keep them).",
        ]
    if "audit_prompts_cached_over_plain" in tp:
        lines += [
            "",
            "The KL audit's judge forwards over the evaluation's "
            f"{_f(tp['audit_prompts_responses'], '{:.0f}')} responses: each chunk's responses on the generate call's "
            f"cached prompts {_f(tp['audit_prompts_cached_s'], '{:.1f}')} s, each chunk's whole rows "
            f"{_f(tp['audit_prompts_plain_s'], '{:.1f}')} s: **{_f(tp['audit_prompts_cached_over_plain'], '{:.2f}')}x** "
            f"(largest logit difference {_f(tp['audit_prompts_max_logit_diff'], '{:.1e}')}; fp32 evaluations cache "
            "them).",
        ]
    return lines


def quantized_embeddings_ratio(rows: pd.DataFrame, regime: str) -> float:
    """``regime``'s bytes held with ``ref.quantize_embeddings=true`` over ``full``'s (NaN without both rows)."""
    if regime not in rows.index or "full" not in rows.index or not rows.loc["full", "bytes_held"]:
        return float("nan")
    return rows.loc[regime, "bytes_held_quantized_embeddings"] / rows.loc["full", "bytes_held"]


def prefetch_lines(c: pd.DataFrame) -> list[str]:
    """A far reference (``ref=served``) asked when training needs it and asked ahead (``ref.prefetch``)."""
    rows = c[c["ahead_step_s"].notna()] if "ahead_step_s" in c else c[:0]
    if rows.empty:
        return []
    lines = [
        "",
        "## A far reference asked ahead",
        "",
        "One pair a step, the batch's pairs in turn, the policy's forward and backward on the pair as the step's own "
        "work: the mean time a training call waited for the reference, asked when the call comes and asked ahead "
        "(`ref.prefetch`: a background thread asks for the next steps while the policy works). Here the server shares "
        "this machine's cores with training; on its own machine it overlaps fully.",
        "",
        "| regime | wait ms / step, on the spot | asked ahead | ahead / spot |",
        "|---|---|---|---|",
    ]
    for _, r in rows.iterrows():
        lines.append(
            f"| `{r['regime']}` | {_f(r['spot_step_s'] * 1000, '{:.1f}')} | {_f(r['ahead_step_s'] * 1000, '{:.1f}')} | "
            f"{_f(r['ahead_step_s'] / r['spot_step_s'], '{:.2f}')} |"
        )
    return lines


def quantized_embeddings_lines(c: pd.DataFrame) -> list[str]:
    """int8 and nf4 side by side with their embedding and LM head in full precision (the default) and quantised
    (``ref.quantize_embeddings=true``): bytes held, against ``full`` (the fp32 truth) and a bf16 full copy."""
    rows = c[c["bytes_held_quantized_embeddings"].notna()] if "bytes_held_quantized_embeddings" in c else c[:0]
    if rows.empty:
        return []
    lines = [
        "",
        "## Quantisation including the embedding",
        "",
        "bitsandbytes quantises Linear layers only; `ref.quantize_embeddings=true` also quantises the token embedding "
        "and the LM head (a quantised Linear: where the two are tied, int8's reads the embedding's int8 rows, 4-bit's "
        "holds a copy of its own). Bytes held, against `full` (fp32) and a bf16 full copy (2 bytes per parameter).",
        "",
        "| regime | embedding and LM head | ref. MiB held | x full | x bf16 |",
        "|---|---|---|---|---|",
    ]
    for _, r in rows.iterrows():
        for label, col in (("full precision", "bytes_held"), ("quantised", "bytes_held_quantized_embeddings")):
            lines.append(
                f"| `{r['regime']}` | {label} | {_f(r[col] / MIB, '{:.1f}')} | {_f(r[f'{col}_vs_full'], '{:.3f}')} | "
                f"{_f(r[col] / r['bf16_copy_bytes'], '{:.3f}')} |"
            )
    return lines


def audit_flops(tp: dict) -> float:
    """The KL audit's matmul work: the judge's forward, 2 x matmul params x the batch's tokens."""
    return 2.0 * tp["matmul_params"] * tp["train_tokens"]


def audit_fraction(audit: dict, tp: dict) -> float:
    """The KL audit's matmul work (:func:`audit_flops`) over its time, against the fp32 matmul ceiling: the float64
    normalisation and sums count as time, not work."""
    if "audit_s" not in audit or "ceiling_fp32" not in tp:
        return float("nan")
    return audit_flops(tp) / audit["audit_s"] / tp["ceiling_fp32"]


def targets(costs: pd.DataFrame, audit: dict, trainers: dict, throughput: dict, notes: dict) -> list[dict]:
    full = costs.set_index("regime")
    rows = []

    def ratio(regime, col):
        if regime not in full.index or "full" not in full.index or not full.loc["full", col]:
            return float("nan")
        return full.loc[regime, col] / full.loc["full", col]

    def add(name, value, op, bound, why=""):
        ok = (value <= bound) if op == "<=" else (value >= bound) if op == ">=" else (value == bound)
        met = "n/a" if isinstance(value, float) and math.isnan(value) else ("met" if ok else "missed")
        by = ""
        if met == "missed" and op in ("<=", ">=") and bound:
            by = f"by {abs(value / bound - 1) * 100:.0f}%"
        rows.append(
            {
                "target": name,
                "measured": value,
                "bound": f"{op} {bound:g}",
                "result": met,
                "by": by,
                "why": why if met == "missed" else "",
            }
        )

    add("int8 reference bytes / full", ratio("int8", "bytes_held"), "<=", 0.35, notes.get("quant", ""))
    add("nf4 reference bytes / full", ratio("nf4", "bytes_held"), "<=", 0.25, notes.get("quant", ""))
    for regime, bound in (("int8", 0.30), ("nf4", 0.20)):
        add(
            f"{regime} reference bytes / full, embeddings quantised (ref.quantize_embeddings=true)",
            quantized_embeddings_ratio(full, regime),
            "<=",
            bound,
            notes.get("quant_embeddings", ""),
        )
    add("cached reference time per step / full", ratio("cached", "step_s"), "<=", 0.05)
    if "full" in full.index and "peak_rss_bytes" in full.columns:
        add(
            "peak RSS of a short default run (ref=full, 2 steps), GB",
            full.loc["full", "peak_rss_bytes"] / 1e9,
            "<=",
            3.0,
            notes.get("memory", ""),
        )
    if "shared" in full.index:
        add("shared: reference weights added (bytes)", float(full.loc["shared", "bytes_held"]), "==", 0.0)
    add("KL audit / one reference forward", audit.get("audit_ratio", float("nan")), "<=", 1.5, notes.get("audit", ""))
    for algo, t in trainers.items():
        add(f"{algo}: harness / stock TRL step time", t["ratio"], "<=", 1.05, notes.get(f"{algo}_trainer", ""))
    add(
        "DPO training, fraction of the bf16 matmul ceiling",
        throughput.get("train_fraction_bf16", float("nan")),
        ">=",
        0.35,
        notes.get("throughput", ""),
    )
    add(
        "sampling: evaluation's sampler / today's generate at batch 8 (tokens/s)",
        throughput.get("sample_harness_over_baseline", float("nan")),
        ">=",
        4.0,
        notes.get("sampling", ""),
    )
    add(
        "sampling: the evaluation's sampler in fp32, fraction of its binding bound",
        throughput.get("sample_harness_fraction_of_bound", float("nan")),
        ">=",
        0.5,
        notes.get("sampling_bound", ""),
    )
    add(
        "KL audit in the evaluation's precision, fraction of the fp32 matmul ceiling",
        audit_fraction(audit, throughput),
        ">=",
        0.5,
        notes.get("audit_bound", ""),
    )
    if "sample_harness_bf16_over_baseline" in throughput:
        add(
            "sampling: the same in bf16 (eval.precision=bf16) / today's generate at batch 8 (tokens/s)",
            throughput["sample_harness_bf16_over_baseline"],
            ">=",
            4.0,
            notes.get("sampling", ""),
        )
    return rows


def write(
    out: Path,
    model: str,
    header: list[str],
    costs: pd.DataFrame,
    audit: dict,
    trainers: dict,
    throughput: dict,
    target_rows: list[dict],
) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    full = costs.set_index("regime").loc["full"] if "full" in set(costs["regime"]) else None
    c = costs.copy()
    for col in ("bytes_held", "step_s", "setup_s", "cache_bytes", "peak_rss_bytes", "peak_rss_train_bytes"):
        c[f"{col}_vs_full"] = c[col] / full[col] if full is not None and full[col] else float("nan")
    if "bytes_held_quantized_embeddings" in c:
        by = full["bytes_held"] if full is not None and full["bytes_held"] else float("nan")
        c["bytes_held_quantized_embeddings_vs_full"] = c["bytes_held_quantized_embeddings"] / by
    c["bytes_held_vs_bf16"] = c["bytes_held"] / c["bf16_copy_bytes"] if "bf16_copy_bytes" in c else float("nan")
    csv = out / f"{model}.csv"
    c.to_csv(csv, index=False)

    lines = [
        f"# Benchmark: {model}",
        "",
        *header,
        "",
        "## Targets",
        "",
        "| target | measured | bound | result | why |",
        "|---|---|---|---|---|",
    ]
    for r in target_rows:
        lines.append(f"| {r['target']} | {_f(r['measured'])} | {r['bound']} | {r['result']} {r['by']} | {r['why']} |")
    lines += [
        "",
        "## Each regime, side by side (ratios to `full`)",
        "",
        "| regime | ref. MiB held | x full | x bf16 | ref. ms / step | x full | setup s | cache MiB | own MiB | peak "
        "RSS MiB, run | peak RSS MiB, training | x full | peak / own |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for _, r in c.iterrows():
        lines.append(
            f"| `{r['regime']}` | {_f(r['bytes_held'] / MIB, '{:.1f}')} | {_f(r['bytes_held_vs_full'], '{:.3f}')} "
            f"| {_f(r['bytes_held_vs_bf16'], '{:.3f}')} | {_f(r['step_s'] * 1000, '{:.1f}')} | "
            f"{_f(r['step_s_vs_full'], '{:.3f}')} | "
            f"{_f(r['setup_s'], '{:.2f}')} | {_f(r['cache_bytes'] / MIB, '{:.2f}')} | "
            f"{_f(r['own_bytes'] / MIB, '{:.0f}')} | "
            f"{_f(r['peak_rss_bytes'] / MIB, '{:.0f}')} | {_f(r['peak_rss_train_bytes'] / MIB, '{:.0f}')} | "
            f"{_f(r['peak_rss_train_bytes_vs_full'], '{:.2f}')} | {_f(r['peak_rss_bytes'] / r['own_bytes'], '{:.2f}')} |"
        )
    lines += [
        "",
        "Peak RSS: one short run per regime in its own process (2 optimiser steps, one evaluation on 2 "
        "prompts); *run* is the process's peak, *training* the peak from the start of training to its end "
        "(models loaded, data ready; Linux VmHWM reset just before). *Own*: what any run of the regime must "
        "hold: fp32 weights, a gradient and two AdamW moments per trainable parameter, and the reference; "
        "*peak / own* is the run's peak over it (the rest: Python and its libraries, activations, the "
        "evaluator's frozen judge, allocator slack). *x bf16*: bytes held over a bf16 full copy's (2 bytes per "
        "parameter; `full` holds fp32, 2x).",
        *quantized_embeddings_lines(c),
        *prefetch_lines(c),
    ]
    lines += [
        "",
        "## The exact KL audit",
        "",
        f"One reference forward as training makes it (token log-probs, training precision): "
        f"{_f(audit['ref_forward_s'] * 1000, '{:.1f}')} ms. The audit (the full reference's "
        f"logits in the evaluation precision, then a float64 log-softmax and KL over the vocabulary, a chunk of "
        f"positions at a time): "
        f"{_f(audit['audit_s'] * 1000, '{:.1f}')} ms = **{_f(audit['audit_ratio'], '{:.2f}')}x**; with the "
        f"policy's own full-vocabulary forward, which the evaluator needs anyway for its other metrics: "
        f"{_f(audit['audit_with_policy_ratio'], '{:.2f}')}x. The same audit with bf16 compute (normalisation "
        f"and sums still in float64): {_f(audit['audit_bf16_ratio'], '{:.2f}')}x.",
        "",
        "## Harness vs stock TRL (same model, data and settings; median s/step, first step of each round untimed)",
        "",
        "| algorithm | harness s/step | stock TRL s/step | harness / TRL | steps timed each |",
        "|---|---|---|---|---|",
    ]
    for algo, t in trainers.items():
        lines.append(
            f"| {algo} | {_f(t['harness_s'], '{:.3f}')} | {_f(t['trl_s'], '{:.3f}')} | "
            f"**{_f(t['ratio'], '{:.3f}')}** | {t['steps_timed']} |"
        )
    tp = throughput
    lines += [
        "",
        "## Throughput against this machine's matmul ceiling",
        "",
        f"- matmul ceiling ({tp['matmul_n']}^3, {tp['threads']} threads): bf16 {_f(tp['ceiling_bf16'] / 1e9, '{:.1f}')} "
        f"GFLOP/s, fp32 {_f(tp['ceiling_fp32'] / 1e9, '{:.1f}')} GFLOP/s",
        f"- DPO training step: {_f(tp['train_flops'] / 1e9, '{:.1f}')} GFLOP of matmuls (6 x {tp['matmul_params'] / 1e6:.1f}M "
        f"matmul parameters x {tp['train_tokens']:.0f} policy tokens + 2 x params x the reference's tokens) in "
        f"{_f(tp['train_step_s'], '{:.2f}')} s = {_f(tp['train_flops_per_s'] / 1e9, '{:.1f}')} GFLOP/s = "
        f"**{_f(tp['train_fraction_bf16'] * 100, '{:.0f}')}%** of the bf16 ceiling "
        f"({_f(tp['train_fraction_fp32'] * 100, '{:.0f}')}% of fp32)",
        f"- KL audit: the judge's forward, {_f(audit_flops(tp) / 1e9, '{:.1f}')} GFLOP "
        f"of matmuls (2 x params x {tp['train_tokens']:.0f} tokens), then float64 arithmetic over the vocabulary, in "
        f"{_f(audit.get('audit_s', float('nan')), '{:.2f}')} s = **{_f(audit_fraction(audit, tp) * 100, '{:.0f}')}%** of "
        "the fp32 ceiling",
        *sampling_lines(tp),
        "",
    ]
    md = out / f"{model}.md"
    md.write_text("\n".join(lines))
    return md, csv
