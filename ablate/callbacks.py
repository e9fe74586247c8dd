"""The run's trainer callbacks, one job each: evaluation, the reference's step, divergence, train logs and
checkpoints. The trainer calls them in that order (:func:`run_callbacks`), so an evaluation at step ``s`` audits
the reference step ``s`` trained with, a diverging step neither updates the reference nor saves, and a
checkpoint, written after them, holds the reference the next step trains with.

They share the job's :class:`ablate.run.JobState`. The trainer is built after its callbacks, so each is bound
to it once built (:func:`bind`); until then the policy is the one the trainer is given.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path

from transformers import TrainerCallback

from ablate import distributed
from ablate.ref_metrics import cost_metrics
from ablate.tracking import checkpoint, schema

log = logging.getLogger(__name__)


class RunCallback(TrainerCallback):
    """A callback that may need the trainer it is attached to (bound once the trainer is built)."""

    def __init__(self, state, policy):
        self.state = state
        self._policy = policy
        self.trainer = None

    def policy(self):
        """The policy being trained: the trainer's model once bound."""
        return self.trainer.model if self.trainer is not None else self._policy


class EvaluationCallback(RunCallback):
    """Evaluates before training (``eval.at_start``) and every ``eval.interval`` steps but the last (the final
    evaluation runs after training: :meth:`evaluate`); logs to the run folder and W&B; marks the job diverged
    when the true KL passes ``divergence.max_kl`` (or is NaN)."""

    def __init__(self, state, policy, *, cfg, evaluator, reference, folder, logger):
        super().__init__(state, policy)
        self.cfg, self.evaluator, self.reference = cfg, evaluator, reference
        self.folder, self.logger = folder, logger

    def evaluate(self, step: int, final: bool = False) -> None:
        """One evaluation; ``final``: at the final evaluation's size (eval.samples_per_prompt)."""
        t0 = time.perf_counter()
        res = self.evaluator.evaluate(self.policy(), self.reference, step, final=final, trainer=self.trainer)
        self.state.add_eval(time.perf_counter() - t0, res.seconds)
        res.metrics = schema.complete(res.metrics)  # derived metrics of the schema, logged like the others
        metrics = {**res.metrics, **cost_metrics(self.reference, step)}
        self.folder.log_metrics(step, metrics, reasons=schema.logged_reasons(res.nan_reasons, metrics))
        self.folder.add_samples(res.samples)
        self.logger.log(metrics, step=step)
        if self.state.first_eval is None:
            self.state.first_eval = res
        self.state.last_eval = res
        m = res.metrics
        log.info(
            "eval@%d: win_rate %.3f  reward %.3f  kl_true %.4f  kl_approx %.4f  ppl %.2f",
            step,
            *(m[k] for k in ("eval/win_rate", "eval/reward_gold", "kl/true", "kl/approx", "eval/ppl")),
        )
        max_kl, kl = self.cfg.divergence.max_kl, m["kl/true"]
        if max_kl is not None and not kl <= max_kl:  # also catches a NaN KL
            self.state.status = "diverged"
            self.state.reason = f"true KL {kl:.4g} > divergence.max_kl={max_kl:g} at step {step}"

    def on_train_begin(self, args, st, control, **kw):
        if self.cfg.eval.at_start and self.state.first_eval is None:  # a resumed job evaluated step 0 already
            self.evaluate(0)

    def on_step_end(self, args, st, control, **kw):
        self.state.steps = st.global_step
        interval = self.cfg.eval.interval
        if interval and st.global_step % interval == 0 and st.global_step < st.max_steps:
            self.evaluate(st.global_step)  # against the reference this step trained with


class DivergenceCallback(RunCallback):
    """Stops a diverged job (non-finite training loss, or the evaluation's verdict) without saving it."""

    def on_step_end(self, args, st, control, **kw):
        if self.state.status == "diverged":
            control.should_training_stop = True
            control.should_save = False

    def on_log(self, args, st, control, logs=None, **kw):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            self.state.status = "diverged"
            self.state.reason = f"training loss is {loss} at step {st.global_step}"
            control.should_training_stop = True
            control.should_save = False


class ReferenceStepCallback(RunCallback):
    """``Reference.step`` after each optimiser step but the last (an update then would be used by nothing, not
    even the final audit) and none once the job diverged."""

    def __init__(self, state, policy, *, reference):
        super().__init__(state, policy)
        self.reference = reference

    def on_step_end(self, args, st, control, **kw):
        if self.state.status != "diverged" and st.global_step < st.max_steps:
            self.reference.step(self.policy(), st.global_step)


class TrainLogCallback(RunCallback):
    """The trainer's numeric logs, as ``train/<name>``, to the run folder and W&B."""

    def __init__(self, state, policy, *, folder, logger):
        super().__init__(state, policy)
        self.folder, self.logger = folder, logger

    def on_log(self, args, st, control, logs=None, **kw):
        if not logs:
            return
        train = {f"train/{k}": float(v) for k, v in logs.items() if isinstance(v, (int, float))}
        self.folder.log_metrics(st.global_step, train)
        self.logger.log(train, step=st.global_step)


class CheckpointCallback(RunCallback):
    """Decides at each step end whether the trainer saves (:class:`ablate.tracking.checkpoint.SavePolicy`), and
    completes each checkpoint it writes with what a resumed job needs: the job's state, the trainer's resume
    state (KL coefficient, TRL's token counter) and the reference's state. A diverged job is never checkpointed
    (never resumed into). Launched on several processes, rank 0's clock decides for all (the Trainer saves
    collectively) and rank 0 alone completes the checkpoint."""

    def __init__(self, state, policy, *, reference, saving: checkpoint.SavePolicy):
        super().__init__(state, policy)
        self.reference = reference
        self.saving = saving

    def on_step_end(self, args, st, control, **kw):
        due = self.state.status == "finished" and self.saving.due(st.global_step, st.max_steps)
        control.should_save = distributed.broadcast(due)

    def on_save(self, args, st, control, **kw):
        if self.state.status != "finished":
            return
        path = Path(args.output_dir) / f"checkpoint-{st.global_step}"
        distributed.barrier()  # every process's part (its RNG state) is written before the checkpoint is complete
        if distributed.is_main():
            checkpoint.complete(path, {**self.state.to_dict(), **self.trainer.resume_state()}, self.reference)
        self.saving.saved()


def run_callbacks(cfg, *, state, policy, evaluator, reference, folder, logger) -> list[RunCallback]:
    """The run's callbacks, in the order the trainer must call them."""
    return [
        EvaluationCallback(
            state, policy, cfg=cfg, evaluator=evaluator, reference=reference, folder=folder, logger=logger
        ),
        DivergenceCallback(state, policy),
        ReferenceStepCallback(state, policy, reference=reference),
        TrainLogCallback(state, policy, folder=folder, logger=logger),
        CheckpointCallback(
            state, policy, reference=reference, saving=checkpoint.SavePolicy.from_config(cfg.checkpoint)
        ),
    ]


def bind(callbacks: list[RunCallback], trainer) -> None:
    """Attach the trainer, once built, to the callbacks built for it."""
    for cb in callbacks:
        cb.trainer = trainer
