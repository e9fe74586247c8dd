"""GRPO through TRL's ``GRPOTrainer``, with the regime's reference.

TRL has no ``ref_model`` argument for GRPO and loads its own copy whenever beta > 0. The subclass
builds TRL with beta = 0 (so TRL loads nothing), then restores beta and installs a placeholder as
``ref_model``; TRL's one call for reference log-probs, ``_get_per_token_logps_and_entropies(
self.ref_model, ...)``, is answered by the regime. The KL coefficient can follow a controller
(fixed or adaptive), updated from TRL's measured per-token KL after every logged step.

KL estimators (``algo.kl_estimator``): ``k3`` is TRL's own term in the loss, unchanged. ``k1`` enters the
REWARD, as in PPO (see ``ablate.algos.kl_estimators``): each completion's reward becomes
r_i - beta * sum_t (log pi - log ref) over its tokens, detached, before TRL's group normalisation of
advantages, and TRL's loss is computed without a KL term; the logged ``kl`` is the mean per-token k1.

Rows the regime has no reference term for (``ref=cached``, ``miss=skip``: all-NaN rows) contribute no KL:
under k3 their reference log-probs become the policy's own loss-time log-probs, detached, inside the loss
(TRL's k3 term is then exactly 0 with zero gradient); under k1 their k1 is 0.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ablate.algos.kl_control import make_controller
from ablate.algos.kl_estimators import k1_reward_penalty
from ablate.algos.trl_common import common_args
from ablate.config import value_of
from ablate.refs.base import Reference, TokenBatch, fill_uncovered


class _RegimeRef(torch.nn.Module):
    """Stands where TRL keeps its reference model; never called as a model."""


def _grpo_trainer_cls():
    from trl import GRPOTrainer

    class RegimeGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, reference: Reference, beta: float, kl_estimator: str = "k3", **kwargs):
            self.reference = reference
            self.kl_estimator = kl_estimator
            self._loss_inputs: dict | None = None  # the inputs of the loss being computed (k3 fills their ref)
            self._k1_penalty: torch.Tensor | None = None  # the last rollout's per-completion k1 reward penalty
            if kl_estimator == "k1" and beta != 0.0:
                kwargs["reward_funcs"], kwargs["args"] = self._with_kl_penalty(kwargs["reward_funcs"], kwargs["args"])
            super().__init__(*args, **kwargs)  # built with beta = 0: TRL loads no reference model
            self.beta = beta
            self.ref_model = _RegimeRef() if beta != 0.0 else None

        def _with_kl_penalty(self, reward_funcs, args):
            """k1 in the reward: one more reward function, ``kl_penalty`` (weight 1), whose value for each
            completion is -beta * its k1 summed over its tokens. TRL sums the weighted rewards before it
            normalises them per group, and logs ``rewards/kl_penalty/mean``; the other functions' logs stay raw."""
            if args.multi_objective_aggregation != "sum_then_normalize":
                raise ValueError(
                    "kl_estimator=k1 subtracts the penalty from the summed reward: it needs TRL's "
                    f"multi_objective_aggregation=sum_then_normalize, not {args.multi_objective_aggregation}"
                )
            trainer = self

            def kl_penalty(prompts, completions, **kwargs) -> list[float]:
                return trainer._take_k1_penalty(len(completions))

            funcs = list(reward_funcs) if isinstance(reward_funcs, list) else [reward_funcs]
            if args.reward_weights is not None:
                args.reward_weights = [*args.reward_weights, 1.0]
            return [*funcs, kl_penalty], args

        def _take_k1_penalty(self, n: int) -> list[float]:
            """The penalties computed with this rollout's reference log-probs (consumed: never reused); zeros
            while beta is 0 (TRL then asks for no reference log-probs)."""
            penalty, self._k1_penalty = self._k1_penalty, None
            if penalty is None and self.beta == 0.0:
                return [0.0] * n
            if penalty is None or penalty.numel() != n:
                raise RuntimeError("kl_estimator=k1: no reference log-probs were computed for this rollout")
            return penalty.tolist()

        def _record_k1(self, policy_logps, ref_logps, mask) -> None:
            """At rollout: the k1 reward penalty of each completion, and the mean per-token k1 as ``kl``."""
            ref_logps, mask = fill_uncovered(ref_logps, policy_logps), mask.to(policy_logps.dtype)  # uncovered: k1 = 0
            self._k1_penalty = k1_reward_penalty(policy_logps, ref_logps, mask, self.beta).float()
            k1 = ((policy_logps - ref_logps) * mask).sum()
            totals = self.accelerator.reduce(torch.stack([k1, mask.sum()]).float(), reduction="sum")
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["kl"].append((totals[0] / totals[1].clamp(min=1.0)).item())

        def _compute_loss(self, model, inputs):
            """k3: TRL's loss, with uncovered reference rows filled from the loss-time policy log-probs (see
            ``_get_per_token_logps_and_entropies``). k1: TRL's loss without its KL term (the penalty is in
            the advantages already)."""
            if self.kl_estimator == "k1" and self.beta != 0.0:
                beta, self.beta = self.beta, 0.0
                try:
                    return super()._compute_loss(model, inputs)
                finally:
                    self.beta = beta
            self._loss_inputs = dict(inputs)
            try:
                return super()._compute_loss(model, self._loss_inputs)
            finally:
                self._loss_inputs = None

        def _get_per_token_logps_and_entropies(
            self,
            model,
            input_ids,
            attention_mask,
            logits_to_keep,
            batch_size=None,
            compute_entropy=False,
            *args,
            **kwargs,
        ):
            if isinstance(model, _RegimeRef):
                return self._regime_logps(input_ids, attention_mask, logits_to_keep, batch_size)
            out = super()._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, *args, **kwargs
            )
            inputs = self._loss_inputs
            if inputs is not None and inputs.get("ref_per_token_logps") is not None:  # TRL reads it next
                inputs["ref_per_token_logps"] = fill_uncovered(inputs["ref_per_token_logps"], out[0])
            return out

        def _regime_logps(self, input_ids, attention_mask, logits_to_keep, batch_size):
            """The regime's answer to TRL's reference call (uncovered rows stay NaN); under k1, also the
            rollout's k1 penalties, from the policy's log-probs computed here as TRL computes its own."""
            completion = torch.zeros_like(attention_mask)
            completion[:, -logits_to_keep:] = attention_mask[:, -logits_to_keep:]
            logps = self.reference.logprobs(TokenBatch(input_ids, attention_mask, completion))[:, -logits_to_keep:]
            if self.kl_estimator == "k1":
                policy_logps, _, _ = super()._get_per_token_logps_and_entropies(
                    self.model, input_ids, attention_mask, logits_to_keep, batch_size
                )
                self._record_k1(policy_logps, logps.to(policy_logps.dtype), completion[:, -logits_to_keep:])
            return logps, None, None

    return RegimeGRPOTrainer


def prompts_dataset(prompts: list[str]):
    from datasets import Dataset

    return Dataset.from_list([{"prompt": [{"role": "user", "content": p}]} for p in prompts])


def _texts(completions) -> list[str]:
    return [c[-1]["content"] if isinstance(c, list) else c for c in completions]


def _user_prompts(prompts) -> list[str]:
    return [p[-1]["content"] if isinstance(p, list) else p for p in prompts]


def gold_reward_fn(reward):
    def gold(prompts, completions, **kwargs) -> list[float]:
        return reward(_texts(completions))

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
        beta=0.0,  # see RegimeGRPOTrainer: the real beta is set after TRL's init
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
):
    """``proxy``: a learned reward to train on; the gold reward is then computed and logged with weight 0."""
    algo = cfg.algo
    beta = algo.beta if reference.has_reference else 0.0  # ref=none: no reference term
    controller = make_controller(value_of(algo.kl_control), beta, algo.kl_target, algo.kl_horizon)
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
        kl_estimator=value_of(algo.kl_estimator),
        callbacks=[kl_cb, *callbacks],
    )
    kl_cb.trainer = trainer
    trainer.kl_controller = controller
    return trainer
