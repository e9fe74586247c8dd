"""Builds the pieces of one job and trains, top to bottom: the run's inputs, the preference pairs and learned
reward where needed, the policy, the evaluator, the reference regime, the trainer with its callbacks; then
training, the final evaluation and the samples."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from ablate import callbacks as cbs
from ablate import distributed
from ablate.algos.registry import Algorithm, algorithm
from ablate.config import Config
from ablate.eval.evaluator import Evaluator
from ablate.eval.fidelity import FidelityProbe, probe_for
from ablate.inputs import RunInputs, prepare_from_pairs
from ablate.models.loading import add_adapter, tokenizer_fingerprint
from ablate.refs import regime_class
from ablate.refs.base import Reference
from ablate.tasks.heldout import heldout_texts
from ablate.tasks.pair_tokens import pair_batches
from ablate.tracking import checkpoint
from ablate.tracking.memory import phase_peak_bytes, reset_phase_peak

log = logging.getLogger(__name__)


def warn_slow_bf16(cfg, device) -> None:
    """One warning where ``model.precision=bf16`` trains on a CPU without bf16 instructions (its matmuls then run
    ATen's reference kernel, many times slower than fp32): the choice stays the user's, since fp32 changes the
    numbers."""
    from ablate.models.precision import SLOW_BF16, bf16_slowdown, is_bf16

    if device.type != "cpu" or not is_bf16(cfg.model.precision):
        return
    ratio = bf16_slowdown()
    if ratio > SLOW_BF16:
        log.warning(
            "model.precision=bf16 on a CPU without bf16 instructions: a bf16 matmul runs %.0fx slower than fp32 "
            "here, so training will be slow; model.precision=fp32 trains faster on this machine (other numbers)",
            ratio,
        )


def make_evaluator(
    cfg: Config,
    *,
    judge,
    tokenizer,
    prompts: list[str],
    reward,
    safety,
    device,
    heldout: list[str] | None = None,
    proxy=None,
    cache_root=None,
    model_fingerprint: str | None = None,
    fidelity=None,
):
    """The run's evaluator: it samples and scores in ``eval.precision`` (not the policy's training precision),
    its perplexity on ``heldout`` (default: the package's held-out text),
    with the sampling seed ``eval.seed`` or, when unset, one derived from the run's ``seed``. With a
    ``cache_root`` (and the judge's ``model_fingerprint``) its SFT baseline is cached there, once per sweep."""
    return Evaluator(
        judge=judge,
        tokenizer=tokenizer,
        prompts=prompts,
        heldout=heldout_texts() if heldout is None else heldout,
        reward=reward,
        safety=safety,
        eval_cfg=cfg.eval,
        task_cfg=cfg.task,
        run_seed=cfg.seed,
        device=device,
        proxy=proxy,
        cache_root=cache_root,
        model_fingerprint=model_fingerprint,
        fidelity=fidelity,
    )


def fidelity_probe(cfg: Config, inputs: RunInputs, algo: Algorithm, pairs) -> FidelityProbe:
    """The fidelity audit's data (:mod:`ablate.eval.fidelity`): a pair-trained algorithm's pairs as its batches
    (truncated as it truncates them), and the training prompts an online algorithm's first batch is drawn from; the
    judge is the evaluator's frozen copy."""
    batches = (
        pair_batches(inputs.tokenizer, pairs, cfg.algo.batch_size, cfg.algo.max_length) if algo.needs_pairs else None
    )
    return probe_for(cfg, inputs, algo=cfg.algo, pair_batches=batches, prompts=inputs.prompts["train"])


def train_and_evaluate(cfg: Config, folder, logger, state, extra: dict[str, Any], resume=None) -> Reference:
    """Train and evaluate one job; returns its reference (for the cost in the summary). ``extra`` receives
    figures for the summary; ``resume``: (checkpoint folder, its ablate state) to continue an interrupted job."""
    torch.manual_seed(cfg.seed)
    algo = algorithm(cfg.algo.name)
    regime_cls = regime_class(cfg.ref.name)
    learned = getattr(cfg.algo, "reward", "gold") == "learned"  # PPO and GRPO may train on a proxy
    with distributed.main_first():  # what is cached (the converted model, pairs, a learned reward) is made once
        inputs = RunInputs.build(cfg)
        record_inputs(inputs, extra)
        pairs = load_pairs(cfg, inputs, extra) if algo.needs_pairs or regime_cls.needs_pairs or learned else None
        proxy = load_proxy(cfg, inputs, pairs, extra) if learned else None
    # Everything above may or may not have drawn random numbers (a cache hit draws none): seed again, so
    # adapter and value-head initialisation and training never depend on what was cached.
    torch.manual_seed(cfg.seed)
    policy = inputs.load()
    if cfg.model.adapter.enabled:
        policy = add_adapter(policy, cfg.model.adapter)
    if resume is None:
        check_reference_is_policy(cfg, inputs, policy, pairs if algo.needs_pairs else None)
    warn_slow_bf16(cfg, inputs.device)
    evaluator = make_evaluator(
        cfg,
        judge=inputs.frozen_copy(),  # ref=full reads the same copy (RunInputs.ref_context)
        tokenizer=inputs.tokenizer,
        prompts=inputs.prompts["eval"],
        heldout=inputs.heldout,
        reward=inputs.reward,
        safety=inputs.safety,
        device=inputs.device,
        proxy=proxy,
        cache_root=inputs.cache_root,
        model_fingerprint=inputs.source.fingerprint,
        fidelity=fidelity_probe(cfg, inputs, algo, pairs) if cfg.eval.fidelity else None,
    )
    with distributed.main_first():  # a regime's own cache (cached, distilled) is made once
        reference = regime_cls(cfg.ref, inputs.ref_context(cfg, policy=policy, pairs=pairs))
        # prepared once, for every algorithm, from the pairs' sequences as DPO trains on them
        prepare_from_pairs(reference, inputs.tokenizer, pairs)
    callbacks = cbs.run_callbacks(
        cfg, state=state, policy=policy, evaluator=evaluator, reference=reference, folder=folder, logger=logger
    )
    trainer = build_trainer(
        cfg, algo, inputs, policy=policy, pairs=pairs, proxy=proxy, reference=reference, callbacks=callbacks
    )
    if resume is not None:
        restore(trainer, reference, resume)
    train(trainer, resume, state, extra)
    release_training_state(trainer)
    finish(cfg, trainer, callbacks[0], state, logger)
    extra["sft_baseline_cache_hit"] = evaluator.baseline_cache_hit
    return reference


def record_inputs(inputs: RunInputs, extra: dict[str, Any]) -> None:
    """What the summary says of the run's inputs: the data read (``task=dataset``) and the judges' identities (a
    model judge's: its folder's content hash, as in every cache key built on its scores)."""
    if inputs.data is not None:
        extra["data"] = inputs.data.summary()
    task = extra.setdefault("provenance", {}).setdefault("task", {})
    task.update(judge_id=inputs.reward.ID, safety_id=inputs.safety.ID)


def check_reference_is_policy(cfg: Config, inputs: RunInputs, policy, pairs) -> None:
    """The wrong-reference guard (:mod:`ablate.eval.reference_guard`): before the first step, the run's full
    reference (its frozen SFT copy) gives the policy's log-probs exactly, in fp32, on the first training batch."""
    from ablate.eval.reference_guard import check_reference, first_batch

    rows = min(cfg.algo.batch_size, 4)
    ids, mask = first_batch(
        inputs.tokenizer,
        pairs=pairs,
        prompts=inputs.prompts["train"],
        rows=rows,
        max_length=getattr(cfg.algo, "max_length", None),
    )
    check_reference(policy, inputs.frozen_copy(), ids, mask)
    log.info("reference check: the full reference gives the policy's log-probs exactly on the first batch")


def load_pairs(cfg: Config, inputs: RunInputs, extra: dict[str, Any]) -> list:
    """The run's preference pairs (DPO's data; what ``cached`` and ``distilled`` are built from; a learned
    reward's training data), cached content-addressed."""
    pairs, hit, entry = inputs.pairs(cfg)
    extra.update(n_pairs=len(pairs), pairs_cache_hit=hit, pairs_cache=str(entry.path))
    from_data = entry is inputs.data
    log.info(
        "%d preference pairs (%s)", len(pairs), "from the data" if from_data else "cache hit" if hit else "generated"
    )
    return pairs


def load_proxy(cfg: Config, inputs: RunInputs, pairs, extra: dict[str, Any]):
    """The learned reward model (``algo.reward=learned``), trained on the pairs or loaded from the cache."""
    from ablate.tasks.reward_model import train_or_load

    proxy = train_or_load(
        source=inputs.source,
        tokenizer=inputs.tokenizer,
        pairs=pairs,
        cfg=cfg.algo.reward_model,
        cache_root=inputs.cache_root,
        device=inputs.device,
        precision=cfg.model.precision,
        tokenizer_fingerprint=tokenizer_fingerprint(inputs.tokenizer),
    )
    extra.update({f"reward_model_{k}": v for k, v in proxy.meta.items()})
    return proxy


def build_trainer(cfg: Config, algo: Algorithm, inputs: RunInputs, *, policy, pairs, proxy, reference, callbacks):
    """The algorithm's trainer (its reference prepared), bound to its callbacks."""
    trainer = algo.build(
        cfg=cfg,
        policy=policy,
        tokenizer=inputs.tokenizer,
        pairs=pairs,
        prompts=inputs.prompts["train"],
        reward=inputs.reward,
        proxy=proxy,
        reference=reference,
        callbacks=callbacks,
        out_dir=Path(cfg.out_dir),
        device=inputs.device,
    )
    cbs.bind(callbacks, trainer)
    return trainer


def restore(trainer, reference: Reference, resume) -> None:
    """Put back what the trainer's own checkpoint does not hold: the reference's state and the trainer's
    resume state (KL coefficient, TRL's token counter)."""
    path, saved = resume
    checkpoint.load_reference(path, reference)
    trainer.restore(saved)
    log.info("resuming from %s (step %d)", path, saved["steps"])


def train(trainer, resume, state, extra: dict[str, Any]) -> None:
    """Train (from the checkpoint when resuming), recording training's own peak memory (models loaded, data
    ready, evaluations inside it), the KL coefficient at the end (the controller's for PPO/GRPO, the
    fixed beta for DPO) and the bytes the loss holds beyond the reference, also when training fails."""
    measuring = reset_phase_peak()
    state.training(True)
    try:
        trainer.train(resume_from_checkpoint=str(resume[0]) if resume is not None else None)
    finally:
        state.training(False)
        extra["peak_rss_train_bytes"] = phase_peak_bytes(measuring)
        extra["kl_coef_final"] = float(trainer.kl_coef)
        extra["loss_extra_bytes"] = int(trainer.loss_extra_bytes)


def release_training_state(trainer) -> int:
    """After the last step, drop what only further steps would read: the optimiser's state (AdamW's two moments,
    twice a full fine-tune's weights) and the gradients, so that the final evaluation does not hold them (its
    fidelity audit makes gradients of its own). The checkpoints on disk keep them for a resume. Returns the
    bytes dropped."""
    optimizer = getattr(trainer, "optimizer", None)
    optimizer = getattr(optimizer, "optimizer", optimizer)  # Accelerate's wrapper holds the torch optimiser
    freed = 0
    if optimizer is not None:
        for state in optimizer.state.values():
            freed += sum(v.numel() * v.element_size() for v in state.values() if torch.is_tensor(v))
        optimizer.state.clear()
    model = getattr(trainer, "model", None)
    if model is not None:
        for p in model.parameters():
            if p.grad is not None:
                freed += p.grad.numel() * p.grad.element_size()
                p.grad = None
    log.info("training state released before the final evaluation: %.0f MB", freed / 2**20)
    return freed


def finish(cfg: Config, trainer, evaluation: cbs.EvaluationCallback, state, logger) -> None:
    """The final evaluation (unless the last step was just evaluated, or the job diverged), the last
    evaluation's samples as a W&B table (each evaluation added its own to ``samples.jsonl``), and the trained
    policy when ``save_policy``."""
    state.steps = trainer.state.global_step
    last = state.last_eval
    if state.status == "finished" and (last is None or last.step != state.steps or not last.final):
        evaluation.evaluate(state.steps, final=True)
    if state.last_eval is not None:  # its samples are in samples.jsonl already: each evaluation adds its own
        logger.log_table("eval/samples", state.last_eval.samples)
    if cfg.save_policy:
        trainer.save_model(str(Path(cfg.out_dir) / "policy"))
