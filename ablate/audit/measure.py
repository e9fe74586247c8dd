"""One regime's audit figures at step 0 (the policy is the SFT model), against the exact full reference in fp32.

Each regime is built as a run builds it (``ablate.inputs.RunInputs.ref_context``, ``prepare_from_pairs``), but
loads what it holds itself (not the judge's copy), so its setup time counts a load. Then:

- DPO's figures on the pairs (:class:`~ablate.eval.fidelity.FidelityProbe` with DPO settings): the error of the
  reference's log-prob margin (``margin_err_mean``, ``_sd``, ``_max``), the first batch's loss (``dpo_loss``, ln 2
  when exact) and its gradient's cosine with the exact one (``dpo_grad_cos``);
- the per-token KL penalty an online algorithm would use (GRPO with k3 unless ``algo=grpo|ppo`` says otherwise)
  on fresh SFT samples of the prompts: its error (``kl_penalty_err_mean``, ``_sd``) and the first step's
  policy-loss gradient cosine (``online_grad_cos``; its advantages come from the task's gold reward);
- the stand-in divergence ``stand_in_kl``: exact KL(SFT || regime) in nats per response on the same fresh samples,
  as the evaluator computes ``kl/approx`` at step 0;
- its cost: ``bytes_held``, ``cache_bytes``, ``setup_s`` (build and precompute, wall time) and ``logprobs_s`` (the
  median time of one training call of its log-probs on a DPO batch).

A figure that cannot be computed is NaN with its reason in ``nan_reasons``.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ablate.algos import loss_probe
from ablate.audit.checks import check_regime_vocab, config_vocab
from ablate.config import DPOConfig, GRPOAlgoConfig
from ablate.eval import kl as klm
from ablate.eval import metrics as mm
from ablate.eval.fidelity import FidelityProbe, logged_name, probe_for
from ablate.inputs import RunInputs, prepare_from_pairs
from ablate.models.logprobs import next_token_logits
from ablate.models.precision import autocast, unwrapped_forward
from ablate.models.sampling import SampledBatch, sample
from ablate.refs import regime_class
from ablate.refs.base import Reference, TokenBatch
from ablate.tasks.pair_tokens import pair_batches

log = logging.getLogger("ablate.audit")
NAN = float("nan")
DPO_KEYS = ("margin_err_mean", "margin_err_sd", "margin_err_max", "dpo_loss")
ONLINE_KEYS = ("kl_penalty_err_mean", "kl_penalty_err_sd")
COST_KEYS = ("bytes_held", "cache_bytes", "setup_s", "logprobs_s")
FIGURES = (*DPO_KEYS, "dpo_grad_cos", *ONLINE_KEYS, "online_grad_cos", "stand_in_kl", *COST_KEYS)
TIMED_BATCHES = 3  # training calls timed per regime (the median is reported)


def dpo_settings(cfg):
    """DPO's settings for the pair figures: the composed ``algo`` when it is DPO, else DPO's defaults."""
    return cfg.algo if cfg.algo.name == "dpo" else DPOConfig()


def online_settings(cfg):
    """The online algorithm's settings for the penalty figures: the composed ``algo`` when it is GRPO or PPO,
    else GRPO's defaults (k3 penalty)."""
    return cfg.algo if cfg.algo.name != "dpo" else GRPOAlgoConfig()


def probe_batches(cfg, tokenizer, pairs) -> list[TokenBatch]:
    """The pairs as DPO's batches (``algo.batch_size`` pairs each, truncated to ``algo.max_length``)."""
    a = dpo_settings(cfg)
    return pair_batches(tokenizer, pairs, a.batch_size, a.max_length)


@dataclass
class Bench:
    """What every regime is measured with, built once: the run's inputs, every pair (the data regimes are built
    from), the SFT model as the policy at step 0 (trainable; the audit never changes its weights), the two probes
    (their judge is the run's frozen copy) and the fresh SFT samples."""

    inputs: RunInputs
    pairs: list
    policy: torch.nn.Module
    dpo: FidelityProbe
    online: FidelityProbe
    fresh: list[SampledBatch]
    eval_precision: str
    vocab: int | None
    trainers: dict = field(default_factory=dict)  # algorithm -> its trainer (trainer_for)
    heads: dict = field(default_factory=dict)  # algorithm -> the policy's forward as its trainer installed it
    _scratch: tempfile.TemporaryDirectory | None = None

    def scratch(self) -> str:
        """A folder for the trainers' output, removed when the bench is."""
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="ablate-audit-")
        return self._scratch.name

    @property
    def judge(self) -> torch.nn.Module:
        return self.dpo.judge


