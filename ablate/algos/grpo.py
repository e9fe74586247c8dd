"""GRPO through TRL's ``GRPOTrainer``, with the regime's reference.

TRL has no ``ref_model`` argument for GRPO and loads its own copy whenever beta > 0; the trainer base in
:mod:`ablate.algos.trl_fence` keeps TRL from loading one and answers TRL's reference call with the
regime's log-probs (:meth:`reference_token_logps` here). The KL coefficient can follow a controller
(fixed or adaptive), updated from TRL's measured per-token KL after every logged step.

Where the KL goes (``algo.kl_placement``, with ``algo.kl_estimator`` k1 | k2 | k3; see
``ablate.algos.kl_estimators``):

- ``loss`` with k3 (the default): TRL's own term, unchanged (k3 times the importance ratio, TRL's
  ``use_bias_correction_kl``). With k1 or k2: TRL's loss without its term, plus beta times our per-token
  estimator (:func:`~ablate.algos.kl_estimators.loss_penalty`), summed as TRL sums its per-token loss;
  k1 there is the zero-gradient ablation (asked for explicitly; a warning at start says so).
- ``reward`` (the default for k1): each completion's reward becomes r_i - beta * sum_t k_t over its tokens,
  detached, before TRL's group normalisation of advantages (one more reward function, ``kl_penalty``), and
  TRL's loss has no KL term.

The logged ``kl`` is the mean per-token value of the run's estimator. Rows the regime has no reference term
for (``ref=cached``, ``miss=skip``: all-NaN rows) contribute no KL: TRL's k3 sees the policy's own loss-time
log-probs there, detached (its term is exactly 0 with zero gradient); our loss term and the reward penalty
are exactly 0 there, with zero gradient.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ablate.algos import loss_probe, registry, trl_fence
from ablate.algos.kl_control import make_controller
from ablate.algos.kl_estimators import covered_loss_penalty, kl_penalty, reward_penalty, zero_gradient_warning
from ablate.algos.trl_common import common_args
from ablate.config import algo as schemas
from ablate.refs.base import AUDIT, Reference, TokenBatch, fill_uncovered

log = logging.getLogger(__name__)
_RegimeRef = trl_fence.RegimeRefSlot  # where TRL keeps its reference model (tests check it is there)


def _grpo_trainer_cls():
    class RegimeGRPOTrainer(_LossProbe, trl_fence.grpo_base()):
        def __init__(
            self,
            *args,
            reference: Reference,
            beta: float,
            kl_estimator: str = "k3",
            kl_placement: str = "loss",
            kl_controller=None,
            **kwargs,
        ):
            self.reference = reference
            self.kl_estimator, self.kl_placement = kl_estimator, kl_placement
            self.kl_in_loss = kl_placement == "loss" and kl_estimator == "k3"  # TRL's own term
            self.kl_controller = kl_controller
            self._penalty: torch.Tensor | None = None  # the last rollout's per-completion reward penalty
            if kl_placement == "reward" and beta != 0.0:
                kwargs["reward_funcs"], kwargs["args"] = self._with_kl_penalty(kwargs["reward_funcs"], kwargs["args"])
            if kl_placement == "loss" and not self.kl_in_loss and kwargs["args"].loss_type != "dapo":
                raise ValueError(f"kl_estimator={kl_estimator} in the loss needs TRL's loss_type=dapo")
            super().__init__(*args, beta=beta, **kwargs)

        def _with_kl_penalty(self, reward_funcs, args):
            """The KL in the reward: one more reward function, ``kl_penalty`` (weight 1), whose value for each
            completion is -beta * its estimator summed over its tokens. TRL sums the weighted rewards before it
            normalises them per group, and logs ``rewards/kl_penalty/mean``; the other functions' logs stay raw."""
            if args.multi_objective_aggregation != "sum_then_normalize":
                raise ValueError(
                    "kl_placement=reward subtracts the penalty from the summed reward: it needs TRL's "
                    f"multi_objective_aggregation=sum_then_normalize, not {args.multi_objective_aggregation}"
                )
            trainer = self

            def kl_penalty(prompts, completions, **kwargs) -> list[float]:
                return trainer._take_penalty(len(completions))

            funcs = list(reward_funcs) if isinstance(reward_funcs, list) else [reward_funcs]
            if args.reward_weights is not None:
                args.reward_weights = [*args.reward_weights, 1.0]
            return [*funcs, kl_penalty], args

        def _take_penalty(self, n: int) -> list[float]:
            """The penalties computed with this rollout's reference log-probs (consumed: never reused); zeros
            while beta is 0 (TRL then asks for no reference log-probs)."""
            penalty, self._penalty = self._penalty, None
            if penalty is None and self.beta == 0.0:
                return [0.0] * n
            if penalty is None or penalty.numel() != n:
                raise RuntimeError("kl_placement=reward: no reference log-probs were computed for this rollout")
            return penalty.tolist()

        def _log_kl(self, values: torch.Tensor, mask: torch.Tensor) -> None:
            """The mean per-token estimator over the (all processes') masked tokens, logged as ``kl``."""
            total = (values.detach() * mask).sum()
            totals = self.accelerator.reduce(torch.stack([total, mask.sum()]).float(), reduction="sum")
            self.log_metric("kl", (totals[0] / totals[1].clamp(min=1.0)).item())

        def _record_penalty(self, policy_logps, ref_logps, mask) -> None:
            """At rollout: each completion's reward penalty, and the mean per-token estimator as ``kl``."""
            ref_logps, mask = fill_uncovered(ref_logps, policy_logps), mask.to(policy_logps.dtype)  # uncovered: 0
            self._penalty = reward_penalty(policy_logps, ref_logps, mask, self.beta, self.kl_estimator).float()
            self._log_kl(kl_penalty(policy_logps, ref_logps, self.kl_estimator), mask)

        def loss_reference(self, ref_logps, policy_logps):
            """TRL's k3: uncovered reference rows become the loss-time policy log-probs, detached (TRL's k3 term
            is then exactly 0 with zero gradient)."""
            return fill_uncovered(ref_logps, policy_logps)

        def loss_kl(self, policy_logps, ref_logps, mask):
            """k1 or k2 in the loss: the per-token estimator, differentiated; 0 with zero gradient on rows
            without a reference term. None under the reward placement."""
            if self.kl_placement != "loss":
                return None
            term = covered_loss_penalty(policy_logps, ref_logps, self.kl_estimator)
            self._log_kl(term, mask.to(term.dtype))
            return term

        def reference_token_logps(self, input_ids, attention_mask, logits_to_keep, batch_size):
            """The regime's answer to TRL's reference call (uncovered rows stay NaN); under the reward placement,
            also the rollout's penalties, from the policy's log-probs computed here as TRL computes its own."""
            completion = torch.zeros_like(attention_mask)
            completion[:, -logits_to_keep:] = attention_mask[:, -logits_to_keep:]
            logps = self.reference.logprobs(TokenBatch(input_ids, attention_mask, completion))[:, -logits_to_keep:]
            if self.kl_placement == "reward":
                policy_logps = self.policy_token_logps(input_ids, attention_mask, logits_to_keep, batch_size)
                self._record_penalty(policy_logps, logps.to(policy_logps.dtype), completion[:, -logits_to_keep:])
            return logps

        def _get_train_sampler(self, dataset=None):
            return replayable_epochs(super()._get_train_sampler(dataset), self.args.data_seed)

        def restore(self, saved: dict) -> None:
            """Continue from :meth:`resume_state`'s record: also the KL coefficient where the controller had it."""
            super().restore(saved)
            self.beta = saved["kl_coef"]
            if self.kl_controller is not None:
                self.kl_controller.value = saved["kl_coef"]

    return RegimeGRPOTrainer


