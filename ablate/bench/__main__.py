"""``python -m ablate.bench [overrides]``: every regime's cost side by side in one process, as ratios to
``full``; the KL audit's cost; harness vs stock TRL step time; throughput against the matmul ceiling; peak
memory per regime. Configured by ``conf/bench.yaml`` (Hydra overrides, e.g. ``model=tiny repeats=3``);
writes ``<out>/<model>.md`` and ``<out>/<model>.csv``."""

from __future__ import annotations

import logging
import shlex
import sys
import time
from pathlib import Path

import torch

from ablate.bench.config import compose_bench, error_line, run_configs
from ablate.bench.pieces import Pieces, build_pieces
from ablate.tasks.pair_tokens import pair_batches

log = logging.getLogger("ablate.bench")
RUN_GROUPS = ("model", "task", "algo")  # the run's config groups the bench takes as they are


def throughput(policy, pieces: Pieces, cfg, batch, dpo_step_s: float, matmul_n: int) -> dict:
    """DPO training's matmul throughput against the machine's ceiling, and sampling side by side
    (:mod:`ablate.bench.sampling`) against the bounds that apply to decoding."""
    from ablate.bench.sampling import kept_logits_side_by_side, prompt_cache_side_by_side, sampling_side_by_side
    from ablate.bench.timing import matmul_ceiling, matmul_params

    n = matmul_params(policy)
    bf16, fp32 = matmul_ceiling(torch.bfloat16, matmul_n), matmul_ceiling(torch.float32, matmul_n)
    tokens = float(batch.attention_mask.sum())
    ref_tokens = tokens  # the reference forward in each step sees the same sequences
    flops = 6.0 * n * tokens + 2.0 * n * ref_tokens
    sampling = sampling_side_by_side(
        policy, pieces.tokenizer, pieces.prompts, cfg, matmul_params=n, ceilings={"bf16": bf16, "fp32": fp32}
    )
    return {
        "matmul_n": matmul_n,
        "threads": torch.get_num_threads(),
        "ceiling_bf16": bf16,
        "ceiling_fp32": fp32,
        "matmul_params": n,
        "train_tokens": tokens,
        "train_flops": flops,
        "train_step_s": dpo_step_s,
        "train_flops_per_s": flops / dpo_step_s,
        "train_fraction_bf16": flops / dpo_step_s / bf16,
        "train_fraction_fp32": flops / dpo_step_s / fp32,
        **{f"sample_{k}": v for k, v in sampling.items()},
        **{
            f"sample_kept_{k}": v
            for k, v in kept_logits_side_by_side(policy, pieces.tokenizer, pieces.prompts, cfg).items()
        },
        **{
            f"audit_prompts_{k}": v
            for k, v in prompt_cache_side_by_side(policy, pieces.tokenizer, pieces.prompts, cfg).items()
        },
    }


def _own_gb(frame) -> str:
    """``ref=full``'s own bytes (ablate.bench.costs.own_bytes) in GB, as text."""
    rows = frame.set_index("regime")
    return f"{rows.loc['full', 'own_bytes'] / 1e9:.2f}" if "full" in rows.index else "n/a"


