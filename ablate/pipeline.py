"""Builds the pieces of one job and trains: task data, policy, reference regime, evaluator, trainer."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch

from ablate.config import Config, value_of
from ablate.paths import cache_root

log = logging.getLogger(__name__)


class EvalCallbackFactory:
    """A TrainerCallback that evaluates before training and every ``eval.interval`` steps, then updates the
    reference (``Reference.step``) after each optimiser step but the last: an evaluation at step ``s`` audits
    the reference step ``s`` trained with, and so does the final one (after training). A checkpoint, written
    after the callback, holds the reference the next step trains with. Train logs go to the run folder and W&B.
    It stops a diverging job (NaN/inf loss, true KL beyond ``divergence.max_kl``) and completes each
    checkpoint the trainer writes with what a resumed job needs (``tracking.checkpoint``)."""

    @staticmethod
    def build(*, cfg: Config, evaluator, reference, policy_getter, trainer_getter, folder, logger, state):
        from transformers import TrainerCallback

        from ablate.tracking import checkpoint

        max_kl = cfg.divergence.max_kl

        def do_eval(step: int) -> None:
            from ablate.run import cost_metrics

            res = evaluator.evaluate(policy_getter(), reference, step)
            metrics = {**res.metrics, **cost_metrics(reference, step)}
            folder.log_metrics(step, metrics)
            logger.log(metrics, step=step)
            if state.first_eval is None:
                state.first_eval = res
            state.last_eval = res
            log.info(
                "eval@%d: win_rate %.3f  reward %.3f  kl_true %.4f  kl_approx %.4f  ppl %.2f",
                step,
                res.metrics["eval/win_rate"],
                res.metrics["eval/reward_gold"],
                res.metrics["kl/true"],
                res.metrics["kl/approx"],
                res.metrics["eval/ppl"],
            )
            kl = res.metrics["kl/true"]
            if max_kl is not None and not kl <= max_kl:  # also catches a NaN KL
                state.status = "diverged"
                state.reason = f"true KL {kl:.4g} > divergence.max_kl={max_kl:g} at step {step}"

        class _Callback(TrainerCallback):
            def on_train_begin(self, args, st, control, **kw):
                if cfg.eval.at_start and state.first_eval is None:  # a resumed job evaluated step 0 already
                    do_eval(0)

            def on_step_end(self, args, st, control, **kw):
                state.steps = st.global_step
                last = st.global_step >= st.max_steps
                if cfg.eval.interval and st.global_step % cfg.eval.interval == 0 and not last:
                    do_eval(st.global_step)  # against the reference this step trained with
                if state.status == "diverged":
                    control.should_training_stop = True
                    control.should_save = False
                elif not last:  # an update after the last step would be used by nothing, not even the final audit
                    reference.step(policy_getter(), st.global_step)

            def on_log(self, args, st, control, logs=None, **kw):
                if not logs:
                    return
                train = {f"train/{k}": float(v) for k, v in logs.items() if isinstance(v, (int, float))}
                folder.log_metrics(st.global_step, train)
                logger.log(train, step=st.global_step)
                loss = logs.get("loss")
                if loss is not None and not math.isfinite(float(loss)):
                    state.status = "diverged"
                    state.reason = f"training loss is {loss} at step {st.global_step}"
                    control.should_training_stop = True
                    control.should_save = False

            def on_save(self, args, st, control, **kw):
                if state.status != "finished":  # never resume into a diverged state
                    return
                path = Path(args.output_dir) / f"checkpoint-{st.global_step}"
                trainer = trainer_getter()
                checkpoint.complete(
                    path,
                    {
                        **state.to_dict(),
                        "kl_coef": float(trainer.beta),
                        # TRL's DPO token counter is not in the Trainer's own state
                        "trl_train_tokens": getattr(trainer, "_total_train_tokens", None),
                    },
                    reference,
                )

        return _Callback(), do_eval


def make_evaluator(cfg: Config, *, judge, tokenizer, prompts: list[str], reward, safety, device, proxy=None):
    """The run's evaluator: it samples and scores in ``eval.precision`` (not the policy's training precision),
    with the sampling seed ``eval.seed`` or, when unset, one derived from the run's ``seed``."""
    from ablate.eval.evaluator import Evaluator
    from ablate.tasks.heldout import heldout_texts

    return Evaluator(
        judge=judge,
        tokenizer=tokenizer,
        prompts=prompts,
        heldout=heldout_texts(),
        reward=reward,
        safety=safety,
        eval_cfg=cfg.eval,
        task_cfg=cfg.task,
        run_seed=cfg.seed,
        device=device,
        proxy=proxy,
    )