class _LossProbe:
    """The GRPO trainer's side of the fidelity audit (:mod:`ablate.algos.loss_probe`), mixed into it."""

    reference_use = loss_probe.TOKEN_PENALTY

    def first_batch(self, probe) -> loss_probe.FirstBatch:
        """Rollouts of the first step's prompts, drawn by TRL as it draws them (seeded by the probe)."""
        rows, regime = loss_probe.first_train_batch(self), self.reference
        inputs = self._scored(rows, probe.seed, _Answers(lambda batch: regime.logprobs(batch, AUDIT)))
        prompt, completion = inputs["prompt_mask"], inputs["completion_mask"]
        tokens = TokenBatch(
            torch.cat([inputs["prompt_ids"], inputs["completion_ids"]], 1),
            torch.cat([prompt, completion], 1),
            torch.cat([torch.zeros_like(prompt), completion], 1),
        )
        return loss_probe.FirstBatch(tokens, (rows, probe.seed))

    def batch_loss(self, first: loss_probe.FirstBatch, ref_logps: torch.Tensor) -> torch.Tensor:
        """TRL's loss on ``first``'s rollouts, scored again (the same samples) with ``ref_logps`` as the
        reference: its KL term, or under the reward placement its penalties and so the advantages."""
        rows, seed = first.inputs
        inputs = self._scored(rows, seed, _Answers(lambda batch: ref_logps))
        with loss_probe.untracked(self), self.compute_loss_context_manager():
            return self.compute_loss(self.model, inputs)

    def _scored(self, rows: list, seed: int, reference) -> dict:
        """TRL's generated and scored batch for ``rows`` with ``reference`` answering its reference call, with
        the random state forked and seeded (the same samples every time), leaving no trace in the logs."""
        saved, self.reference = self.reference, reference
        try:
            with torch.random.fork_rng(devices=[]), loss_probe.untracked(self):
                torch.manual_seed(seed)
                return self._generate_and_score_completions(rows)
        finally:
            self.reference = saved


