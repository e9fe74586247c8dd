"""Fidelity of what each algorithm consumes from its reference, against the truth, at step 0 and at the end.

An algorithm never sees the reference's distribution, only a few numbers computed from it, so the audit measures
those numbers (``kl/*`` logged, summary keys without the prefix):

- DPO, on its training pairs: the reference's sequence log-prob margin ``log ref(y_w) - log ref(y_l)``; its
  error against the truth, ``margin_err_mean`` (signed), ``margin_err_sd``, ``margin_err_max`` (largest |error|);
  ``dpo_loss``, the trainer's loss on its first batch under the regime (``ln 2`` at step 0 when the regime is exact
  and the loss is the plain sigmoid one).
- GRPO and PPO, on fresh policy samples (the evaluation's): the per-token KL penalty with the run's estimator
  (k1, k2 = l^2 / 2 or k3), ``kl(log pi, log ref)``, and its error against the same penalty with the true reference,
  ``kl_penalty_err_mean`` and ``kl_penalty_err_sd`` (over tokens). The value is the same whichever the placement
  (in the loss, TRL's k3 times an importance ratio that is 1 at the sampling policy); what the placement changes is
  the gradient, which ``grad_cos`` follows (with k1 in the loss the reference leaves the gradient untouched). A row
  the regime has no term for (``ref=cached``, ``miss=skip``) enters as training uses it: a zero penalty.
- Every algorithm: ``grad_cos``, the cosine between the gradients of the trainer's own loss on its first batch under
  the regime and under the true reference (same batch, same weights). The trainer says which of the above its loss
  reads, gives its first batch and computes its loss (:mod:`ablate.algos.loss_probe`): DPO's first batch is the
  one its data loader yields first; GRPO's and PPO's fresh rollouts of their first prompts, drawn as they draw them.

**The truth** is the full reference in fp32: the judge's log-probs through the same fused head training uses, in
fp32 (float64 from there on). The regime's values are what training receives (in the policy's precision,
:meth:`~ablate.refs.base.Reference.logprobs` for an audit), so ``ref=full`` in a bf16 run has a small error of its own:
the precision's zero line, reported like any regime; in an fp32 run it is exactly 0 (and ``grad_cos`` exactly 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ablate.algos import loss_probe
from ablate.algos.kl_estimators import kl_penalty
from ablate.models.logprobs import add_logprob_head, response_labels, token_logprobs
from ablate.models.precision import autocast, unwrapped_forward
from ablate.models.sampling import SampledBatch
from ablate.refs.base import AUDIT, Reference, TokenBatch, fill_uncovered

NAN = float("nan")
MARGIN_KEYS = ("margin_err_mean", "margin_err_sd", "margin_err_max", "dpo_loss")
PENALTY_KEYS = ("kl_penalty_err_mean", "kl_penalty_err_sd")
KEYS = (*MARGIN_KEYS, *PENALTY_KEYS, "grad_cos")


@dataclass
class FidelityProbe:
    """What the fidelity audit needs besides the policy and the regime: the judge (the full reference, fp32), the
    algorithm's settings, and its data (DPO: the training pairs as DPO's batches; online: the training prompts)."""

    judge: torch.nn.Module
    tokenizer: object
    algo: object  # cfg.algo
    precision: str  # the policy's training precision
    device: torch.device
    pair_batches: list[TokenBatch] | None = None  # DPO: algo.batch_size pairs each, [chosen; rejected]
    prompts: list[str] | None = None  # GRPO/PPO: the training prompts (the first batch's come first)
    seed: int = 0  # seeds an online trainer's fresh first batch (its rollouts)
    _true_margins: torch.Tensor | None = field(default=None, repr=False)  # the judge is frozen: computed once

    # ------------------------------------------------------------------------------------------------ truth
    def truth(self, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1] float64 log-probs of the response tokens under the full reference in fp32 (no autocast)."""
        add_logprob_head(self.judge)
        return token_logprobs(self.judge, batch.to(self.device)).double()

    def regime(self, reference: Reference, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1] float64: the regime's log-probs as training receives them (uncovered rows all NaN)."""
        return reference.logprobs(batch.to(self.device), AUDIT).double()

    # -------------------------------------------------------------------------------------------- measures
    def measure(self, policy, reference: Reference, fresh: list[SampledBatch] = (), trainer=None) -> tuple[dict, dict]:
        """``kl/*`` fidelity metrics (NaN where undefined) and why each NaN is NaN. ``fresh``: the evaluation's
        policy samples, for the per-token penalty; ``trainer``: the run's trainer, whose own loss on its first
        batch gives ``grad_cos`` (and ``dpo_loss``) (:mod:`ablate.algos.loss_probe`)."""
        out, why = dict.fromkeys(KEYS, NAN), {}
        if not reference.has_reference:
            why.update(dict.fromkeys(KEYS, f"ref={reference.name} trains without a reference: nothing to audit"))
            return _logged(out), why
        margin = trainer is None or trainer.reference_use == loss_probe.SEQUENCE_MARGIN
        if margin:
            why.update(dict.fromkeys(PENALTY_KEYS, f"{self.algo.name}'s loss reads no per-token KL penalty"))
        else:
            why.update(dict.fromkeys(MARGIN_KEYS[:3], f"{self.algo.name} consumes no reference margin"))
            why["dpo_loss"] = f"{self.algo.name} does not train on the DPO loss"
        if trainer is None:
            why.update(dict.fromkeys(("dpo_loss", "grad_cos"), "no trainer to compute the loss with"))
        try:
            out.update(self.margin_errors(reference) if margin else self.penalty_errors(policy, reference, fresh))
            if trainer is not None:
                value, out["grad_cos"] = self.first_batch_loss(policy, trainer, reference)
                if margin:
                    out["dpo_loss"] = value
        except (NotImplementedError, RuntimeError) as e:  # e.g. ref=cached, miss=error, on fresh samples
            why.update({k: str(e) for k, v in out.items() if math.isnan(v)})
        for k, v in out.items():
            if math.isnan(v):
                why.setdefault(k, "undefined on this batch (no response tokens, or a constant reward)")
        return _logged(out), why

    def margin_errors(self, reference: Reference) -> dict[str, float]:
        """The regime's sequence margins on every training pair against the true ones."""
        if not self.pair_batches:
            return {}
        if self._true_margins is None:
            self._true_margins = torch.cat([_margins(self.truth(b)) for b in self.pair_batches])
        err = torch.cat([_margins(self.regime(reference, b)) for b in self.pair_batches]) - self._true_margins
        return {
            "margin_err_mean": float(err.mean()),
            "margin_err_sd": float(err.std()) if err.numel() > 1 else NAN,
            "margin_err_max": float(err.abs().max()),
        }

    def penalty_errors(self, policy, reference: Reference, fresh: list[SampledBatch]) -> dict[str, float]:
        """Per-token penalty error over the fresh samples' response tokens (the policy's log-probs as training
        computes them, the same in both penalties)."""
        errs = []
        for sb in fresh:
            batch = sb.batch.to(self.device)
            mask = batch.target_mask
            with torch.no_grad():
                lp = _policy_logprobs(policy, batch, self.precision).double()
            ref = fill_uncovered(self.regime(reference, batch), lp)
            est = self.algo.kl_estimator
            errs.append((kl_penalty(lp, ref, est) - kl_penalty(lp, self.truth(batch), est))[mask])
        if not errs:
            return {}
        e = torch.cat(errs)
        return {"kl_penalty_err_mean": float(e.mean()), "kl_penalty_err_sd": float(e.std()) if e.numel() > 1 else NAN}

    def first_batch_loss(self, policy, trainer, reference: Reference) -> tuple[float, float]:
        """The trainer's own loss on its first batch with the regime's reference log-probs (as training receives
        them) and the cosine of its gradient with the loss's gradient under the truth (same batch, same weights)."""
        first = trainer.first_batch(self)
        tokens = first.tokens.to(self.device)
        regime = reference.logprobs(tokens, AUDIT)
        truth = self.truth(tokens).to(regime.dtype)
        return _grad_cos(policy, lambda: trainer.batch_loss(first, regime), lambda: trainer.batch_loss(first, truth))


