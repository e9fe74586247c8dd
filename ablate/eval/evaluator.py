"""The evaluation every algorithm shares: sample from the policy on held-out prompts and audit it.

The evaluator holds its own frozen copy of the SFT model. It is the judge of truth for KL (the
full reference, whatever regime the run trained with) and the baseline the win rate is measured
against. Nothing it does is counted in the regime's cost.
"""

from __future__ import annotations

from ablate.config import value_of
import math
from dataclasses import dataclass, field

import torch

from ablate.eval import kl as klm
from ablate.eval import metrics as mm
from ablate.models.precision import autocast, unwrapped_forward
from ablate.models.sampling import SampledBatch, sample
from ablate.refs.base import Reference, TokenBatch
from ablate.refs.model_backed import freeze, next_token_logprobs


@dataclass
class EvalResult:
    step: int
    metrics: dict[str, float]
    samples: list[dict]
    nan_reasons: dict[str, str] = field(default_factory=dict)


class Evaluator:
    def __init__(self, *, judge: torch.nn.Module, tokenizer, prompts: list[str], heldout: list[str], reward, safety,
                 eval_cfg, task_cfg, precision, device: torch.device, proxy=None):
        self.judge = freeze(judge)
        self.tok = tokenizer
        self.prompts = prompts
        self.heldout = heldout
        self.reward = reward
        self.safety = safety
        self.cfg = eval_cfg
        self.task = task_cfg
        self.precision = value_of(precision)  # sampling precision (the policy's)
        self.scoring = value_of(eval_cfg.scoring_precision)
        self.device = device
        self._sft: dict | None = None
        self.proxy = proxy  # a learned reward, if the run trains on one: reported as eval/reward_proxy

    # ------------------------------------------------------------------------------------ sampling
    def _sample(self, model, seed: int, desc: str) -> list[SampledBatch]:
        # sampled in the policy's precision (our autocast), outside Accelerate's per-call wrapper
        with unwrapped_forward(model):
            return sample(model, self.tok, self.prompts, max_new_tokens=self.task.max_new_tokens,
                          temperature=self.task.temperature, batch_size=self.cfg.batch_size, seed=seed,
                          precision=self.precision, desc=desc)

    def sft_baseline(self) -> dict:
        """The SFT model's responses to the evaluation prompts, sampled once (another seed than the policy's)."""
        if self._sft is None:
            texts = [t for b in self._sample(self.judge, self.cfg.seed + 1, "eval: SFT baseline") for t in b.texts]
            self._sft = {"texts": texts, "rewards": self.reward(texts), "unsafe": self.safety.probs(texts)}
        return self._sft

    # ------------------------------------------------------------------------------------- scoring
    def _policy_logprobs(self, policy, batch: TokenBatch) -> torch.Tensor:
        with torch.no_grad(), unwrapped_forward(policy):
            logits = policy(input_ids=batch.input_ids, attention_mask=batch.attention_mask, use_cache=False).logits
        return torch.log_softmax(logits[:, :-1].float(), dim=-1)

    def perplexity(self, policy) -> float:
        """exp of the token-weighted mean NLL of the policy on held-out plain text."""
        nll, n = 0.0, 0
        was_training = policy.training
        policy.eval()
        try:
            for i in range(0, len(self.heldout), self.cfg.batch_size):
                enc = self.tok(self.heldout[i:i + self.cfg.batch_size], return_tensors="pt", padding=True).to(self.device)
                with torch.no_grad(), autocast(self.device, self.scoring), unwrapped_forward(policy):
                    logits = policy(**enc, use_cache=False).logits
                lp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
                tgt = enc["input_ids"][:, 1:]
                mask = enc["attention_mask"][:, 1:].bool() & enc["attention_mask"][:, :-1].bool()
                tok_lp = lp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
                nll -= tok_lp[mask].double().sum().item()
                n += int(mask.sum())
        finally:
            policy.train(was_training)
        return math.exp(nll / n) if n else float("nan")

    def evaluate(self, policy, reference: Reference, step: int) -> EvalResult:
        sft = self.sft_baseline()
        was_training = policy.training
        policy.eval()
        reasons: dict[str, str] = {}
        approx_ok = reference.has_reference
        if not approx_ok:
            reasons["kl_approx"] = f"ref={reference.name} trains without a reference: there is no approximate KL"
        per_sample: dict[str, list[float]] = {k: [] for k in ("kl", "k1", "k3", "kl_approx", "len")}
        texts: list[str] = []
        err_sq, err_abs, err_max, err_n = 0.0, 0.0, 0.0, 0
        try:
            for sb in self._sample(policy, self.cfg.seed, f"eval@{step}: sampling"):
                texts += sb.texts
                batch = sb.batch.to(self.device)
                mask = batch.target_mask
                tokens = batch.input_ids[:, 1:]
                with autocast(self.device, self.scoring):
                    pol = self._policy_logprobs(policy, batch)
                    true = next_token_logprobs(self.judge, batch)
                    per_sample["kl"] += klm.sequence_sum(klm.exact_kl_per_token(pol, true), mask).tolist()
                    logp = klm.gather_token_logprobs(pol, tokens)
                    true_logp = klm.gather_token_logprobs(true, tokens)
                    est = klm.kl_estimators(logp, true_logp)
                    per_sample["k1"] += klm.sequence_sum(est["k1"], mask).tolist()
                    per_sample["k3"] += klm.sequence_sum(est["k3"], mask).tolist()
                    del true
                    if approx_ok:
                        try:
                            approx = reference.distribution(batch)
                            per_sample["kl_approx"] += klm.sequence_sum(klm.exact_kl_per_token(pol, approx), mask).tolist()
                            del approx
                        except NotImplementedError as e:
                            approx_ok = False
                            reasons["kl_approx"] = str(e)
                    if reference.has_reference and "logp_mae" not in reasons:
                        try:
                            approx_logp = reference.audit_logprobs(batch)
                        except NotImplementedError as e:
                            reasons["logp_mae"] = reasons["logp_rmse"] = reasons["logp_max_err"] = str(e)
                        else:
                            d = (approx_logp - true_logp)[mask].double()
                            if d.numel():
                                err_sq += d.pow(2).sum().item()
                                err_abs += d.abs().sum().item()
                                err_max = max(err_max, d.abs().max().item())
                                err_n += d.numel()
                per_sample["len"] += [float(x) for x in sb.lengths]
            ppl = self.perplexity(policy)
        finally:
            policy.train(was_training)

        rewards = self.reward(texts)
        unsafe_p = self.safety.probs(texts)
        wr = mm.win_rate(rewards, sft["rewards"])
        if self.proxy is not None:
            proxy_mean = mm.mean(self.proxy(texts, self.prompts))
        else:
            proxy_mean = float("nan")
            reasons["reward_proxy"] = "the run trains on the gold reward (no learned reward model)"
        kl_true = mm.mean(per_sample["kl"])
        kl_approx = mm.mean(per_sample["kl_approx"]) if approx_ok else float("nan")
        abs_err = abs(kl_approx - kl_true)
        rel_err = abs_err / kl_true if kl_true != 0 else float("nan")
        if approx_ok and kl_true == 0:
            reasons["kl_rel_err"] = "kl_true is 0 (the policy equals the reference): relative error undefined"
        elif not approx_ok:
            reasons["kl_abs_err"] = reasons["kl_rel_err"] = reasons["kl_approx"]
        if err_n == 0 or "logp_mae" in reasons:
            err_n = 0
            for k in ("logp_mae", "logp_rmse", "logp_max_err"):
                reasons.setdefault(k, reasons.get("kl_approx", "no response tokens"))
        metrics = {
            "eval/win_rate": wr["win_rate"], "eval/win_rate_lo": wr["win_rate_lo"], "eval/win_rate_hi": wr["win_rate_hi"],
            "eval/reward_gold": mm.mean(rewards), "eval/reward_gold_sft": mm.mean(sft["rewards"]),
            "eval/reward_proxy": proxy_mean,
            "eval/ppl": ppl, "eval/length": mm.mean(per_sample["len"]),
            "eval/rep_2": mm.mean_rep_n(texts, 2), "eval/distinct_2": mm.distinct_n(texts, 2),
            "eval/unsafe_rate": mm.mean([float(p >= self.safety.threshold) for p in unsafe_p]),
            "eval/unsafe_rate_sft": mm.mean([float(p >= self.safety.threshold) for p in sft["unsafe"]]),
            "kl/true": kl_true, "kl/true_k1": mm.mean(per_sample["k1"]), "kl/true_k3": mm.mean(per_sample["k3"]),
            "kl/approx": kl_approx, "kl/abs_err": abs_err, "kl/rel_err": rel_err,
            "kl/logp_mae": err_abs / err_n if err_n else float("nan"),
            "kl/logp_rmse": math.sqrt(err_sq / err_n) if err_n else float("nan"),
            "kl/logp_max_err": err_max if err_n else float("nan"),
        }
        samples = [
            {"step": step, "prompt": p, "policy_response": t, "sft_response": st, "policy_reward": r, "sft_reward": sr,
             "policy_unsafe_prob": u, "sft_unsafe_prob": su, "kl_true": k, "kl_k1": k1, "kl_k3": k3,
             "kl_approx": (per_sample["kl_approx"][i] if approx_ok else float("nan")), "length": n}
            for i, (p, t, st, r, sr, u, su, k, k1, k3, n) in enumerate(zip(
                self.prompts, texts, sft["texts"], rewards, sft["rewards"], unsafe_p, sft["unsafe"],
                per_sample["kl"], per_sample["k1"], per_sample["k3"], per_sample["len"]))
        ]
        return EvalResult(step, metrics, samples, reasons)