class _Answers:
    """A reference for the audit's rollouts: ``answer(batch)`` gives its log-probs (uncounted as training cost)."""

    has_reference = True

    def __init__(self, answer):
        self.logprobs = answer


def replayable_epochs(sampler, data_seed: int | None = None):
    """TRL's ``RepeatSampler`` with each epoch's prompt order a function of (data seed, epoch).

    TRL seeds the sampler with the run's ``seed``, not ``data_seed``, so a placebo (``ref=placebo``: only the data
    order's seed moves) trained on full's very order, a determinism check instead of a null control that can fail
    (found by its first SmolLM2 runs: identical to full to the last digit; docs/measured.md). ``data_seed``, where
    given, seeds the order, as it does for DPO's sampler and PPO's prompts; for every other run it equals ``seed``.

    TRL draws every epoch's order from one generator seeded once, when the sampler is made, so a job resumed in
    epoch e >= 1 starts a fresh generator and trains epoch e in epoch 0's order, leaving the uninterrupted run's
    path (how it was found: docs/measured.md). ``set_epoch(e)``, which the HF Trainer calls before each epoch, resumed or not, reseeds
    the generator and draws the e orders before it: the order an uninterrupted run draws, so a run that was never
    interrupted is unchanged. The sampler's internals read here are TRL's: :data:`ablate.algos.trl_fence.CONTRACT`
    checks them at start-up."""
    if not getattr(sampler, "shuffle", False) or getattr(sampler, "seed", None) is None:
        return sampler
    if data_seed is not None and data_seed != sampler.seed:
        sampler.seed = data_seed
        sampler.generator.manual_seed(data_seed)

    def set_epoch(epoch: int) -> None:
        sampler.generator.manual_seed(sampler.seed)
        for _ in range(epoch):
            torch.randperm(sampler.num_samples, generator=sampler.generator)

    sampler.set_epoch = set_epoch
    return sampler