def probe_for(cfg, inputs, *, algo, pair_batches=None, prompts=None) -> FidelityProbe:
    """A probe over a run's inputs (:class:`ablate.inputs.RunInputs`) for the settings ``algo``: the judge is the
    run's frozen SFT copy, the precision the policy's training precision."""
    return FidelityProbe(
        judge=inputs.frozen_copy(),
        tokenizer=inputs.tokenizer,
        algo=algo,
        precision=cfg.model.precision,
        device=inputs.device,
        pair_batches=pair_batches,
        prompts=prompts,
        seed=cfg.seed,
    )


# ------------------------------------------------------------------------------------------------ helpers
def logged_name(key: str) -> str:
    """The ``kl/...`` name a fidelity summary key is logged under (``kl_penalty_err_mean``: ``kl/penalty_err_mean``)."""
    return "kl/" + key.removeprefix("kl_")


def _logged(values: dict[str, float]) -> dict[str, float]:
    return {logged_name(k): v for k, v in values.items()}


def _margins(token_logprobs: torch.Tensor) -> torch.Tensor:
    """[B] chosen-minus-rejected sequence log-prob margins of a DPO batch ([chosen; rejected] rows)."""
    chosen, rejected = token_logprobs.sum(1).chunk(2)
    return chosen - rejected