def build_bench(cfg, inputs: RunInputs, pairs: list, batches: list[TokenBatch], prompts: list[str], n_prompts: int):
    """The :class:`Bench` for ``cfg`` (any of the audit's configs: they differ only in ``ref``)."""
    from ablate.eval.evaluator import sampling_seed
    from ablate.models.loading import add_adapter

    torch.manual_seed(cfg.seed)
    policy = inputs.load()
    if cfg.model.adapter.enabled:
        policy = add_adapter(policy, cfg.model.adapter)
    dpo = probe_for(cfg, inputs, algo=dpo_settings(cfg), pair_batches=batches)
    online = probe_for(cfg, inputs, algo=online_settings(cfg), prompts=prompts)
    log.info("audit: sampling %d fresh SFT responses", min(n_prompts, len(prompts)))
    with unwrapped_forward(policy):
        fresh = sample(
            policy,
            inputs.tokenizer,
            prompts[:n_prompts],
            max_new_tokens=cfg.task.max_new_tokens,
            temperature=cfg.task.temperature,
            batch_size=cfg.eval.batch_size,
            seed=sampling_seed(cfg.eval.seed, cfg.seed),
            precision=cfg.eval.precision,
            sampler=cfg.eval.sampler,
            max_sentences=cfg.task.max_sentences,
        )
    return Bench(inputs, pairs, policy, dpo, online, fresh, cfg.eval.precision, config_vocab(dpo.judge.config))


def build_regime(cfg, bench: Bench) -> tuple[Reference, float]:
    """The regime of ``cfg`` built from the bench's inputs and pairs, loading its own model, and its setup wall
    time (construction and any precompute)."""
    inputs = bench.inputs
    ctx = inputs.ref_context(cfg, policy=bench.policy, pairs=bench.pairs)
    ctx = dataclasses.replace(ctx, load_model=inputs.load)
    t0 = time.perf_counter()
    reference = regime_class(cfg.ref.name)(cfg.ref, ctx)
    prepare_from_pairs(reference, inputs.tokenizer, bench.pairs)
    return reference, time.perf_counter() - t0


def trainer_for(cfg, bench: Bench, probe: FidelityProbe, reference: Reference):
    """The trainer a run of ``probe``'s algorithm would build on the bench's policy and data, its regime set to
    ``reference``: the fidelity audit differentiates its own loss (:mod:`ablate.algos.loss_probe`). Built once per
    algorithm (in a scratch folder, removed with the bench), as a run builds one, and given each regime in turn."""
    from ablate.algos.registry import algorithm

    name = probe.algo.name
    if name not in bench.trainers:
        inputs, out = bench.inputs, bench.scratch()
        bench.trainers[name] = algorithm(name).build(
            cfg=dataclasses.replace(cfg, algo=probe.algo, out_dir=out),
            policy=bench.policy,
            tokenizer=inputs.tokenizer,
            pairs=bench.pairs,
            prompts=probe.prompts or inputs.prompts["train"],
            reward=inputs.reward,
            proxy=None,
            reference=reference,
            callbacks=[],
            out_dir=Path(out),
            device=inputs.device,
        )
        bench.heads[name] = loss_probe.installed_head(bench.policy)
    loss_probe.install_head(bench.policy, bench.heads[name])  # each trainer puts its own fused head on the policy
    trainer = bench.trainers[name]
    trainer.reference = reference
    return trainer


def _take(row: dict, why: dict, metrics: dict, reasons: dict, keys, grad_key: str) -> None:
    """Copy the probe's ``keys`` and its ``grad_cos`` (as ``grad_key``) into the row, with their reasons."""
    for key, out in [*((k, k) for k in keys), ("grad_cos", grad_key)]:
        row[out] = metrics[logged_name(key)]
        if key in reasons:
            why[out] = reasons[key]


