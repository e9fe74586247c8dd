"""One job: config -> model + tokenizer -> task -> reference regime -> trainer + evaluation -> run folder + W&B."""

from __future__ import annotations

import logging
import math
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from ablate.config import Config, validate, value_of
from ablate.tracking.memory import peak_rss_bytes
from ablate.tracking.run_dir import RunFolder, to_python

log = logging.getLogger(__name__)

# summary.json key <- logged metric name
SUMMARY_FROM_METRICS = {
    "win_rate": "eval/win_rate",
    "win_rate_lo": "eval/win_rate_lo",
    "win_rate_hi": "eval/win_rate_hi",
    "reward_gold": "eval/reward_gold",
    "reward_gold_sft": "eval/reward_gold_sft",
    "reward_proxy": "eval/reward_proxy",
    "kl_true": "kl/true",
    "kl_true_k1": "kl/true_k1",
    "kl_true_k3": "kl/true_k3",
    "kl_approx": "kl/approx",
    "kl_abs_err": "kl/abs_err",
    "logp_mae": "kl/logp_mae",
    "logp_rmse": "kl/logp_rmse",
    "logp_max_err": "kl/logp_max_err",
    "ppl": "eval/ppl",
    "length": "eval/length",
    "rep_2": "eval/rep_2",
    "distinct_2": "eval/distinct_2",
    "unsafe_rate": "eval/unsafe_rate",
}
STEP0_KEYS = ("kl_true", "kl_approx", "kl_abs_err", "logp_mae", "logp_rmse", "logp_max_err")
NAN = float("nan")