def _policy_logprobs(policy, batch: TokenBatch, precision: str) -> torch.Tensor:
    """[B, T-1] the policy's log-probs of the response tokens as training computes them (the fused head, in the
    training precision), with the gradient when it is enabled."""
    from ablate.algos import trl_fence

    with unwrapped_forward(policy), autocast(batch.input_ids.device, precision):
        # the head sits on the base model under a peft adapter; a TRL trainer's own (below Accelerate's wrapper) is kept
        add_logprob_head(policy.get_base_model() if hasattr(policy, "get_base_model") else policy)
        lp = trl_fence.fused_logprobs(policy, batch.input_ids, batch.attention_mask, response_labels(batch))
    return lp.float()


def _trainable(policy) -> list[torch.nn.Parameter]:
    return [p for p in policy.parameters() if p.requires_grad]


def _gradient(policy, loss_fn, keep: bool, reader=None) -> tuple[float, list[torch.Tensor]]:
    """The loss's value and (``keep``) a copy of its gradient over the trainable parameters; ``reader(params)`` reads
    the gradient in place first. The policy's own ``.grad`` is left as found."""
    params = _trainable(policy)
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    was_training = policy.training
    policy.eval()  # no dropout: the two gradients differ only by the reference
    try:
        with torch.enable_grad():
            loss = loss_fn()
            loss.backward()
        if reader is not None:
            reader(params)
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params] if keep else []
    finally:
        for p, g in zip(params, saved, strict=True):
            p.grad = g
        policy.train(was_training)
    return float(loss.detach()), grads


def _grad_cos(policy, regime_loss, true_loss) -> tuple[float, float]:
    """(the regime's loss value, cosine of its gradient with the true loss's), the cosine in float64. One gradient
    is held as a copy while the other is read in place, parameter by parameter."""
    value, g1 = _gradient(policy, regime_loss, keep=True)
    dot = n1 = n2 = 0.0

    def read(params):
        nonlocal dot, n1, n2
        for a, p in zip(g1, params, strict=True):
            b = p.grad.double() if p.grad is not None else torch.zeros_like(a, dtype=torch.float64)
            a = a.double()
            dot, n1, n2 = dot + float((a * b).sum()), n1 + float(a.pow(2).sum()), n2 + float(b.pow(2).sum())

    _gradient(policy, true_loss, keep=False, reader=read)
    return value, dot / math.sqrt(n1 * n2) if n1 > 0 and n2 > 0 else NAN
