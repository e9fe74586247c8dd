"""GRPO through TRL's ``GRPOTrainer``, with the regime's reference.

TRL has no ``ref_model`` argument for GRPO and loads its own copy whenever beta > 0. The subclass
builds TRL with beta = 0 (so TRL loads nothing), then restores beta and installs a placeholder as
``ref_model``; TRL's one call for reference log-probs, ``_get_per_token_logps_and_entropies(
self.ref_model, ...)``, is answered by the regime. The KL coefficient can follow a controller
(fixed or adaptive), updated from TRL's measured per-token KL after every logged step.
"""

from __future__ import annotations

from ablate.algos.trl_common import common_args
from ablate.config import value_of
from pathlib import Path

import torch

from ablate.algos.kl_control import make_controller
from ablate.refs.base import Reference, TokenBatch


class _RegimeRef(torch.nn.Module):
    """Stands where TRL keeps its reference model; never called as a model."""


def _grpo_trainer_cls():
    from trl import GRPOTrainer

    class RegimeGRPOTrainer(GRPOTrainer):
        def __init__(self, *args, reference: Reference, beta: float, kl_estimator: str = "k3", **kwargs):
            self.reference = reference
            self.kl_estimator = kl_estimator
            super().__init__(*args, **kwargs)  # built with beta = 0: TRL loads no reference model
            self.beta = beta
            self.ref_model = _RegimeRef() if beta != 0.0 else None

        def _compute_loss(self, model, inputs):
            """k3 (TRL's own): unchanged. k1: TRL computes the loss without its KL term, and beta times the
            sum of k1 = log pi - log ref over completion tokens is added with TRL's ``dapo`` normaliser (its
            default loss type), using the policy log-probs TRL computed for the loss (so gradients flow)."""
            if self.kl_estimator != "k1" or self.beta == 0.0:
                return super()._compute_loss(model, inputs)
            if self.loss_type != "dapo":
                raise ValueError(f"kl_estimator=k1 is implemented for TRL's dapo loss only, not {self.loss_type}")
            captured = {}
            original = self._get_per_token_logps_and_entropies

            def capture(m, *args, **kwargs):
                out = original(m, *args, **kwargs)
                if m is model:
                    captured.setdefault("logps", out[0])
                return out

            beta, self.beta = self.beta, 0.0
            self._get_per_token_logps_and_entropies = capture
            try:
                loss = super()._compute_loss(model, inputs)
            finally:
                self.beta = beta
                del self._get_per_token_logps_and_entropies  # back to the class's method
            mask = inputs["completion_mask"]
            k1 = captured["logps"] - inputs["ref_per_token_logps"]
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if self.model.training:
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            mode = "train" if self.model.training else "eval"
            self._metrics[mode]["kl"].append(float(((k1 * mask).sum() / mask.sum().clamp(min=1.0)).detach()))
            return loss + beta * (k1 * mask).sum() / normalizer

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, *args, **kwargs):
            if not isinstance(model, _RegimeRef):
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy, *args, **kwargs)
            completion = torch.zeros_like(attention_mask)
            completion[:, -logits_to_keep:] = attention_mask[:, -logits_to_keep:]
            logps = self.reference.logprobs(TokenBatch(input_ids, attention_mask, completion))
            return logps[:, -logits_to_keep:], None, None

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


def build_trainer(cfg, *, policy, tokenizer, prompts, reward, reference: Reference, callbacks, out_dir: Path,
                  device: torch.device, proxy=None):
    """``proxy``: a learned reward to train on; the gold reward is then computed and logged with weight 0."""
    algo = cfg.algo
    beta = algo.beta if reference.has_reference else 0.0  # ref=none: no reference term
    controller = make_controller(value_of(algo.kl_control), beta, algo.kl_target,
                                 algo.kl_horizon)
    kl_cb = kl_control_callback(controller)
    if proxy is None:
        funcs, weights = [gold_reward_fn(reward)], None
    else:
        funcs, weights = [proxy_reward_fn(proxy), gold_reward_fn(reward)], [1.0, 0.0]
    trainer = _grpo_trainer_cls()(model=policy, reward_funcs=funcs,
                                  args=trl_args(cfg, out_dir, device, weights), train_dataset=prompts_dataset(prompts),
                                  processing_class=tokenizer, reference=reference, beta=beta,
                                  kl_estimator=value_of(algo.kl_estimator),
                                  callbacks=[kl_cb, *callbacks])
    kl_cb.trainer = trainer
    trainer.kl_controller = controller
    return trainer
