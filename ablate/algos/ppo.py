"""PPO for RLHF, written here: TRL removed its PPO trainer in 1.13.

One step: sample one response per prompt from the policy, score it, compute the old log-probs and
values (policy + a linear value head on its last hidden state) and the regime's reference log-probs;
per-token reward = -beta * KL estimate (k1, k2 or k3; ``algo.kl_placement=reward``, the default), plus the
score on the last token; GAE; whitened advantages; then ``ppo_epochs`` passes of clipped policy and value
losses over minibatches. With ``algo.kl_placement=loss`` the reward is the score alone and each minibatch's
loss adds beta times the token mean of the estimator, differentiated (``kl_estimators.loss_penalty``; k3
times the importance ratio, as TRL's GRPO). The KL coefficient follows a fixed or adaptive controller
(Ziegler et al. 2019) on the measured sequence KL (the estimator summed over the response, at rollout).
A row the regime has no reference term for (``ref=cached``, ``miss=skip``) gets none: zero penalty, zero
loss term and gradient, and zero logged KL (``ablate.refs.base.fill_uncovered``).

The loop drives the same ``transformers.TrainerCallback`` objects the TRL trainers use, so evaluation,
reference updates and logging are shared with DPO and GRPO. The arithmetic is in ``ppo_math`` and
``kl_estimators``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import torch
from tqdm.auto import tqdm

from ablate.algos import loss_probe, registry
from ablate.algos.kl_control import make_controller
from ablate.algos.kl_estimators import covered_loss_penalty, kl_penalty, zero_gradient_warning
from ablate.algos.ppo_math import gae, masked_mean, masked_whiten, policy_loss, token_rewards, value_loss
from ablate.config import algo as schemas
from ablate.models.logprobs import logits_logprobs
from ablate.models.precision import autocast
from ablate.models.sampling import SampledBatch, sample
from ablate.refs.base import Reference, TokenBatch, data_seed, fill_uncovered
from ablate.tracking.checkpoint import checkpoints_dir

log = logging.getLogger(__name__)
STATE_FILE = "ppo_state.pt"


class ValueHead(torch.nn.Module):
    """A scalar value per position from the policy's last hidden state."""

    def __init__(self, hidden_size: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden_size, 1)
        torch.nn.init.normal_(self.proj.weight, std=1.0 / math.sqrt(hidden_size + 1))
        torch.nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden.float()).squeeze(-1)


