"""``python -m ablate.bench.profile [overrides]``: where a training step's time goes. The harness's trainer (as the
bench builds it, ``ref=full``) runs ``algo.max_steps`` steps under ``torch.profiler``; the first is warm-up, the rest
are recorded. Each operator's own time (not its children's) is put in one category (matmuls, attention, the LM
head's softmax, the optimiser, copies, other arithmetic); a GRPO/PPO step's sampling is timed as a whole, since its
operators are the same ones. Prints one Markdown table per algorithm; ``out=<file>`` writes them to a file.

The profiler adds overhead of its own to every operator, so the shares hold better than the absolute times; the
step time in the table is the profiled steps' median.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import torch

#: each category's operators (names without ``aten::``; a name ending in ``*`` is a prefix); the rest is "other
#: arithmetic"
CATEGORIES = {
    "matmul": ("mm", "addmm", "addmm_", "bmm", "baddbmm"),
    "attention": ("_scaled_dot_product*", "_flash_attention*", "_efficient_attention*"),
    "softmax and log-softmax": (
        "_softmax",
        "_log_softmax",
        "logsumexp",
        "_softmax_backward_data",
        "_log_softmax_backward_data",
    ),
    "optimiser": ("_foreach_*", "addcdiv_", "addcmul_", "lerp_"),
    "copies and layout": (
        "copy_",
        "cat",
        "clone",
        "_to_copy",
        "index",
        "index_select",
        "gather",
        "scatter*",
        "stack",
        "fill_",
        "zero_",
        "contiguous",
        "embedding_dense_backward",
        "index_add_",
    ),
}
SAMPLING = "sampling (generate, whole)"
TOP = 8  # the operators listed one by one


def category(op: str) -> str:
    """The category of profiler key ``op`` (an ``aten::`` operator)."""
    name = op.removeprefix("aten::")
    for cat, names in CATEGORIES.items():
        if any(name == n or (n.endswith("*") and name.startswith(n[:-1])) for n in names):
            return cat
    return "other arithmetic"


def _labelled_generate(model: torch.nn.Module) -> None:
    """``model.generate`` inside a profiler label, so that a rollout's operators count as sampling (this instance
    only; the model is the bench's own)."""
    inner = model.generate

    def generate(*args, **kwargs):
        with torch.profiler.record_function(SAMPLING):
            return inner(*args, **kwargs)

    model.generate = generate


def profile_steps(algo: str, cfg, pieces) -> dict:
    """The category table of ``cfg.algo.max_steps - 1`` profiled steps of the harness's ``algo`` trainer."""
    from ablate.bench.trainers import BUILDERS, step_timer

    steps = int(cfg.algo.max_steps)
    schedule = torch.profiler.schedule(wait=0, warmup=1, active=steps - 1, repeat=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule) as prof:
        timer = step_timer(after_step=prof.step)
        with tempfile.TemporaryDirectory() as tmp:
            torch.manual_seed(cfg.seed)
            trainer = BUILDERS[algo]("harness", cfg, pieces, timer, Path(tmp))
            _labelled_generate(trainer.model)
            trainer.train()
    durations = timer.durations
    events = prof.key_averages()
    shares: dict[str, float] = {}
    by_op: dict[str, float] = {}
    sampling_us = 0.0
    for e in events:
        if e.key == SAMPLING:
            sampling_us += e.cpu_time_total
            continue
        if not e.key.startswith("aten::"):
            continue
        shares[category(e.key)] = shares.get(category(e.key), 0.0) + e.self_cpu_time_total
        by_op[e.key] = by_op.get(e.key, 0.0) + e.self_cpu_time_total
    recorded = sum(durations[1:]) * 1e6
    return {
        "algo": algo,
        "steps": len(durations) - 1,
        "step_s": statistics.median(durations[1:]),
        "operators_us": shares,
        "top_us": dict(sorted(by_op.items(), key=lambda kv: -kv[1])[:TOP]),
        "sampling_us": sampling_us,
        "recorded_us": recorded,
    }


def table(result: dict) -> list[str]:
    """A Markdown table: each category's share of the profiled steps' wall time, and what no operator accounts
    for (Python, the trainer's own bookkeeping, the profiler)."""
    total = result["recorded_us"]
    ops = result["operators_us"]
    lines = [
        f"### {result['algo']}: {result['steps']} profiled steps, median {result['step_s']:.2f} s a step",
        "",
        "| where | share of the steps' wall time |",
        "|---|---|",
    ]
    if result["sampling_us"]:
        lines.append(f"| {SAMPLING} | {result['sampling_us'] / total:.0%} |")
    for cat, us in sorted(ops.items(), key=lambda kv: -kv[1]):
        lines.append(f"| {cat} (own time, every phase) | {us / total:.0%} |")
    lines.append(f"| no operator (Python, bookkeeping, profiler) | {max(0.0, 1 - sum(ops.values()) / total):.0%} |")
    lines += [
        "",
        f"The {TOP} operators with the most own time:",
        "",
        "| operator | category | share |",
        "|---|---|---|",
    ]
    lines += [f"| `{op}` | {category(op)} | {us / total:.1%} |" for op, us in result["top_us"].items()]
    return lines


def compose_profile(overrides: list[str]) -> tuple[dict, str | None]:
    """Each profiled algorithm's run config (``ref=full``, the run overrides applied) and the ``out`` file, with
    the run's checks passed: bad input is a ConfigError before any model loads."""
    from ablate.bench.config import run_configs
    from ablate.bench.trainers import BUILDERS
    from ablate.errors import ConfigError

    out = next((o.split("=", 1)[1] for o in overrides if o.startswith("out=")), None)
    algos = next((o.split("=", 1)[1] for o in overrides if o.startswith("algos=")), "dpo,grpo").split(",")
    unknown = sorted(set(algos) - set(BUILDERS))
    if unknown:
        raise ConfigError(f"algos must be among {', '.join(BUILDERS)}, not {','.join(unknown)}")
    rest = [o for o in overrides if not o.startswith(("out=", "algos="))]
    configs = {a: run_configs(["full"], [f"algo={a}", "algo.max_steps=4", *rest])["full"] for a in algos}
    if min(int(c.algo.max_steps) for c in configs.values()) < 2:
        raise ConfigError("algo.max_steps must be >= 2 (the first step is warm-up)")
    return configs, out


def main(argv: list[str] | None = None) -> int:
    from ablate.bench.config import error_line
    from ablate.bench.pieces import build_pieces

    overrides = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(overrides):
        print(__doc__.strip())
        return 0
    try:
        configs, out = compose_profile(overrides)
    except Exception as e:  # bad input (and Hydra's composition errors): one line
        return error_line("ablate.bench.profile", e)
    pieces = build_pieces(next(iter(configs.values())))
    lines: list[str] = []
    for algo, cfg in configs.items():
        lines += [*table(profile_steps(algo, cfg, pieces)), ""]
    text = "\n".join(lines)
    print(text)
    if out:
        Path(out).write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