def prompts_dataset(prompts: list[str]):
    from datasets import Dataset

    from ablate.tasks.prompts import as_chat

    return Dataset.from_list([{"prompt": as_chat(p)} for p in prompts])


def _texts(completions) -> list[str]:
    return [c[-1]["content"] if isinstance(c, list) else c for c in completions]


def _user_prompts(prompts) -> list[str]:
    """The harness's prompt strings of TRL's conversational prompts (:func:`ablate.tasks.prompts.from_chat`)."""
    from ablate.tasks.prompts import from_chat

    return [from_chat(p) if isinstance(p, list) else p for p in prompts]


def gold_reward_fn(reward):
    def gold(prompts, completions, **kwargs) -> list[float]:
        return reward(_texts(completions), _user_prompts(prompts))

    return gold


def proxy_reward_fn(proxy):
    def proxy_rm(prompts, completions, **kwargs) -> list[float]:
        return proxy(_texts(completions), _user_prompts(prompts))

    return proxy_rm


def trl_args(cfg, out_dir: Path, device: torch.device, reward_weights: list[float] | None = None):
    from trl import GRPOConfig

    algo = cfg.algo
    return GRPOConfig(
        **common_args(cfg, out_dir, device),
        num_generations=algo.num_generations,
        max_completion_length=cfg.task.max_new_tokens,
        temperature=algo.temperature,
        top_k=0,
        top_p=1.0,
        mask_truncated_completions=False,  # completions cut by the task's stop rule have no EOS: they still train
        beta=0.0,  # the real beta goes to the trainer (see ablate.algos.trl_fence.grpo_base)
        loss_type="dapo",  # TRL's default, written out: our own KL loss term is summed as its loss (trl_fence)
        reward_weights=reward_weights,
    )


def kl_control_callback(controller):
    """Updates the trainer's beta from TRL's logged per-token KL; listed first so the logs carry ``kl_coef``."""
    from transformers import TrainerCallback

    class _KLControl(TrainerCallback):
        trainer = None

        def on_log(self, args, state, control, logs=None, **kw):
            t = self.trainer
            if t is None or not logs or t.beta == 0.0:
                return
            if "kl" in logs:
                t.beta = controller.update(float(logs["kl"]), n_steps=args.logging_steps)
            logs["kl_coef"] = t.beta

    return _KLControl()


def build_trainer(
    cfg,
    *,
    policy,
    tokenizer,
    prompts,
    reward,
    reference: Reference,
    callbacks,
    out_dir: Path,
    device: torch.device,
    proxy=None,
    **_,
):
    """``proxy``: a learned reward to train on; the gold reward is then computed and logged with weight 0. Registered
    as is (the registry's other keywords are ignored)."""
    algo = cfg.algo
    warning = zero_gradient_warning(algo.kl_estimator, algo.placement())
    if warning:
        log.warning(warning)
    beta = algo.beta if reference.has_reference else 0.0  # ref=none: no reference term
    controller = make_controller(algo.kl_control, beta, algo.kl_target, algo.kl_horizon)
    kl_cb = kl_control_callback(controller)
    if proxy is None:
        funcs, weights = [gold_reward_fn(reward)], None
    else:
        funcs, weights = [proxy_reward_fn(proxy), gold_reward_fn(reward)], [1.0, 0.0]
    trainer = _grpo_trainer_cls()(
        model=policy,
        reward_funcs=funcs,
        args=trl_args(cfg, out_dir, device, weights),
        train_dataset=prompts_dataset(prompts),
        processing_class=tokenizer,
        reference=reference,
        beta=beta,
        kl_estimator=algo.kl_estimator,
        kl_placement=algo.placement(),
        kl_controller=controller,
        callbacks=[kl_cb, *callbacks],
    )
    kl_cb.trainer = trainer
    trainer.max_sentences = cfg.task.max_sentences  # the task's stop rule cuts TRL's rollouts too
    return trainer


registry.register("grpo", build_trainer, schema=schemas.GRPOAlgoConfig, rank=30)
