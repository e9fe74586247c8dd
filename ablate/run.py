"""One job: config -> model + tokenizer -> task -> reference regime -> trainer + evaluation -> run folder + W&B."""

from __future__ import annotations

import logging
import math
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from ablate import distributed
from ablate.config import Config
from ablate.models.loading import resolve_device
from ablate.models.precision import native_bf16
from ablate.pipeline import train_and_evaluate
from ablate.ref_metrics import cost_metrics
from ablate.tracking import checkpoint, resume, schema
from ablate.tracking.disk import UNAVAILABLE, written_bytes
from ablate.tracking.memory import peak_rss_bytes
from ablate.tracking.provenance import provenance
from ablate.tracking.run_dir import run_folder, to_python
from ablate.validation import validate

log = logging.getLogger(__name__)

# summary.json key <- logged metric name, and the keys with a step-0 copy: read from the metric schema
SUMMARY_FROM_METRICS = schema.from_eval()
STEP0_KEYS = schema.step0_keys()
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
    disk_bytes: float = 0.0  # bytes earlier attempts wrote (a resumed job)
    io0: float | None = None  # this process's written bytes when this attempt started (None: not measurable)
    eval_s: float = 0.0  # seconds in evaluations, earlier attempts included
    eval_phases: dict[str, float] = field(default_factory=dict)  # the evaluations' seconds by phase (Evaluator)
    train_s: float = 0.0  # seconds training, not counting the evaluations inside it: finished spans
    train_t0: float | None = None  # perf_counter when the running span of training began
    train_eval0: float = 0.0  # eval_s when it began

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def add_eval(self, seconds: float, phases: dict[str, float]) -> None:
        self.eval_s += seconds
        for name, s in phases.items():
            self.eval_phases[name] = self.eval_phases.get(name, 0.0) + s

    def training(self, running: bool) -> None:
        """Start (``running``) or end a span of training; the evaluations inside it are not counted."""
        if running:
            self.train_t0, self.train_eval0 = time.perf_counter(), self.eval_s
        elif self.train_t0 is not None:
            self.train_s, self.train_t0 = self.training_s(), None

    def training_s(self) -> float:
        """Seconds of training so far (optimiser steps, their data and reference calls; not evaluations)."""
        if self.train_t0 is None:
            return self.train_s
        return self.train_s + time.perf_counter() - self.train_t0 - (self.eval_s - self.train_eval0)

    def start(self) -> None:
        """Start this attempt's clocks: wall time and bytes written continue from earlier attempts."""
        self.t0 = time.perf_counter() - self.wall_s
        self.io0 = written_bytes()

    def written(self) -> float:
        """Bytes the job has written to storage, earlier attempts included; NaN where the OS does not say."""
        now = written_bytes()
        return self.disk_bytes + now - self.io0 if now is not None and self.io0 is not None else NAN

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
            "disk_bytes_written": self.written(),
            "train_s": self.training_s(),
            "eval_s": self.eval_s,
            "eval_phases_s": dict(self.eval_phases),
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
            disk_bytes=d.get("disk_bytes_written", 0.0),
            eval_s=d.get("eval_s", 0.0),
            eval_phases=dict(d.get("eval_phases_s", {})),
            train_s=d.get("train_s", 0.0),
        )


def build_summary(state: JobState, cost: dict[str, float], wall_s: float, extra: dict[str, Any]) -> dict[str, Any]:
    """summary.json: the metric schema's summary keys from the last evaluation (and the first, at step 0), the
    reference's cost, wall time and memory, why each NaN is NaN, then ``extra``."""
    at_step0 = state.first_eval is not None and state.first_eval.step == 0
    m = schema.complete(state.last_eval.metrics) if state.last_eval is not None else {}
    summary: dict[str, Any] = {"status": state.status, "steps": state.steps}
    for key, metric in schema.from_eval().items():
        summary[key] = m.get(metric, NAN)
    if at_step0:
        m0 = schema.complete(state.first_eval.metrics)
        for key in schema.step0_keys():
            summary[f"{key}_step0"] = m0.get(schema.logged(key), NAN)
    for key, metric in schema.from_cost().items():
        summary[key] = cost[metric]
    for key, value in cost.items():  # regime-specific extras, e.g. ref_hit_rate, ref_distill_kl_heldout
        summary.setdefault(key.removeprefix("cost/"), value)
    summary["wall_s"] = wall_s
    summary["train_s"] = state.training_s()
    summary["eval_s"] = state.eval_s
    summary["eval_phases_s"] = {k: round(v, 3) for k, v in state.eval_phases.items()}
    summary["peak_rss_bytes"] = peak_rss_bytes()
    summary["disk_bytes_written"] = state.written()
    reasons = dict(state.last_eval.nan_reasons) if state.last_eval is not None else {}
    if at_step0:
        reasons.update({f"{k}_step0": v for k, v in state.first_eval.nan_reasons.items()})
    for key, why in {**schema.derived_reasons(reasons), **schema.derived_reasons(reasons, "_step0")}.items():
        reasons.setdefault(key, why)
    if state.last_eval is None:
        reasons.setdefault("win_rate", f"no evaluation completed ({state.reason or 'run ended early'})")
    if not state.steps:
        reasons.setdefault("ref_ms_per_step", "no training step completed")
    reasons.setdefault("disk_bytes_written", UNAVAILABLE)
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

        from ablate.hydra_fence import in_sweep

        hc = HydraConfig.get()
        group = Path(hc.sweep.dir).name if in_sweep() else None
        return group, hc.job.override_dirname or None
    except Exception:  # not under Hydra (tests calling run_job directly)
        return None, None