def train_and_evaluate(cfg: Config, folder, logger, state, extra: dict[str, Any], resume=None):
    """``resume``: (checkpoint folder, its ablate state) to continue an interrupted job from."""
    from ablate.models.loading import (
        add_adapter,
        load_model,
        load_tokenizer,
        resolve_device,
        resolve_source,
        tokenizer_fingerprint,
    )
    from ablate.refs import regime_class
    from ablate.refs.base import RefContext
    from ablate.tasks.pairs import pairs_for_run
    from ablate.tasks.prompts import make_prompts
    from ablate.tasks.reward import GoldReward
    from ablate.tasks.safety import SafetyJudge

    torch.manual_seed(cfg.seed)
    root = cache_root()
    device = resolve_device(cfg.model.device)
    source = resolve_source(cfg.model, root)
    tokenizer = load_tokenizer(source)
    task = cfg.task
    prompts = make_prompts(task.n_train, task.n_eval, task.n_test, seed=task.split_seed)
    reward, safety = GoldReward(), SafetyJudge(task.unsafe_threshold)

    def load(**kw):
        return load_model(source, device, **kw)

    regime_cls = regime_class(cfg.ref.name)
    pairs = None
    learned = value_of(getattr(cfg.algo, "reward", "gold")) == "learned"
    if cfg.algo.name == "dpo" or regime_cls.needs_pairs or learned:
        pairs, hit, entry = pairs_for_run(cfg, root, source, tokenizer, prompts["train"], reward, load)
        extra.update(n_pairs=len(pairs), pairs_cache_hit=hit, pairs_cache=str(entry.path))
        log.info("%d preference pairs (%s)", len(pairs), "cache hit" if hit else "generated")

    proxy = None
    if learned:
        from ablate.tasks.reward_model import train_or_load

        proxy = train_or_load(
            source=source,
            tokenizer=tokenizer,
            pairs=pairs,
            cfg=cfg.algo.reward_model,
            cache_root=root,
            device=device,
            precision=value_of(cfg.model.precision),
            tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        )
        extra.update({f"reward_model_{k}": v for k, v in proxy.meta.items()})

    # Everything above may or may not have drawn random numbers (a cache hit draws none): seed again, so
    # adapter and value-head initialisation and training never depend on what was cached.
    torch.manual_seed(cfg.seed)
    policy = load()
    if cfg.model.adapter.enabled:
        policy = add_adapter(policy, cfg.model.adapter)
    judge = load()
    evaluator = make_evaluator(
        cfg,
        judge=judge,
        tokenizer=tokenizer,
        prompts=prompts["eval"],
        reward=reward,
        safety=safety,
        device=device,
        proxy=proxy,
    )
    ctx = RefContext(
        config=cfg,
        model_dir=str(source.path),
        model_fingerprint=source.fingerprint,
        tokenizer=tokenizer,
        device=device,
        policy=policy,
        load_model=load,
        train_data=pairs,
        cache_root=str(root),
        precision=value_of(cfg.model.precision),
    )
    reference = regime_cls(cfg.ref, ctx)

    trainer_box: dict[str, Any] = {}
    callback, do_eval = EvalCallbackFactory.build(
        cfg=cfg,
        evaluator=evaluator,
        reference=reference,
        policy_getter=lambda: trainer_box["trainer"].model if "trainer" in trainer_box else policy,
        trainer_getter=lambda: trainer_box["trainer"],
        folder=folder,
        logger=logger,
        state=state,
    )

    if cfg.algo.name == "dpo":
        from ablate.algos.dpo import build_trainer

        trainer = build_trainer(
            cfg,
            policy=policy,
            tokenizer=tokenizer,
            pairs=pairs,
            reference=reference,
            callbacks=[callback],
            out_dir=Path(cfg.out_dir),
            device=device,
        )
    elif cfg.algo.name == "grpo":
        from ablate.algos.grpo import build_trainer

        if hasattr(reference, "prepare_from_pairs"):  # ref=cached: its fixed dataset is the preference pairs
            reference.prepare_from_pairs(pairs)
        trainer = build_trainer(
            cfg,
            policy=policy,
            tokenizer=tokenizer,
            prompts=prompts["train"],
            reward=reward,
            reference=reference,
            callbacks=[callback],
            out_dir=Path(cfg.out_dir),
            device=device,
            proxy=proxy,
        )
    elif cfg.algo.name == "ppo":
        from ablate.algos.ppo import build_trainer

        if hasattr(reference, "prepare_from_pairs"):
            reference.prepare_from_pairs(pairs)
        trainer = build_trainer(
            cfg,
            policy=policy,
            tokenizer=tokenizer,
            prompts=prompts["train"],
            reward=reward,
            reference=reference,
            callbacks=[callback],
            device=device,
            proxy=proxy,
        )
    else:  # guarded by the config schema; listed here so a new algorithm fails loudly
        raise NotImplementedError(f"algo={cfg.algo.name}")
    trainer_box["trainer"] = trainer
    if resume is not None:
        from ablate.tracking import checkpoint

        path, saved = resume
        checkpoint.load_reference(path, reference)
        if cfg.algo.name != "dpo":  # the KL coefficient where the controller had taken it
            trainer.beta = saved["kl_coef"]
            if getattr(trainer, "kl_controller", None) is not None:
                trainer.kl_controller.value = saved["kl_coef"]
        if saved.get("trl_train_tokens") is not None:
            trainer._total_train_tokens = saved["trl_train_tokens"]
        log.info("resuming from %s (step %d)", path, saved["steps"])
    from ablate.tracking.memory import phase_peak_bytes, reset_phase_peak

    measuring = reset_phase_peak()  # training's own peak: models loaded, data ready, evaluations inside it
    try:
        trainer.train(resume_from_checkpoint=str(resume[0]) if resume is not None else None)
    finally:
        extra["peak_rss_train_bytes"] = phase_peak_bytes(measuring)
        # the KL coefficient at the end: the controller's for PPO/GRPO, the fixed beta for DPO
        extra["kl_coef_final"] = float(trainer.beta)
    state.steps = trainer.state.global_step
    if state.status == "finished" and (state.last_eval is None or state.last_eval.step != state.steps):
        do_eval(state.steps)
    if state.last_eval is not None:
        folder.write_samples(state.last_eval.samples)
        logger.log_table("eval/samples", state.last_eval.samples)
    if cfg.save_policy:
        trainer.save_model(str(Path(cfg.out_dir) / "policy"))
    return reference
