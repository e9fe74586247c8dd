"""What the evaluator's audit of sampled responses accumulates and concludes (:class:`Audit`): per response, the
exact KL to the judge and its sampled estimators, the SFT model's (the judge's) negative log-likelihood, the stand-in
divergence (KL to the regime's reference), length and truncation; per token, the regime's log-probs of the sampled
tokens next to the judge's; and why a figure is missing. :meth:`Audit.metrics` turns them into the ``kl/*``
metrics."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ablate.eval import kl as klm
from ablate.eval import metrics as mm
from ablate.refs.base import AUDIT, Reference, TokenBatch, uncovered_rows

LOGP_KEYS = ("logp_mae", "logp_rmse", "logp_max_err")


@dataclass
class Audit:
    """What the audit of a whole evaluation accumulates: per-sample sums and the sampled tokens' log-probs."""

    per_sample: dict[str, list[float]] = field(
        default_factory=lambda: {k: [] for k in ("true", "k1", "k3", "kl_approx", "sft_nll", "len", "truncated")}
    )
    approx_logp: list[torch.Tensor] = field(default_factory=list)  # the regime's, at the response tokens
    judge_logp: list[torch.Tensor] = field(default_factory=list)  # the judge's, at the same tokens
    reasons: dict[str, str] = field(default_factory=dict)

    def stand_in(self, reference: Reference, batch: TokenBatch, prompts=None) -> torch.Tensor | None:
        """The regime's next-token log-scores, or None (with the reason) when it has none. ``prompts``: the chunk's
        cached prompts (:class:`ablate.models.prompt_cache.ChunkPrompts`), which a model-backed regime runs on."""
        if "kl_approx" in self.reasons:
            return None
        if not reference.has_reference:
            self.reasons["kl_approx"] = (
                f"ref={reference.name} trains without a reference: there is no stand-in divergence"
            )
            return None
        try:
            return reference.distribution(batch, prompts)
        except NotImplementedError as e:  # also after earlier chunks had one (ref=served): none for the evaluation
            self.reasons["kl_approx"] = str(e)
            self.per_sample["kl_approx"] = []
            return None

    def regime_logprobs(self, reference: Reference, batch: TokenBatch, precision: str) -> torch.Tensor | None:
        """The regime's per-token log-probs of the sampled tokens in ``precision``, or None (with the reason) when it
        has none for some of them."""
        if not reference.has_reference or "logp_mae" in self.reasons:
            return None
        try:
            logp = reference.logprobs(batch, AUDIT, precision)
        except NotImplementedError as e:
            self.reasons.update(dict.fromkeys(LOGP_KEYS, str(e)))
            return None
        missing = int(uncovered_rows(logp).sum())
        if missing:
            why = f"ref={reference.name} has no reference term for {missing} of {len(logp)} sampled responses"
            self.reasons.update(dict.fromkeys(LOGP_KEYS, why))
            return None
        return logp

    def add(self, terms: klm.AuditTerms, mask: torch.Tensor, regime_logp, lengths, truncated) -> None:
        """One batch's audit terms (:func:`ablate.eval.kl.audit_terms`), the regime's log-probs and the responses'
        lengths and truncation flags."""
        ps = self.per_sample
        ps["true"] += klm.sequence_sum(terms.kl, mask).tolist()
        est = klm.kl_estimators(terms.logp, terms.judge_logp)
        ps["k1"] += klm.sequence_sum(est["k1"], mask).tolist()
        ps["k3"] += klm.sequence_sum(est["k3"], mask).tolist()
        ps["sft_nll"] += klm.sequence_sum(-terms.judge_logp, mask).tolist()  # the judge is the SFT model
        if terms.stand_in_kl is not None:
            ps["kl_approx"] += klm.sequence_sum(terms.stand_in_kl, mask).tolist()
        if regime_logp is not None:
            self.approx_logp.append(regime_logp[mask].double())
            self.judge_logp.append(terms.judge_logp[mask])
        ps["len"] += [float(x) for x in lengths]
        ps["truncated"] += [float(x) for x in truncated]

    def reorder(self, order: list[int]) -> None:
        """Put the per-sample values, added in audit order, back in the samples' order: ``order[j]`` is the place
        of the j-th audited sample (the per-token log-probs only enter order-free statistics)."""
        for key, values in self.per_sample.items():
            if values:
                if len(values) != len(order):
                    raise ValueError(f"audit: {len(values)} values of {key} for {len(order)} samples")
                placed = [0.0] * len(order)
                for j, i in enumerate(order):
                    placed[i] = values[j]
                self.per_sample[key] = placed

    def metrics(self) -> dict[str, float]:
        """kl/*: means over the samples of the per-response sums, and the regime's per-token log-prob errors."""
        ps, reasons = self.per_sample, self.reasons
        kl_true = mm.mean(ps["true"])
        kl_approx = float("nan") if "kl_approx" in reasons else mm.mean(ps["kl_approx"])
        if "kl_approx" in reasons:
            reasons["kl_abs_err"] = reasons["kl_approx"]
        if self.approx_logp:
            a, t = torch.cat(self.approx_logp), torch.cat(self.judge_logp)
            errors = klm.logprob_errors(a, t, torch.ones_like(a, dtype=torch.bool))
        else:
            errors = dict.fromkeys(LOGP_KEYS, float("nan"))
        for k in LOGP_KEYS:
            if math.isnan(errors[k]):
                reasons.setdefault(k, reasons.get("kl_approx", "no response tokens"))
        return {
            "kl/true": kl_true,
            "kl/true_k1": mm.mean(ps["k1"]),
            "kl/true_k3": mm.mean(ps["k3"]),
            "eval/ppl_sft": mm.perplexity(ps["sft_nll"], ps["len"]),
            "kl/approx": kl_approx,
            "kl/abs_err": abs(kl_approx - kl_true),
            **{f"kl/{k}": errors[k] for k in LOGP_KEYS},
        }
