"""GRPO through TRL's ``GRPOTrainer``, with the regime's reference.

TRL has no ``ref_model`` argument for GRPO and loads its own copy whenever beta > 0; the trainer base in
:mod:`ablate.algos.trl_fence` keeps TRL from loading one and answers TRL's reference call with the
regime's log-probs (:meth:`reference_token_logps` here). The KL coefficient can follow a controller
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

from ablate.algos import registry, trl_fence
from ablate.algos.kl_control import make_controller
from ablate.algos.kl_estimators import k1_reward_penalty
from ablate.algos.trl_common import common_args
from ablate.refs.base import Reference, TokenBatch, fill_uncovered

_RegimeRef = trl_fence.RegimeRefSlot  # where TRL keeps its reference model (tests check it is there)


def _grpo_trainer_cls():
    class RegimeGRPOTrainer(trl_fence.grpo_base()):
        def __init__(
            self, *args, reference: Reference, beta: float, kl_estimator: str = "k3", kl_controller=None, **kwargs
        ):
            self.reference = reference
            self.kl_estimator = kl_estimator
            self.kl_in_loss = kl_estimator != "k1"  # k1: the penalty is in the reward (advantages) instead
            self.kl_controller = kl_controller
            self._k1_penalty: torch.Tensor | None = None  # the last rollout's per-completion k1 reward penalty
            if kl_estimator == "k1" and beta != 0.0:
                kwargs["reward_funcs"], kwargs["args"] = self._with_kl_penalty(kwargs["reward_funcs"], kwargs["args"])
            super().__init__(*args, beta=beta, **kwargs)

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
            self.log_metric("kl", (totals[0] / totals[1].clamp(min=1.0)).item())

        def loss_reference(self, ref_logps, policy_logps):
            """k3: uncovered reference rows become the loss-time policy log-probs, detached (TRL's k3 term is
            then exactly 0 with zero gradient)."""
            return fill_uncovered(ref_logps, policy_logps)

        def reference_token_logps(self, input_ids, attention_mask, logits_to_keep, batch_size):
            """The regime's answer to TRL's reference call (uncovered rows stay NaN); under k1, also the
            rollout's k1 penalties, from the policy's log-probs computed here as TRL computes its own."""
            completion = torch.zeros_like(attention_mask)
            completion[:, -logits_to_keep:] = attention_mask[:, -logits_to_keep:]
            logps = self.reference.logprobs(TokenBatch(input_ids, attention_mask, completion))[:, -logits_to_keep:]
            if self.kl_estimator == "k1":
                policy_logps = self.policy_token_logps(input_ids, attention_mask, logits_to_keep, batch_size)
                self._record_k1(policy_logps, logps.to(policy_logps.dtype), completion[:, -logits_to_keep:])
            return logps

        def restore(self, saved: dict) -> None:
            """Continue from :meth:`resume_state`'s record: also the KL coefficient where the controller had it."""
            super().restore(saved)
            self.beta = saved["kl_coef"]
            if self.kl_controller is not None:
                self.kl_controller.value = saved["kl_coef"]

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
        beta=0.0,  # the real beta goes to the trainer (see ablate.algos.trl_fence.grpo_base)
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
        kl_controller=controller,
        callbacks=[kl_cb, *callbacks],
    )
    kl_cb.trainer = trainer
    trainer.max_sentences = cfg.task.max_sentences  # the task's stop rule cuts TRL's rollouts too
    return trainer


registry.register("grpo", build_trainer)
