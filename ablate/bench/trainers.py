"""The harness's DPO and GRPO step time against stock TRL ``DPOTrainer`` / ``GRPOTrainer`` on the same
model, data and settings: stock TRL with its own reference model, the harness with ``ref=full``. Rounds
alternate (harness, TRL, harness, TRL, ...) on fresh models; each round's first step is not timed."""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from ablate.errors import ConfigError


def step_timer(after_step: Callable[[], object] | None = None):
    """A trainer callback that records each optimiser step's wall time (``.durations``), then calls
    ``after_step`` (the profiler's step, :mod:`ablate.bench.profile`)."""
    from transformers import TrainerCallback

    class StepTimer(TrainerCallback):
        def __init__(self):
            self.durations: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, args, state, control, **kw):
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            self.durations.append(time.perf_counter() - self._t0)
            if after_step is not None:
                after_step()

    return StepTimer()


def _dpo(kind: str, cfg, pieces, timer, out: Path):
    from ablate.algos.dpo import build_trainer
    from ablate.algos.trl_common import common_args
    from ablate.tasks.pairs import pairs_dataset

    policy = pieces.load()
    if kind == "harness":
        from ablate.bench.costs import build_regime

        reference, _, _ = build_regime(cfg, pieces)
        return build_trainer(
            cfg,
            policy=policy,
            tokenizer=pieces.tokenizer,
            pairs=pieces.pairs,
            reference=reference,
            callbacks=[timer],
            out_dir=out,
            device=pieces.device,
        )
    from trl import DPOConfig, DPOTrainer

    if cfg.algo.loss_type == "simpo":  # reference-free: stock TRL's DPOTrainer with a reference model has no twin
        raise ConfigError(
            "the bench compares the harness with stock TRL DPO with a reference model: "
            "algo.loss_type=simpo (reference-free) has no such twin; bench another loss"
        )
    args = DPOConfig(
        **common_args(cfg, out, pieces.device),
        beta=cfg.algo.beta,
        loss_type=[cfg.algo.loss_type],
        max_length=cfg.algo.max_length,
        truncation_mode="keep_start",
        precompute_ref_log_probs=False,
        remove_unused_columns=True,
    )
    return DPOTrainer(
        model=policy,
        ref_model=pieces.load(),
        args=args,
        train_dataset=pairs_dataset(pieces.pairs),
        processing_class=pieces.tokenizer,
        callbacks=[timer],
    )


def _grpo(kind: str, cfg, pieces, timer, out: Path):
    from ablate.algos.grpo import build_trainer, gold_reward_fn, prompts_dataset, trl_args

    policy = pieces.load()
    if kind == "harness":
        from ablate.bench.costs import build_regime

        reference, _, _ = build_regime(cfg, pieces)
        trainer = build_trainer(
            cfg,
            policy=policy,
            tokenizer=pieces.tokenizer,
            prompts=pieces.prompts,
            reward=pieces.reward,
            reference=reference,
            callbacks=[timer],
            out_dir=out,
            device=pieces.device,
        )
        trainer.max_sentences = None  # stock TRL has no stop rule: both sides time the same completions
        return trainer
    from trl import GRPOTrainer

    args = trl_args(cfg, out, pieces.device)
    args.beta = cfg.algo.beta  # stock TRL loads and runs its own reference model
    return GRPOTrainer(
        model=policy,
        reward_funcs=[gold_reward_fn(pieces.reward)],
        args=args,
        train_dataset=prompts_dataset(pieces.prompts),
        processing_class=pieces.tokenizer,
        callbacks=[timer],
    )


BUILDERS = {"dpo": _dpo, "grpo": _grpo}


def harness_vs_trl(algo: str, cfg, pieces, rounds: int) -> dict[str, float]:
    """Median seconds per step of each, and harness / TRL."""
    times: dict[str, list[float]] = {"harness": [], "trl": []}
    for _ in range(rounds):
        for kind in ("harness", "trl"):
            torch.manual_seed(cfg.seed)
            timer = step_timer()
            with tempfile.TemporaryDirectory() as tmp:
                trainer = BUILDERS[algo](kind, cfg, pieces, timer, Path(tmp))
                trainer.train()
            times[kind] += timer.durations[1:]
            del trainer
    h, t = statistics.median(times["harness"]), statistics.median(times["trl"])
    return {"harness_s": h, "trl_s": t, "ratio": h / t, "steps_timed": len(times["harness"])}