class PPOTrainer:
    loss_extra_bytes = 0  # the loss holds nothing beyond the policy, its value head and the reference

    def __init__(
        self,
        cfg,
        *,
        policy,
        tokenizer,
        prompts: list[str],
        score_fn: Callable[[SampledBatch], list[float]],
        reference: Reference,
        callbacks,
        device: torch.device,
        gold_fn: Callable[[SampledBatch], list[float]] | None = None,
    ):
        from transformers import TrainerControl, TrainerState

        self.cfg, self.algo = cfg, cfg.algo
        self.model, self.tok, self.prompts = policy, tokenizer, prompts
        self.score_fn, self.reference, self.callbacks, self.device = score_fn, reference, list(callbacks), device
        self.gold_fn = gold_fn  # with a learned (proxy) score_fn: the gold reward, logged alongside
        self.precision = cfg.model.precision
        self.value_head = ValueHead(policy.config.hidden_size).to(device)
        policy_lr = cfg.model.adapter.learning_rate(self.algo.learning_rate)  # the adapter's is a multiple
        groups = [  # the fresh value head at the algorithm's own rate
            {"params": [p for p in policy.parameters() if p.requires_grad], "lr": policy_lr},
            {"params": list(self.value_head.parameters()), "lr": self.algo.learning_rate},
        ]
        self.optimizer = torch.optim.AdamW(groups, weight_decay=self.algo.weight_decay)
        self.beta = self.algo.beta if reference.has_reference else 0.0  # ref=none: no KL term
        self.placement = self.algo.placement()  # reward | loss
        self.kl_controller = make_controller(self.algo.kl_control, self.beta, self.algo.kl_target, self.algo.kl_horizon)
        self.state = TrainerState(max_steps=self.algo.max_steps, global_step=0)
        self.control = TrainerControl()
        self.args = SimpleNamespace(logging_steps=1, output_dir=str(checkpoints_dir(cfg.out_dir)))
        g = torch.Generator().manual_seed(data_seed(cfg))  # the run's seed but for a placebo
        self._order = torch.randperm(len(prompts), generator=g).tolist()

    # ------------------------------------------------------------------------------ pieces
    def _prompts_for(self, step: int) -> list[str]:
        n = self.algo.batch_size
        start = (step - 1) * n
        return [self.prompts[self._order[(start + i) % len(self._order)]] for i in range(n)]

    def _forward(self, batch: TokenBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """Policy log-probs of the sampled tokens and values, both [B, T-1]."""
        with autocast(self.device, self.precision):
            out = self.model(
                input_ids=batch.input_ids,
                attention_mask=batch.attention_mask,
                output_hidden_states=True,
                use_cache=False,
            )
        logp = logits_logprobs(out.logits[:, :-1], batch.input_ids[:, 1:])
        values = self.value_head(out.hidden_states[-1][:, :-1])
        return logp, values

    def _sample(self, step: int) -> SampledBatch:
        """The rollout of ``step``: one response per prompt of the step, seeded by the step."""
        (sb,) = sample(
            self.model,
            self.tok,
            self._prompts_for(step),
            max_new_tokens=self.cfg.task.max_new_tokens,
            temperature=self.algo.temperature,
            batch_size=self.algo.batch_size,
            seed=self.cfg.seed * 1_000_003 + step,
            precision=self.precision,
            max_sentences=self.cfg.task.max_sentences,
        )
        return sb

    @torch.no_grad()
    def rollout(self, step: int) -> dict:
        sb = self._sample(step)
        batch = sb.batch.to(self.device)
        if not self.reference.has_reference:
            return self._scored(sb, None)
        self.reference.prefetch([batch])  # a far reference answers while the policy scores the rollout
        return self._scored(sb, lambda: self.reference.logprobs(batch))

    @torch.no_grad()
    def _scored(self, sb: SampledBatch, raw: torch.Tensor | None) -> dict:
        """A rollout's training data from its samples and the reference's log-probs of them (``raw``, or a function
        that returns them, called after the policy's own forward; NaN rows: no reference term; None: no reference)."""
        batch = sb.batch.to(self.device)
        mask = batch.target_mask.float()
        scores = torch.tensor(self.score_fn(sb), dtype=torch.float32, device=self.device)
        was_training = self.model.training
        self.model.eval()
        old_logp, old_values = self._forward(batch)
        self.model.train(was_training)
        raw = raw() if callable(raw) else raw
        if raw is not None:  # rows it has no term for (NaN) become old_logp: zero KL and penalty
            raw = raw.to(old_logp.dtype)  # NaN rows: kept for the loss placement
            ref_logp = fill_uncovered(raw, old_logp)
        else:
            raw = ref_logp = old_logp  # no reference: zero KL, and beta is 0 anyway
        kl = kl_penalty(old_logp, ref_logp, self.algo.kl_estimator) * mask
        rewards = token_rewards(scores, kl, self.beta if self.placement == "reward" else 0.0, mask)
        adv, returns = gae(rewards, old_values, mask, self.algo.gamma, self.algo.lam)
        if self.algo.whiten_advantages:
            adv = masked_whiten(adv, mask)
        gold = self.gold_fn(sb) if self.gold_fn is not None else None
        return dict(
            batch=batch,
            mask=mask,
            old_logp=old_logp,
            old_values=old_values,
            ref_logp=raw,
            adv=adv,
            returns=returns,
            scores=scores,
            kl_seq=(kl.sum(1)),
            lengths=sb.lengths,
            gold=gold,
        )

    def _minibatches(self) -> list[torch.Tensor]:
        """The rows of each optimiser step of this rollout, in order (``ppo_epochs`` passes, seeded by the step)."""
        n, size = self.algo.batch_size, self.algo.minibatch_size
        g = torch.Generator().manual_seed(self.cfg.seed + self.state.global_step)
        perms = [torch.randperm(n, generator=g) for _ in range(self.algo.ppo_epochs)]
        return [perm[start : start + size].to(self.device) for perm in perms for start in range(0, n, size)]

    def minibatch_loss(self, data: dict, idx: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss one optimiser step minimises on rows ``idx`` of a rollout, and its parts."""
        b = data["batch"]
        logp, values = self._forward(TokenBatch(b.input_ids[idx], b.attention_mask[idx], b.completion_mask[idx]))
        m = data["mask"][idx]
        pg, clipfrac = policy_loss(logp, data["old_logp"][idx], data["adv"][idx], m, self.algo.cliprange)
        vf, vf_clipfrac = value_loss(
            values, data["old_values"][idx], data["returns"][idx], m, self.algo.cliprange_value
        )
        loss = pg + self.algo.vf_coef * vf
        parts = {"pg_loss": pg, "vf_loss": vf, "clipfrac": clipfrac, "vf_clipfrac": vf_clipfrac}
        if self.placement == "loss" and self.beta != 0.0:
            parts["kl_loss"] = self._kl_loss(logp, data, idx, m)
            loss = loss + self.beta * parts["kl_loss"]
        return loss, parts

    def optimise(self, data: dict) -> dict[str, float]:
        stats: dict[str, list[float]] = {}
        for idx in self._minibatches():
            loss, parts = self.minibatch_loss(data, idx)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(
                [p for grp in self.optimizer.param_groups for p in grp["params"]], self.algo.max_grad_norm
            )
            self.optimizer.step()
            for k, v in {"loss": loss, **parts}.items():
                stats.setdefault(k, []).append(float(v.detach()))
        return {k: sum(v) / len(v) for k, v in stats.items()}

    # ---------------------------------------------------------- the fidelity audit's (ablate.algos.loss_probe)
    reference_use = loss_probe.TOKEN_PENALTY

    def first_batch(self, probe=None) -> loss_probe.FirstBatch:
        """The first step's rollout (the same samples: each step's are seeded by the step)."""
        sb = self._sample(1)
        return loss_probe.FirstBatch(sb.batch, sb)

    def batch_loss(self, first: loss_probe.FirstBatch, ref_logps: torch.Tensor) -> torch.Tensor:
        """The loss of the first optimiser step on ``first``'s rollout scored with ``ref_logps`` as the reference."""
        data = self._scored(first.inputs, ref_logps if self.reference.has_reference else None)
        return self.minibatch_loss(data, self._minibatches()[0])[0]

    def _kl_loss(self, logp: torch.Tensor, data: dict, idx: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """The loss placement's term (before beta): the token mean of the estimator, differentiated through the
        minibatch's log-probs; rows without a reference term contribute 0 with zero gradient."""
        term = covered_loss_penalty(logp, data["ref_logp"][idx], self.algo.kl_estimator, data["old_logp"][idx])
        return masked_mean(term, mask)

    # ------------------------------------------------------------------ what resume and KL control read
    @property
    def kl_coef(self) -> float:
        """The KL coefficient now (the controller's, 0 without a reference)."""
        return float(self.beta)

    def resume_state(self) -> dict:
        """What the run's checkpoint record holds for this trainer (the rest is in ``ppo_state.pt``)."""
        return {"kl_coef": self.kl_coef, "trl_train_tokens": None}

    def restore(self, saved: dict) -> None:
        """Continue from :meth:`resume_state`'s record: the KL coefficient where the controller had taken it."""
        self.beta = self.kl_controller.value = saved["kl_coef"]

    # -------------------------------------------------------------------------------- loop
    def _call(self, event: str, **kw) -> None:
        for cb in self.callbacks:
            getattr(cb, event)(self.args, self.state, self.control, **kw)

    def save_checkpoint(self) -> Path:
        """Trainable weights, value head, optimiser and KL coefficient: everything a step depends on (each
        step's sampling and minibatch order are seeded by the step number). Then the callbacks' ``on_save``."""
        path = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
        path.mkdir(parents=True, exist_ok=True)
        state = {
            "trainable": {n: p.detach() for n, p in self.model.named_parameters() if p.requires_grad},
            "value_head": self.value_head.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "beta": self.beta,
            "step": self.state.global_step,
        }
        torch.save(state, path / (STATE_FILE + ".tmp"))
        (path / (STATE_FILE + ".tmp")).replace(path / STATE_FILE)
        self._call("on_save")
        return path

    def load_checkpoint(self, path: str | Path) -> None:
        state = torch.load(Path(path) / STATE_FILE, map_location=self.device, weights_only=True)
        missing = set(state["trainable"]) - {n for n, _ in self.model.named_parameters()}
        if missing:
            raise RuntimeError(f"checkpoint {path} does not match the policy (unknown weights {sorted(missing)[:3]})")
        self.model.load_state_dict(state["trainable"], strict=False)
        self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.beta = self.kl_controller.value = state["beta"]
        self.state.global_step = state["step"]

    def train(self, resume_from_checkpoint: str | None = None) -> None:
        if resume_from_checkpoint is not None:
            self.load_checkpoint(resume_from_checkpoint)
        self.model.train()
        self._call("on_train_begin")
        for step in tqdm(
            range(self.state.global_step + 1, self.algo.max_steps + 1),
            desc="ppo",
            unit="step",
            initial=self.state.global_step,
            total=self.algo.max_steps,
        ):
            data = self.rollout(step)
            stats = self.optimise(data)
            self.state.global_step = step
            kl = float(data["kl_seq"].mean())
            logs = {
                **stats,
                "reward": float(data["scores"].mean()),
                "kl": kl,
                "kl_coef": self.beta,
                "length": sum(data["lengths"]) / len(data["lengths"]),
                "advantage_mean": float(masked_mean(data["adv"], data["mask"])),
            }
            if data["gold"] is not None:
                logs["reward_gold"] = sum(data["gold"]) / len(data["gold"])
            if self.beta != 0.0:
                self.beta = self.kl_controller.update(kl)
            self.control.should_save = False  # the run's checkpoint callback decides (on_step_end)
            self._call("on_step_end")
            self._call("on_log", logs=logs)
            if self.control.should_save:
                self.save_checkpoint()
            if self.control.should_training_stop:
                break
        self._call("on_train_end")

    def save_model(self, path: str) -> None:
        Path(path).mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(path)
        from safetensors.torch import save_file

        save_file(self.value_head.state_dict(), str(Path(path) / "value_head.safetensors"))


def build_trainer(cfg, *, policy, tokenizer, prompts, reward, reference: Reference, callbacks, device, proxy=None, **_):
    """``proxy``: a learned reward to train on; the gold reward is then logged alongside as ``reward_gold``.
    Registered as is (the registry's other keywords are ignored)."""
    warning = zero_gradient_warning(cfg.algo.kl_estimator, cfg.algo.placement())
    if warning:
        log.warning(warning)
    gold = lambda sb: reward(sb.texts, sb.prompts)  # noqa: E731
    if proxy is None:
        return PPOTrainer(
            cfg,
            policy=policy,
            tokenizer=tokenizer,
            prompts=prompts,
            score_fn=gold,
            reference=reference,
            callbacks=callbacks,
            device=device,
        )
    return PPOTrainer(
        cfg,
        policy=policy,
        tokenizer=tokenizer,
        prompts=prompts,
        score_fn=lambda sb: proxy(sb.texts, sb.prompts),
        reference=reference,
        callbacks=callbacks,
        device=device,
        gold_fn=gold,
    )


registry.register("ppo", build_trainer, schema=schemas.PPOAlgoConfig, rank=20)