def stand_in_kl(reference: Reference, bench: Bench) -> tuple[float, str | None, str | None]:
    """Exact KL(SFT || regime) in nats per response (mean over the fresh samples), as the evaluator's ``kl/approx``
    at step 0: both scored in ``eval.precision``, normalised and summed in float64; or NaN and why. A batch the
    regime has no distribution for is scored row by row, and the rows it has none for are left out (a served model
    whose tokenizer splits a sampled response otherwise, say): then the third value says over how many responses
    the mean is, and why the rest are not in it. (The evaluator's ``kl/approx`` is a mean over every response or
    NaN: it is set beside the true KL of them all.)"""
    if not reference.has_reference:
        return NAN, f"ref={reference.name} trains without a reference: there is no stand-in divergence", None
    device, per_response, left_out, why = bench.inputs.device, [], 0, ""
    for sb in bench.fresh:
        batch = sb.batch.to(device)
        try:
            per_response += _response_kls(reference, bench, batch)
        except NotImplementedError as e:
            why = str(e)
            for i in range(batch.input_ids.shape[0]):
                row = TokenBatch(
                    *(t[i : i + 1] for t in (batch.input_ids, batch.attention_mask, batch.completion_mask))
                )
                try:
                    per_response += _response_kls(reference, bench, row)
                except NotImplementedError as e:
                    why, left_out = str(e), left_out + 1
    if not per_response:
        return NAN, why or "no fresh samples", None
    note = f"over {len(per_response)} of {len(per_response) + left_out} fresh responses; {why}" if left_out else None
    return mm.mean(per_response), None, note


def _response_kls(reference: Reference, bench: Bench, batch: TokenBatch) -> list[float]:
    """Each response's KL(SFT || regime) in nats (NotImplementedError where the regime has no distribution)."""
    mask = batch.target_mask
    with torch.no_grad(), autocast(bench.inputs.device, bench.eval_precision):
        stand_in = reference.distribution(batch)
        sft = next_token_logits(bench.judge, batch)
    terms = klm.audit_terms(sft, sft, batch.input_ids[:, 1:], mask, stand_in)
    return klm.sequence_sum(terms.stand_in_kl, mask).tolist()


def logprobs_seconds(reference: Reference, batches: list[TokenBatch], device) -> float:
    """The median wall time of one training call of the regime's log-probs (:meth:`Reference.logprobs`, in the
    training precision) over :data:`TIMED_BATCHES` calls on the first DPO batches (again from the first when
    there are fewer)."""
    times = []
    with torch.no_grad():
        for i in range(TIMED_BATCHES if batches else 0):
            b = batches[i % len(batches)].to(device)
            t0 = time.perf_counter()
            reference.logprobs(b)
            times.append(time.perf_counter() - t0)
    return statistics.median(times) if times else NAN


def measure_regime(cfg, bench: Bench) -> dict:
    """The audit's row for the regime of ``cfg``: ``regime``, every figure of :data:`FIGURES`, the regime's own
    cost notes (``cost_extra``) and ``nan_reasons``. The regime is freed afterwards."""
    name = cfg.ref.name
    log.info("audit: ref=%s: building", name)
    reference, setup_s = build_regime(cfg, bench)
    check_regime_vocab(reference, bench.vocab)
    row, why = {"regime": name}, {}
    log.info("audit: ref=%s: DPO figures on %d pair batches", name, len(bench.dpo.pair_batches))

    # a regime without a reference has nothing to audit, and no trainer (the trainers' beta is their first regime's)
    audited = reference.has_reference
    dpo = trainer_for(cfg, bench, bench.dpo, reference) if audited else None
    _take(row, why, *bench.dpo.measure(bench.policy, reference, trainer=dpo), DPO_KEYS, "dpo_grad_cos")
    log.info("audit: ref=%s: %s penalty figures on fresh samples", name, bench.online.algo.name)
    online = trainer_for(cfg, bench, bench.online, reference) if audited else None
    figures = bench.online.measure(bench.policy, reference, bench.fresh, trainer=online)
    _take(row, why, *figures, ONLINE_KEYS, "online_grad_cos")
    row["stand_in_kl"], reason, note = stand_in_kl(reference, bench)
    if reason:
        why["stand_in_kl"] = reason
    row["notes"] = {"stand_in_kl": note} if note else {}
    cost = reference.cost()
    row.update(
        bytes_held=float(cost.bytes_held),
        cache_bytes=float(cost.cache_bytes),
        setup_s=setup_s,
        logprobs_s=logprobs_seconds(reference, bench.dpo.pair_batches, bench.inputs.device),
        cost_extra=dict(cost.extra),
    )
    for k in FIGURES:
        if isinstance(row[k], float) and not math.isfinite(row[k]):
            why.setdefault(k, "undefined on this data")
    row["nan_reasons"] = why
    del reference
    gc.collect()
    return row