@dataclass
class JobState:
    """What the training callback accumulates; the summary is built from it, also after a failure.
    Saved with each checkpoint, so a resumed job's summary is the uninterrupted job's."""

    status: str = "finished"
    reason: str | None = None
    steps: int = 0
    first_eval: Any = None
    last_eval: Any = None
    wall_s: float = 0.0  # wall time of earlier attempts (a resumed job)
    t0: float = 0.0  # perf_counter origin of this job, earlier attempts included

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        ev = lambda e: None if e is None else to_python(asdict(e))  # noqa: E731
        return {
            "status": self.status,
            "reason": self.reason,
            "steps": self.steps,
            "first_eval": ev(self.first_eval),
            "last_eval": ev(self.last_eval),
            "wall_s": self.elapsed(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> JobState:
        from ablate.eval.evaluator import EvalResult

        ev = lambda e: None if e is None else EvalResult(**e)  # noqa: E731
        return cls(
            status=d["status"],
            reason=d["reason"],
            steps=d["steps"],
            first_eval=ev(d["first_eval"]),
            last_eval=ev(d["last_eval"]),
            wall_s=d.get("wall_s", 0.0),
        )


def cost_metrics(reference, steps: int, cache_bytes: int = 0) -> dict[str, float]:
    c = reference.cost()
    return {
        "cost/ref_bytes": float(c.bytes_held),
        "cost/ref_ms_per_step": c.forward_s * 1000.0 / steps if steps else NAN,
        "cost/ref_setup_s": c.setup_s,
        "cost/ref_cache_bytes": float(c.cache_bytes + cache_bytes),
        "cost/ref_forward_calls": float(c.forward_calls),
        # regime-specific figures (hit rate, distillation KL, EMA updates, storage per position, ...)
        **{f"cost/ref_{k}": float(v) for k, v in c.extra.items() if isinstance(v, (int, float))},
    }


def build_summary(state: JobState, cost: dict[str, float], wall_s: float, extra: dict[str, Any]) -> dict[str, Any]:
    m = state.last_eval.metrics if state.last_eval is not None else {}
    summary: dict[str, Any] = {"status": state.status, "steps": state.steps}
    for key, metric in SUMMARY_FROM_METRICS.items():
        summary[key] = m.get(metric, NAN)
    if state.first_eval is not None and state.first_eval.step == 0:
        for key in STEP0_KEYS:
            summary[f"{key}_step0"] = state.first_eval.metrics.get(SUMMARY_FROM_METRICS[key], NAN)
    summary["ref_bytes"] = cost["cost/ref_bytes"]
    summary["ref_ms_per_step"] = cost["cost/ref_ms_per_step"]
    summary["ref_setup_s"] = cost["cost/ref_setup_s"]
    summary["ref_cache_bytes"] = cost["cost/ref_cache_bytes"]
    summary["ref_forward_calls"] = cost["cost/ref_forward_calls"]
    for key, value in cost.items():  # regime-specific extras, e.g. ref_hit_rate, ref_distill_kl_heldout
        summary.setdefault(key.removeprefix("cost/"), value)
    summary["wall_s"] = wall_s
    summary["peak_rss_bytes"] = peak_rss_bytes()
    reasons = dict(state.last_eval.nan_reasons) if state.last_eval is not None else {}
    if state.first_eval is not None and state.first_eval.step == 0:
        reasons.update({f"{k}_step0": v for k, v in state.first_eval.nan_reasons.items()})
    if state.last_eval is None:
        reasons.setdefault("win_rate", f"no evaluation completed ({state.reason or 'run ended early'})")
    if not state.steps:
        reasons.setdefault("ref_ms_per_step", "no training step completed")
    summary["nan_reasons"] = {
        k: v for k, v in reasons.items() if isinstance(summary.get(k), float) and math.isnan(summary[k])
    }
    if state.reason:
        summary["reason"] = state.reason
    summary.update(extra)
    return summary


def _job_identity(cfg: DictConfig) -> tuple[str | None, str | None]:
    """(W&B group, run name) from Hydra: the sweep folder's name and the job's overrides."""
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        group = Path(hc.sweep.dir).name if hc.mode == RunMode.MULTIRUN else None
        return group, hc.job.override_dirname or None
    except Exception:  # not under Hydra (tests calling run_job directly)
        return None, None


def make_logger(cfg: Config, raw: DictConfig, out_dir: Path):
    from ablate.tracking.wandb_logger import NullLogger, WandbLogger, flatten_config

    if cfg.logger.name == "none" or value_of(cfg.logger.mode) == "disabled":
        return NullLogger()
    group, name = _job_identity(raw)
    return WandbLogger(
        project=cfg.logger.project,
        mode=value_of(cfg.logger.mode),
        group=cfg.logger.group or group,
        job_type=cfg.algo.name,
        name=name or out_dir.name,
        tags=[
            f"ref={cfg.ref.name}",
            f"algo={cfg.algo.name}",
            f"seed={cfg.seed}",
            f"model={cfg.model.name}",
            *cfg.logger.tags,
        ],
        entity=cfg.logger.entity,
        dir=str(out_dir),
        config=flatten_config(OmegaConf.to_container(raw, resolve=True)),
    )


def default_threads() -> int | None:
    """Torch threads when ``threads`` is unset: the cores shared out among a parallel launcher's workers
    (joblib's ``n_jobs``, submitit's ``cpus_per_task``), else torch's own default."""
    import os

    try:
        from hydra.core.hydra_config import HydraConfig

        launcher = HydraConfig.get().launcher
    except Exception:
        return None
    if launcher.get("cpus_per_task"):
        return int(launcher.cpus_per_task)
    n_jobs = launcher.get("n_jobs")
    if n_jobs and int(n_jobs) > 1:
        return max(1, (os.cpu_count() or 1) // int(n_jobs))
    return None


def run_job(raw: DictConfig) -> dict[str, Any]:
    """Run one job described by a composed config; returns its summary (also written to summary.json).

    A folder that already holds this job (same resolved config) is not redone: ``finished`` is returned
    as it stands, an interrupted or failed job resumes from its last complete checkpoint. Anything else
    already in the folder (another config, a job without checkpoint) is moved to ``previous/<n>/``."""
    from ablate.tracking import resume

    cfg: Config = OmegaConf.to_object(raw)
    validate(cfg)
    out_dir = Path(cfg.out_dir)
    folder = RunFolder(out_dir)
    decision = resume.decide(folder, raw)
    if decision.finished is not None:
        log.info("already finished, not rerun: %s", out_dir)
        return decision.finished
    folder.write_config(raw)
    threads = cfg.threads or default_threads()
    if threads:
        torch.set_num_threads(threads)
    state = JobState()
    if decision.checkpoint is not None:
        state = JobState.from_dict(decision.checkpoint[1])
        folder.truncate_metrics(state.steps)
    logger = make_logger(cfg, raw, out_dir)
    state.t0 = time.perf_counter() - state.wall_s
    reference = None
    extra: dict[str, Any] = {"regime": cfg.ref.name, "algo": cfg.algo.name, "model": cfg.model.name, "seed": cfg.seed}
    if decision.checkpoint is not None:
        extra["resumed_from_step"] = state.steps
    from ablate.tracking.provenance import provenance

    extra["provenance"] = provenance()
    logger.start()
    try:
        from ablate.pipeline import train_and_evaluate

        reference = train_and_evaluate(cfg, folder, logger, state, extra, resume=decision.checkpoint)
    except BaseException as e:  # record, then re-raise: a failed job still leaves a complete summary
        state.status = "failed"
        state.reason = f"{type(e).__name__}: {e}"
        (out_dir / "error.txt").write_text(traceback.format_exc())
        raise
    finally:
        cost = (
            cost_metrics(reference, state.steps)
            if reference is not None
            else {
                "cost/ref_bytes": NAN,
                "cost/ref_ms_per_step": NAN,
                "cost/ref_setup_s": NAN,
                "cost/ref_cache_bytes": NAN,
                "cost/ref_forward_calls": NAN,
            }
        )
        summary = build_summary(state, cost, state.elapsed(), extra)
        folder.write_summary({k: to_python(v) for k, v in summary.items()})
        logger.summary({k: v for k, v in summary.items() if not isinstance(v, dict)})
        logger.finish(failed=state.status != "finished")
    if state.status in ("finished", "diverged") and not cfg.checkpoint.keep:  # final: nothing to resume
        from ablate.tracking import checkpoint

        checkpoint.remove_all(out_dir)
    log.info("run folder: %s (status %s)", out_dir, state.status)
    return summary