def usage() -> str:
    """What ``--help`` prints: what the bench does and its settings with their defaults (``conf/bench.yaml``)."""
    from dataclasses import fields

    from ablate.bench.config import BenchConfig

    defaults = compose_bench([])
    own = [f"  {f.name}={getattr(defaults, f.name)}" for f in fields(BenchConfig) if f.name not in RUN_GROUPS]
    return "\n".join(
        [
            "usage: python -m ablate.bench [key=value ...]",
            "",
            __doc__.strip(),
            "",
            "settings (conf/bench.yaml), with their defaults:",
            *own,
            "and any run override: model=..., task=..., algo=... (e.g. model=tiny: seconds)",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    import pandas as pd

    from ablate.bench import costs as costs_mod
    from ablate.bench import report
    from ablate.bench.peak_memory import peak_rss
    from ablate.bench.trainers import harness_vs_trl
    from ablate.runtime import tune_allocator
    from ablate.tracking.provenance import provenance

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    overrides = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(overrides):
        print(usage())
        return 0
    try:
        bench = compose_bench(overrides)
        configs = run_configs(bench.regimes, overrides)
    except Exception as e:  # bad input (and Hydra's composition errors): one line
        return error_line("ablate.bench", e)
    tune_allocator()
    if bench.threads:
        torch.set_num_threads(bench.threads)
    t_start = time.perf_counter()
    base = configs.get("full") or next(iter(configs.values()))
    pieces = build_pieces(base)
    B = base.algo.batch_size
    batch = pair_batches(pieces.tokenizer, pieces.pairs[:B], B, getattr(base.algo, "max_length", None))[0]
    batch = batch.to(pieces.device)

    costs, refs = costs_mod.regime_costs(configs, pieces, batch, bench.repeats)
    frame = pd.DataFrame([vars(c) for c in costs])
    if bench.peak_memory:
        keep = [o for o in overrides if o.split("=")[0].split(".")[0] in ("model", "task", "algo", "seed")]
        peaks = {r: peak_rss(r, keep, bench.threads) for r in bench.regimes}
        frame["peak_rss_bytes"] = [peaks[r][0] for r in frame["regime"]]
        frame["peak_rss_train_bytes"] = [peaks[r][1] for r in frame["regime"]]
        frame["peak_rss_note"] = [peaks[r][2] for r in frame["regime"]]
    else:
        frame["peak_rss_bytes"] = frame["peak_rss_train_bytes"] = float("nan")

    policy = pieces.load()
    full_ref = refs.get("full") or costs_mod.build_regime(configs["full"], pieces)[0]
    audit = costs_mod.audit_cost(full_ref, policy, batch, base.eval.precision, bench.repeats)
    refs.clear()

    trainers = {}
    for algo in bench.trainers:
        cfg = run_configs(["full"], [*overrides, f"algo={algo}", f"algo.max_steps={bench.trainer_steps}"])["full"]
        log.info(
            "bench: %s, harness vs stock TRL, %d rounds of %d steps", algo, bench.trainer_rounds, bench.trainer_steps
        )
        trainers[algo] = harness_vs_trl(algo, cfg, pieces, bench.trainer_rounds)
    dpo_step = trainers["dpo"]["harness_s"] if "dpo" in trainers else float("nan")
    tp = throughput(policy, pieces, base, batch, dpo_step, bench.matmul_size)

    full_bytes = float(frame.set_index("regime").loc["full", "bytes_held"]) if "full" in set(frame["regime"]) else 0
    emb = policy.get_input_embeddings().weight
    emb_share = emb.numel() * emb.element_size() / full_bytes if full_bytes else float("nan")
    notes = {
        "quant": f"bitsandbytes quantises Linear layers only: the token embedding (tied to the LM head) stays in "
        f"full precision and is {emb_share:.0%} of the full reference's bytes",
        "audit": f"the audit runs the reference in eval.precision={base.eval.precision} "
        f"(fp32 keeps the audit's own error far below the regimes' errors it measures), normalises its "
        f"logits with a float64 log-softmax and sums the KL over the whole vocabulary in float64, a chunk "
        f"of response positions at a time; a "
        f"training forward keeps one log-prob per token (TRL's fused LM head, in "
        f"{base.model.precision}); the bf16 figure is below",
        "throughput": f"the model's matrices are small (hidden size {policy.config.hidden_size}) and much of a "
        f"step is attention, softmax, norms, the optimiser and Python overhead, not matmuls",
        "sampling": "generate's time is ~97% model forwards, of which matmuls are ~60% at ~60% of the ceiling "
        "(SmolLM2, 32 rows, bf16, profiled); the rest is attention, KV-cache copies and norms. Each evaluation "
        "prompt (chat template: ~54 tokens) costs a prefill comparable to its response, and a batch runs until its "
        "longest response ends (the rows that ended early still cost a forward each step; tokens/s counts only "
        "response tokens). Static cache without compile was no faster here, eager "
        "attention slower; the evaluation samples in fp32 by default (eval.precision: the audit scores the "
        "model that drew the samples, and bf16 logits are too coarse to measure the regimes' errors)",
        "memory": "the run's own state (fp32 weights, gradients, two AdamW moments, the reference: "
        f"{_own_gb(frame)} GB) and the imported libraries (about 0.6 GB) leave nothing for activations; "
        "below 3 GB needs lower-precision weights or optimiser state (changes metrics) or gradient "
        "checkpointing (slower steps)",
        "sampling_bound": "a decode step multiplies matrices of width "
        f"{policy.config.hidden_size} by a few dozen rows: attention over each row's KV cache, norms, the "
        "sampler's own work and Python cost a step as much as its matmuls; the prompts' prefill is counted as time, "
        "not as tokens",
        "audit_bound": "after the judge's forward, the float64 log-softmax and the KL's sum over the whole "
        "vocabulary at every position are memory-bound work that the matmul bound does not count",
        "dpo_trainer": "",
        "grpo_trainer": "",
    }
    rows = report.targets(frame, audit, trainers, tp, notes)
    prov = provenance()
    hw = prov["hardware"]
    header = [
        f"Generated by `python -m ablate.bench {' '.join(shlex.quote(o) for o in overrides)}` in "
        f"{(time.perf_counter() - t_start) / 60:.1f} min. Code {prov['git_commit']}; torch {prov['versions']['torch']}, "
        f"transformers {prov['versions']['transformers']}, trl {prov['versions']['trl']}, bitsandbytes "
        f"{prov['versions']['bitsandbytes']}. Machine: {hw['cpu']}, {hw['cores']} cores, torch threads "
        f"{hw['torch_threads']}{', GPU ' + hw['gpu'] if 'gpu' in hw else ', no GPU'}.",
        "",
        f"Batch: {B} preference pairs ({2 * B} sequences, {int(batch.attention_mask.sum())} tokens, padded to "
        f"{batch.input_ids.shape[1]}), model precision {base.model.precision}. Every time is a median "
        f"of interleaved repeats ({bench.repeats} per regime) in this one process, so a busy machine slows all "
        f"alike and the ratios hold better than the absolute times.",
    ]
    md, csv = report.write(Path(bench.out), base.model.name, header, frame, audit, trainers, tp, rows)
    print(f"ablate.bench: wrote {md} and {csv}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
