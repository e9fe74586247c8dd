"""The evaluation every algorithm shares: sample from the policy on held-out prompts and audit it.

The evaluator holds its own frozen copy of the SFT model, the judge. It is the judge of truth for KL
(the full reference, whatever regime the run trained with) and the baseline the win rate is measured
against. Nothing it does is counted in the regime's cost.

Responses are sampled and scored in one precision, ``eval.precision``, so the KL describes the model
that drew the samples. The audit reports, in nats per response (summed over its tokens):

- ``kl/true``: exact KL(policy || judge) on the policy's evaluation samples (float64 over the vocabulary),
  with its sampled estimators ``kl/true_k1``, ``kl/true_k3``;
- ``kl/approx``, the stand-in divergence: exact KL(policy || the regime's reference) on the same samples.
  For DPO it is not a KL the run trained against: DPO never computes one;
- ``kl/abs_err``: |stand-in divergence - true KL|; ``kl/logp_*``: errors of the regime's per-token
  log-probs against the judge's on the sampled tokens (read off the regime's distribution in float64 where they
  are its distribution's, :attr:`~ablate.refs.base.Reference.logprobs_match_distribution`; else its own).

Launched on several processes (:mod:`ablate.distributed`), each samples and scores a contiguous block of the
prompts (the SFT baseline's too) and of the perplexity's texts, and the rows are gathered in prompt order before
any metric is computed: every prompt is scored once, each process holds the same metrics, and, as a coupled
response depends on its key and not on its batch, the rows are those one process would have drawn. The fidelity
audit runs on rank 0 (on every process's samples) and its figures are shared.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ablate import distributed
from ablate.eval import baseline_cache as bc
from ablate.eval import fidelity as fid
from ablate.eval import kl as klm
from ablate.eval import metrics as mm
from ablate.eval.metrics import rows_of
from ablate.eval.response_audit import Audit
from ablate.models.loading import tokenizer_fingerprint
from ablate.models.precision import autocast, unwrapped_forward
from ablate.models.prompt_cache import ChunkPrompts, SharedPrompts
from ablate.models.sampling import SampledBatch, iter_sample, sampling_rows
from ablate.refs.base import Reference, TokenBatch
from ablate.refs.model_backed import freeze, next_token_logits

log = logging.getLogger(__name__)

#: The independent SFT draw (the win rate's opponent) uses the evaluation's sampling seed plus this.
INDEPENDENT_SEED = 7919


class _PhaseClock:
    """Seconds per phase of one evaluation, for the log (where the evaluation's time goes)."""

    def __init__(self) -> None:
        self.laps: list[tuple[str, float]] = []
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps.append((name, now - self._t))
        self._t = now

    def __str__(self) -> str:
        return ", ".join(f"{name} {s:.0f} s" for name, s in self.seconds().items())

    def seconds(self) -> dict[str, float]:
        """Seconds by phase (a phase timed twice: its sum)."""
        out: dict[str, float] = {}
        for name, s in self.laps:
            out[name] = out.get(name, 0.0) + s
        return out


def sampling_seed(eval_seed: int | None, run_seed: int) -> int:
    """The evaluation's sampling seed: ``eval.seed`` when set, else ``1234 + 1000 * seed`` (each run seed has
    its own evaluation noise; seed 0 keeps the former fixed 1234). The SFT baseline is sampled with the same seed
    and keys as the policy: with the coupled sampler a policy equal to the SFT model gives its responses exactly."""
    return int(eval_seed) if eval_seed is not None else 1234 + 1000 * int(run_seed)


@dataclass
class EvalResult:
    step: int
    metrics: dict[str, float]
    samples: list[dict]
    nan_reasons: dict[str, str] = field(default_factory=dict)
    final: bool = True  # the final evaluation's size (eval.samples_per_prompt), not the interim one
    seconds: dict[str, float] = field(default_factory=dict)  # wall time by phase (the SFT baseline's included)


class Evaluator:
    def __init__(
        self,
        *,
        judge: torch.nn.Module,
        tokenizer,
        prompts: list[str],
        heldout: list[str],
        reward,
        safety,
        eval_cfg,
        task_cfg,
        run_seed: int,
        device: torch.device,
        proxy=None,
        cache_root: str | Path | None = None,
        model_fingerprint: str | None = None,
        fidelity=None,
    ):
        """``cache_root``: where the SFT baseline is cached content-addressed (None: sampled every time);
        ``model_fingerprint``: the judge's weights' fingerprint, part of that cache's key (needed with it);
        ``fidelity``: a :class:`ablate.eval.fidelity.FidelityProbe`, measured at step 0 and at the final evaluation."""
        if cache_root is not None and model_fingerprint is None:
            raise ValueError("caching the SFT baseline needs the judge's model_fingerprint")
        self.judge = freeze(judge)
        self.tok = tokenizer
        self.prompts = prompts
        self.heldout = heldout
        self.reward = reward
        self.safety = safety
        self.cfg = eval_cfg
        self.task = task_cfg
        self.precision = eval_cfg.precision  # sampling and scoring precision
        self.seed = sampling_seed(eval_cfg.seed, run_seed)
        self.device = device
        self._sft: dict[tuple[int, int], dict] = {}  # (samples per prompt, seed) -> the SFT baseline
        self.proxy = proxy  # a learned reward, if the run trains on one: reported as eval/reward_proxy
        self.cache_root = cache_root
        self.model_fingerprint = model_fingerprint
        self.baseline_cache_hit: bool | None = None  # None: not cached, or not yet computed; else every load's
        self.fidelity = fidelity
        self.shard = distributed.shard(len(prompts))  # the prompts this process samples and scores

    def samples_per_prompt(self, final: bool) -> int:
        """Coupled samples per prompt: ``eval.samples_per_prompt`` at the final evaluation, the interim count
        (default the same) at step 0 and in between."""
        k = self.cfg.samples_per_prompt
        return k if final else (self.cfg.interim_samples_per_prompt or k)

    def rows(self, k: int, keep_scores: bool = False) -> int:
        """Rows per generate call with ``k`` samples per prompt (the audit scores eval.batch_size at a time); with
        ``keep_scores``, fewer: each row also keeps its logits (:meth:`keeps_scores`)."""
        return self.cfg.sample_batch_size or sampling_rows(
            self.judge.config,
            self.tok,
            self.prompts,
            n_per_prompt=k,
            max_new_tokens=self.task.max_new_tokens,
            precision=self.precision,
            device=self.device,
            keep_scores=keep_scores,
        )

    def keeps_scores(self) -> bool:
        """Whether the policy's sampler keeps its logits for the KL audit, which then runs no forward of the policy
        (:meth:`SampledBatch.policy_logits`): in fp32, where a KV-cached decode and a forward differ by float rounding
        only (a test bounds it; the figures measured on SmolLM2 are in docs/algorithms.md), and with the coupled
        sampler, which hands each generate call's batch over as it is drawn, so its logits are audited and dropped
        a call at a time. In bf16 the two differ by more than the audit's own precision: the forward runs."""
        return self.precision == "fp32" and self.cfg.sampler == "coupled"

    # ------------------------------------------------------------------------------------ sampling
    def _sample(
        self, model, desc: str, k: int, seed: int | None = None, keep_scores: bool = False
    ) -> Iterator[SampledBatch]:
        """``k`` responses per prompt (prompt-major), sampled with ``eval.sampler`` in ``eval.precision``,
        :meth:`rows` at a time, outside Accelerate's per-call autocast wrapper; every model is sampled with the
        same seed and keys (prompt i, sample j), so they are coupled. Only this process's :attr:`shard`. A generate
        call's batch at a time (:func:`ablate.models.sampling.iter_sample`), with its logits if ``keep_scores``."""
        with unwrapped_forward(model):
            yield from iter_sample(
                model,
                self.tok,
                [self.prompts[i] for i in self.shard],
                max_new_tokens=self.task.max_new_tokens,
                temperature=self.task.temperature,
                batch_size=self.rows(k, keep_scores),
                seed=self.seed if seed is None else seed,
                precision=self.precision,
                n_per_prompt=k,
                desc=desc,
                sampler=self.cfg.sampler,
                max_sentences=self.task.max_sentences,
                prompt_ids=list(self.shard),
                keep_scores=keep_scores,
            )

    def _sample_baseline(self, k: int, seed: int) -> dict:
        """The SFT model's ``k`` responses per prompt drawn with ``seed``, their gold rewards and unsafe probabilities
        (each process its shard's, gathered)."""
        batches = list(self._sample(self.judge, "eval: SFT baseline", k, seed))
        baseline = distributed.gather_rows(self._scored([t for b in batches for t in b.texts], k))
        # the token batches (this process's shard): a policy equal to the SFT model draws exactly these
        return {**baseline, "batches": batches if distributed.world_size() == 1 else None}

    def is_sft(self, policy) -> bool:
        """True when ``policy`` is the SFT model: the judge's class, and its parameters the judge's by name, dtype and
        value, bit for bit (step 0 of a full fine-tune; not a LoRA or value-head wrapper). It is then the same
        function, and the evaluation reads the judge in its place (:meth:`evaluate`)."""
        if type(policy) is not type(self.judge):
            return False
        mine = dict(policy.named_parameters())
        theirs = dict(self.judge.named_parameters())
        return mine.keys() == theirs.keys() and all(
            p.dtype == theirs[n].dtype and torch.equal(p, theirs[n]) for n, p in mine.items()
        )

    def _policy_samples(self, model, step: int, k: int) -> Iterable[SampledBatch]:
        """The evaluated model's ``k`` samples per prompt: the SFT baseline's own token batches when it is the judge
        (the same seed, keys and rows; kept by single-process jobs, cached with the baseline), else drawn now, a
        generate call at a time, with their logits where :meth:`keeps_scores`."""
        mine = model is self.judge and distributed.world_size() == 1  # a shard's are not the cached (rank 0's)
        batches = self.sft_baseline(k).get("batches") if mine else None
        if batches is not None:
            return batches
        return self._sample(model, f"eval@{step}: sampling", k, keep_scores=self.keeps_scores())

    def _scored(self, texts: list[str], k: int) -> dict[str, list]:
        """This shard's responses (``k`` per prompt, prompt-major) with their gold rewards and unsafe probabilities
        (the columns every evaluation keeps)."""
        prompts = [self.prompts[i] for i in self.shard for _ in range(k)]
        return {"texts": texts, "rewards": self.reward(texts, prompts), "unsafe": self.safety.probs(texts)}

    def baseline_key(self, k: int | None = None, seed: int | None = None) -> dict:
        """The SFT baseline's cache key (:func:`ablate.eval.baseline_cache.baseline_key`) for these settings, at
        ``k`` samples per prompt (default: the final evaluation's) drawn with ``seed`` (default: the evaluation's)."""
        k = k or self.cfg.samples_per_prompt
        settings = bc.BaselineSettings(
            max_new_tokens=self.task.max_new_tokens,
            temperature=self.task.temperature,
            samples_per_prompt=k,
            batch_size=self.rows(k),
            seed=self.seed if seed is None else seed,
            precision=self.precision,
            sampler=self.cfg.sampler,
            device=self.device.type,
            max_sentences=self.task.max_sentences,
        )
        return bc.baseline_key(
            model_fingerprint=self.model_fingerprint,
            tokenizer_fingerprint=tokenizer_fingerprint(self.tok),
            settings=settings,
            prompts=self.prompts,
            reward_id=self.reward.ID,
            safety_id=self.safety.ID,
        )

    def sft_baseline(self, k: int | None = None, independent: bool = False) -> dict:
        """The SFT model's ``k`` responses per prompt (default: the final evaluation's count), prompt-major,
        sampled once with the policy's seed and keys (and, with a ``cache_root``, once per sweep: loaded from the
        cache when an earlier job sampled them). ``independent``: drawn with another seed (:data:`INDEPENDENT_SEED`
        added), independent of the policy's samples: the win rate's opponent."""
        k = k or self.cfg.samples_per_prompt
        seed = self.seed + INDEPENDENT_SEED if independent else self.seed
        if (k, seed) not in self._sft:
            draw = lambda: self._sample_baseline(k, seed)  # noqa: E731
            if self.cache_root is None:
                self._sft[k, seed] = draw()
            else:
                self._sft[k, seed], hit, _ = bc.load_or_sample_baseline(
                    self.cache_root, self.baseline_key(k, seed), self._expanded(k), draw, save=distributed.is_main()
                )
                self.baseline_cache_hit = hit if self.baseline_cache_hit is None else self.baseline_cache_hit and hit
        return self._sft[k, seed]

    def opponent_rewards(self, k: int) -> list[float]:
        """The win rate's opponent for each of the ``k`` policy responses per prompt: an SFT response of the same
        prompt drawn independently of it. With ``k >= 2``, the SFT model's coupled sample of the next index
        (``(j + 1) mod k``: other noise, so independent, and no extra draw); with one, a second draw
        (:meth:`sft_baseline` with ``independent``)."""
        if k == 1:
            return self.sft_baseline(1, independent=True)["rewards"]
        coupled = self.sft_baseline(k)["rewards"]
        return [coupled[i - i % k + (i % k + 1) % k] for i in range(len(coupled))]

    def _expanded(self, k: int) -> list[str]:
        """Each prompt ``k`` times, in the order responses are sampled (prompt-major)."""
        return [p for p in self.prompts for _ in range(k)]

    # ------------------------------------------------------------------------------------- scoring
    def _policy_scores(self, policy, batch: TokenBatch) -> torch.Tensor:
        """[B, T-1, V] float32 next-token logits of the policy, outside Accelerate's wrapper."""
        with unwrapped_forward(policy):
            return next_token_logits(policy, batch)

    def perplexity(self, policy) -> float:
        """exp of the token-weighted mean NLL of the policy on held-out plain text (float64 log-softmax); each
        process scores its share of the batches."""
        nll, n = 0.0, 0
        was_training = policy.training
        policy.eval()
        starts = range(0, len(self.heldout), self.cfg.batch_size)
        try:
            for i in [starts[j] for j in distributed.shard(len(starts))]:
                enc = self.tok(self.heldout[i : i + self.cfg.batch_size], return_tensors="pt", padding=True).to(
                    self.device
                )
                mask = enc["attention_mask"][:, 1:].bool() & enc["attention_mask"][:, :-1].bool()
                batch = TokenBatch(enc["input_ids"], enc["attention_mask"], enc["attention_mask"])
                with autocast(self.device, self.precision):
                    scores = self._policy_scores(policy, batch)
                tok_lp = klm.token_logprobs(scores, enc["input_ids"][:, 1:], mask)
                nll -= tok_lp[mask].sum().item()
                n += int(mask.sum())
        finally:
            policy.train(was_training)
        nll, n = (sum(x) for x in zip(*distributed.gather((nll, n))))
        return math.exp(nll / n) if n else float("nan")

    def shared_prompts(self, policy, sampled: SampledBatch) -> SharedPrompts | None:
        """The generate call's prompts, cached once per frozen model that scores its chunks: the judge, and a stand-in
        whose distribution is its model's forward (:mod:`ablate.models.prompt_cache`); each chunk's forwards then run
        its responses only. In fp32, where the two differ by float rounding only (a test bounds it), and when the
        judge is run at all (not when it stands for the policy). None otherwise: plain forwards."""
        if self.precision != "fp32" or policy is self.judge or sampled.index is not None:
            return None
        return SharedPrompts(sampled.batch.to(self.device))

    def _audit_batch(
        self, policy, reference: Reference, sb: SampledBatch, audit: Audit, shared: SharedPrompts | None = None
    ) -> None:
        """Score one chunk of responses with the policy, the judge and the regime (:class:`Audit` accumulates). A regime
        that reads the judge's own copy (``ref=full``) is not run again, nor the judge when it stands for the policy
        (step 0: :meth:`is_sft`); a regime whose log-probs are those of its distribution has them read off it
        (:attr:`Reference.logprobs_match_distribution`): one forward, not two. ``shared``: the generate call's cached
        prompts (:meth:`shared_prompts`), when it has them: the judge and a model-backed stand-in run the responses."""
        batch = sb.batch.to(self.device)
        mask, tokens = batch.target_mask, batch.input_ids[:, 1:]
        with torch.no_grad(), autocast(self.device, self.precision):
            pol = sb.policy_logits() if sb.scores is not None else self._policy_scores(policy, batch)
            prompts: ChunkPrompts | None = None if shared is None else shared.chunk(sb.index, sb.offset)
            if policy is self.judge:
                judge = pol
            elif prompts is not None:
                judge = prompts.next_token_logits(self.judge, batch)
            else:
                judge = next_token_logits(self.judge, batch)
            stand_in = judge if reference.reads(self.judge) else audit.stand_in(reference, batch, prompts)
            from_stand_in = stand_in is not None and reference.logprobs_match_distribution
            regime_logp = None if from_stand_in else audit.regime_logprobs(reference, batch, self.precision)
        terms = klm.audit_terms(pol, judge, tokens, mask, stand_in)  # float64, a chunk of positions at a time
        del pol, judge, stand_in
        audit.add(terms, mask, terms.stand_in_logp if from_stand_in else regime_logp, sb.lengths, sb.truncated)

    def _fidelity(
        self, policy, reference: Reference, fresh: list[SampledBatch], step: int, final: bool, audit, trainer
    ):
        """The fidelity audit's ``kl/*`` metrics (:mod:`ablate.eval.fidelity`) at step 0 and at the final evaluation
        (none in between); its NaN reasons go with the evaluation's. Every process measures (the trainer's loss
        gathers its metrics across them), on every process's ``fresh`` samples; rank 0's figures are kept."""
        if not (step == 0 or final):
            return {}
        if self.fidelity is None:
            audit.reasons.update(dict.fromkeys(fid.KEYS, "not measured (eval.fidelity=false)"))
            return {fid.logged_name(k): float("nan") for k in fid.KEYS}
        fresh = [sb for part in distributed.gather(fresh) for sb in part]
        metrics, why = distributed.broadcast(self.fidelity.measure(policy, reference, fresh, trainer))
        audit.reasons.update(why)
        return metrics

    def _gathered_rows(self, texts: list[str], audit: Audit, k: int) -> dict[str, list]:
        """This process's rows (responses, their rewards, unsafe probabilities and learned reward) with every other
        process's, in prompt order; the audit's per-sample sums, log-probs and NaN reasons gathered in place."""
        rows = {
            **self._scored(texts, k),
            "approx_logp": audit.approx_logp,
            "judge_logp": audit.judge_logp,
            **{f"audit_{c}": v for c, v in audit.per_sample.items()},
        }
        if self.proxy is not None:
            rows["proxy"] = self.proxy(texts, [self.prompts[i] for i in self.shard for _ in range(k)])
        rows = distributed.gather_rows(rows)
        for reasons in distributed.gather(dict(audit.reasons)):
            audit.reasons.update(reasons)
        audit.per_sample = {c: rows.pop(f"audit_{c}") for c in audit.per_sample}
        audit.approx_logp, audit.judge_logp = rows.pop("approx_logp"), rows.pop("judge_logp")
        return rows

    def evaluate(self, policy, reference: Reference, step: int, final: bool = True, trainer=None) -> EvalResult:
        """Sample the policy (:meth:`samples_per_prompt` of ``final``), audit it and score it against the SFT
        baseline drawn with the same keys. ``trainer``: the run's, whose loss the fidelity audit differentiates."""
        k = self.samples_per_prompt(final)
        clock = _PhaseClock()
        sft = self.sft_baseline(k)
        clock.lap("SFT baseline")
        prompts = self._expanded(k)
        was_training = policy.training
        policy.eval()
        audit = Audit()
        texts: list[str] = []
        chunks: list[SampledBatch] = []
        order: list[int] = []  # each audited row's place among the samples
        # at step 0 of a full fine-tune the policy is the SFT model, bit for bit: the judge stands in for it, so its
        # samples are the SFT baseline's (no second draw) and the audit runs one model for both
        model = self.judge if step == 0 and self.is_sft(policy) else policy
        try:
            for sampled in self._policy_samples(model, step, k):  # each generate call's batch audited as it comes
                clock.lap("sampling")
                mine = sampled.chunks(self.cfg.batch_size)  # the audit holds [rows, T, V] logits three times
                shared = self.shared_prompts(model, sampled)
                for sb in tqdm(mine, desc=f"eval@{step}: KL audit", unit="batch", leave=False):
                    self._audit_batch(model, reference, sb, audit, shared)
                    sb.scores = None
                del shared
                sampled.scores = None  # the kept logits go with the last chunk that read them
                order += [len(texts) + i for c in mine for i in c.index]
                chunks += mine
                texts += sampled.texts
                clock.lap("KL audit")
            audit.reorder(order)  # chunks run shortest first: back to the samples' order
            ppl = self.perplexity(model)
            clock.lap("perplexity")
            fidelity = self._fidelity(policy, reference, chunks, step, final, audit, trainer)
            clock.lap("fidelity")
        finally:
            policy.train(was_training)

        rows = self._gathered_rows(texts, audit, k)
        clock.lap("reward and safety scores")
        log.info("eval@%d: %d responses; %s", step, len(rows["texts"]), clock)
        texts, rewards, unsafe_p = rows["texts"], rows["rewards"], rows["unsafe"]
        reasons, ps = audit.reasons, audit.per_sample
        groups = [i // k for i in range(len(rewards))]  # the prompt is the unit: its k differences are one observation
        opponent = self.opponent_rewards(k)
        clock.lap("SFT baseline")
        wr = mm.win_rate_by_group(rewards, opponent, groups)
        delta, delta_lo, delta_hi = mm.paired_delta(rewards, sft["rewards"], groups=groups)
        if self.proxy is not None:
            proxy_mean = mm.mean(rows["proxy"])
        else:
            proxy_mean = float("nan")
            reasons["reward_proxy"] = "the run trains on the gold reward (no learned reward model)"
        metrics = {
            "eval/win_rate": wr["win_rate"],
            "eval/win_rate_lo": wr["win_rate_lo"],
            "eval/win_rate_hi": wr["win_rate_hi"],
            "eval/reward_gold": mm.mean(rewards),
            "eval/reward_gold_sft": mm.mean(sft["rewards"]),
            "eval/reward_delta": delta,
            "eval/reward_delta_lo": delta_lo,
            "eval/reward_delta_hi": delta_hi,
            "eval/reward_proxy": proxy_mean,
            "eval/ppl": ppl,
            "eval/length": mm.mean(ps["len"]),
            "eval/truncation_rate": mm.mean(ps["truncated"]),
            "eval/rep_2": mm.mean_rep_n(texts, 2),
            "eval/distinct_2": mm.distinct_n(texts, 2),
            "eval/degenerate_rate": mm.degenerate_share(texts),
            "eval/unsafe_rate": mm.mean([float(p >= self.safety.threshold) for p in unsafe_p]),
            "eval/unsafe_rate_sft": mm.mean([float(p >= self.safety.threshold) for p in sft["unsafe"]]),
            **audit.metrics(),
            **fidelity,
        }
        approx = ps["kl_approx"] if "kl_approx" not in reasons else [float("nan")] * len(texts)
        columns = {
            "prompt": prompts,
            "sample": [i % k for i in range(len(texts))],
            "policy_response": texts,
            "sft_response": sft["texts"],
            "policy_reward": rewards,
            "sft_reward": sft["rewards"],
            "sft_indep_reward": opponent,
            "policy_unsafe_prob": unsafe_p,
            **({"policy_proxy_reward": rows["proxy"]} if self.proxy is not None else {}),
            "sft_unsafe_prob": sft["unsafe"],
            **{f"kl_{c}": ps[c] for c in ("true", "k1", "k3")},
            "sft_nll": ps["sft_nll"],
            "kl_approx": approx,
            "length": ps["len"],
            "truncated": [bool(x) for x in ps["truncated"]],
        }
        samples = [{"step": step, **row} for row in rows_of(columns)]
        clock.lap("metrics")
        return EvalResult(step, metrics, samples, reasons, final, clock.seconds())