def make_logger(cfg: Config, raw: DictConfig, out_dir: Path):
    from ablate.tracking.wandb_logger import NullLogger, WandbLogger, flatten_config

    if cfg.logger.name == "none" or cfg.logger.mode == "disabled" or not distributed.is_main():
        return NullLogger()  # one W&B run per job: rank 0's
    group, name = _job_identity(raw)
    return WandbLogger(
        project=cfg.logger.project,
        mode=cfg.logger.mode,
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
    already in the folder (another config, a job without checkpoint) is moved to ``previous/<n>/``. Launched on
    several processes, rank 0 decides and writes; the others follow its decision and write nothing. The folder is
    held for the job (``.lock``, :class:`ablate.tracking.run_dir.FolderLock`): a second process on it is refused."""
    cfg: Config = OmegaConf.to_object(raw)
    validate(cfg)
    raw.model.precision = cfg.model.precision  # auto as settled on this machine: config.yaml says what ran
    out_dir = Path(cfg.out_dir)
    folder = run_folder(out_dir)
    held = folder.lock()  # a second process on this folder: one line, before anything loads
    try:
        return _run_in(cfg, raw, folder)
    finally:
        held.release()


def _run_in(cfg: Config, raw: DictConfig, folder) -> dict[str, Any]:
    out_dir = Path(cfg.out_dir)
    decision = distributed.broadcast(resume.decide(folder, raw) if distributed.is_main() else None)
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
        folder.truncate_samples(state.steps)
    logger = make_logger(cfg, raw, out_dir)
    state.start()
    extra = job_extra(cfg, resumed_from=state.steps if decision.checkpoint is not None else None)
    summary = train_and_summarise(cfg, folder, logger, state, extra, decision.checkpoint)
    final = state.status in ("finished", "diverged")
    if final and not cfg.checkpoint.keep and distributed.is_main():  # final: nothing to resume
        checkpoint.remove_all(out_dir)
    log.info("run folder: %s (status %s)", out_dir, state.status)
    return summary


def job_extra(cfg: Config, resumed_from: int | None) -> dict[str, Any]:
    """What the summary records about the job itself: regime, algorithm, model, seed, the step a resumed job
    continued from, and the provenance (code, libraries, machine)."""
    extra: dict[str, Any] = {"regime": cfg.ref.name, "algo": cfg.algo.name, "model": cfg.model.name, "seed": cfg.seed}
    extra.update(cfg.algo.summary_fields())  # what the algorithm's settings mean beyond config.yaml
    if resumed_from is not None:
        extra["resumed_from_step"] = resumed_from
    extra["provenance"] = provenance()
    extra["provenance"]["task"] = task_identity(cfg)
    extra["provenance"]["bf16"] = native_bf16(resolve_device(cfg.model.device))[1]  # what model.precision=auto reads
    return extra


def train_and_summarise(cfg: Config, folder, logger, state: JobState, extra: dict[str, Any], resume) -> dict[str, Any]:
    """Train and evaluate; whatever happens, write the summary (a failed job's too: then ``error.txt`` holds the
    traceback, and the exception is re-raised) and close the logger."""
    reference = None
    logger.start()
    try:
        reference = train_and_evaluate(cfg, folder, logger, state, extra, resume=resume)
    except BaseException as e:  # record, then re-raise: a failed job still leaves a complete summary
        state.status = "failed"
        state.reason = f"{type(e).__name__}: {e}"
        if distributed.is_main():
            (Path(cfg.out_dir) / "error.txt").write_text(traceback.format_exc())
        raise
    finally:
        summary = build_summary(state, cost_metrics(reference, state.steps), state.elapsed(), extra)
        if reference is not None:
            if reference.provenance:
                summary.setdefault("provenance", {})["reference"] = reference.provenance
            reference.close()
        folder.write_summary({k: to_python(v) for k, v in summary.items()})
        logger.summary({k: v for k, v in summary.items() if not isinstance(v, dict)})
        logger.finish(failed=state.status != "finished")
    return summary


def task_identity(cfg: Config) -> dict[str, Any]:
    """What the run was judged on, for the provenance: the task (and its data's location), the gold reward and the
    safety judge by name and path (their content hashes are in the cache keys and in ``data``)."""
    out: dict[str, Any] = {"task": cfg.task.name, "judge": cfg.judge.name, "safety": cfg.safety.name}
    for key, node in (("data", cfg.task), ("judge_path", cfg.judge), ("safety_path", cfg.safety)):
        if getattr(node, "path", None):
            out[key] = str(node.path)
    return out
