"""Sampling throughput, side by side in one process: today's call (``generate`` with multinomial sampling at
batch 8, in the model's precision) against the harness's sampler at the default evaluation's settings (the
coupled sampler on ``eval.n_prompts`` prompts, as many rows per call as the evaluation takes, ``eval.precision``,
``task.max_new_tokens``) and, when that precision is fp32, the same in bf16; each as a fraction of the decode
bounds that apply to it (:mod:`ablate.bench.decode`)."""

from __future__ import annotations

import time

import torch

from ablate.bench.decode import decode_bound, memory_bandwidth
from ablate.models.batching import kv_bytes_per_position

BASELINE_BATCH = 8  # today's generate call in the bench (the 109 tokens/s)
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def _timed_sample(policy, tokenizer, prompts, **kw) -> tuple[float, float, float]:
    """(seconds, response tokens, mean prompt tokens) of one ``sample`` call."""
    from ablate.models.sampling import sample

    t0 = time.perf_counter()
    batches = sample(policy, tokenizer, prompts, temperature=1.0, seed=0, **kw)
    seconds = time.perf_counter() - t0
    tokens = float(sum(sum(b.lengths) for b in batches))
    prompt_tokens = [int((b.batch.attention_mask.sum(1) - torch.tensor(b.lengths)).float().mean()) for b in batches]
    return seconds, tokens, sum(prompt_tokens) / len(prompt_tokens)


def _bound(policy, matmul_params: int, precision: str, batch: int, context: float, ceilings: dict, bw: float):
    dtype = DTYPES[precision]
    weight_bytes = sum(p.numel() for p in policy.parameters()) * torch.empty((), dtype=dtype).element_size()
    return decode_bound(
        matmul_params=matmul_params,
        weight_bytes=weight_bytes,
        kv_bytes_per_pos=kv_bytes_per_position(policy.config, dtype),
        batch=batch,
        context=context,
        ceiling_flops=ceilings[precision],
        bandwidth=bw,
    )


def sampling_side_by_side(policy, tokenizer, prompts, cfg, *, matmul_params: int, ceilings: dict) -> dict:
    """The sampling set-ups on the same ``prompts`` (as many as the evaluation's, at least the baseline's 8),
    interleaved (baseline, harness, ..., baseline, harness, ...), best of two; their tokens/s, ratios to the
    baseline, and each one's fraction of its compute and memory bounds. ``ceilings``: matmul FLOP/s by precision
    ("bf16", "fp32")."""
    from ablate.models.sampling import sampling_rows

    bw = memory_bandwidth()
    prompts = prompts[: max(BASELINE_BATCH, cfg.eval.n_prompts)]
    device = next(policy.parameters()).device

    def harness(precision: str) -> dict:
        rows = cfg.eval.sample_batch_size or sampling_rows(
            policy.config,
            tokenizer,
            prompts,
            max_new_tokens=cfg.task.max_new_tokens,
            precision=precision,
            device=device,
        )
        return dict(
            batch_size=rows, precision=precision, sampler=cfg.eval.sampler, max_new_tokens=cfg.task.max_new_tokens
        )

    setups = {
        "baseline": dict(
            batch_size=BASELINE_BATCH, precision=cfg.model.precision, sampler="multinomial", max_new_tokens=32
        ),
        "harness": harness(cfg.eval.precision),
    }
    if cfg.eval.precision != "bf16":
        setups["harness_bf16"] = harness("bf16")
    best: dict[str, tuple[float, float, float]] = {}
    for _ in range(2):
        for name, kw in setups.items():
            run = _timed_sample(policy, tokenizer, prompts, **kw)
            if name not in best or run[1] / run[0] > best[name][1] / best[name][0]:
                best[name] = run
    out: dict = {"memory_bandwidth": bw}
    for name, kw in setups.items():
        seconds, tokens, prompt_len = best[name]
        rate = tokens / seconds
        context = prompt_len + kw["max_new_tokens"] / 2  # mean context over the decode steps
        b = _bound(policy, matmul_params, kw["precision"], kw["batch_size"], context, ceilings, bw)
        out.update({f"{name}_{k}": v for k, v in kw.items()})
        out.update(b.as_dict(f"{name}_bound_"))
        out[f"{name}_tokens_per_s"] = rate
        out[f"{name}_fraction_of_bound"] = rate / b.tokens_per_s
        out[f"{name}_fraction_of_compute"] = rate * b.compute_s / b.batch
        out[f"{name}_fraction_of_memory"] = rate * b.memory_s / b.batch
    for name in setups:
        if name != "baseline":
            out[f"{name}_over_baseline"] = out[f"{name}_tokens_per_s"] / out["baseline_tokens_per_s"]
    return out


def kept_logits_side_by_side(policy, tokenizer, prompts, cfg, repeats: int = 2) -> dict:
    """What the evaluation's policy side costs with the sampler's kept logits (fewer rows per generate call, then
    :meth:`~ablate.models.sampling.SampledBatch.policy_logits` per audit chunk) against without (the rows the
    budget gives, then a policy forward per audit chunk), on the evaluation's prompts, interleaved, best of
    ``repeats``; the figures of ``Evaluator.keeps_scores``. Seconds each, rows each, and their ratio."""
    from ablate.models.logprobs import next_token_logits
    from ablate.models.sampling import iter_sample, sampling_rows

    prompts = prompts[: cfg.eval.n_prompts]
    device = next(policy.parameters()).device
    k = cfg.eval.samples_per_prompt

    def rows(keep: bool) -> int:
        return cfg.eval.sample_batch_size or sampling_rows(
            policy.config,
            tokenizer,
            prompts,
            n_per_prompt=k,
            max_new_tokens=cfg.task.max_new_tokens,
            precision=cfg.eval.precision,
            device=device,
            keep_scores=keep,
        )

    def run(keep: bool) -> float:
        t0 = time.perf_counter()
        for sampled in iter_sample(
            policy,
            tokenizer,
            prompts,
            max_new_tokens=cfg.task.max_new_tokens,
            temperature=1.0,
            batch_size=rows(keep),
            seed=0,
            precision=cfg.eval.precision,
            n_per_prompt=k,
            max_sentences=cfg.task.max_sentences,
            keep_scores=keep,
        ):
            for chunk in sampled.chunks(cfg.eval.batch_size):
                with torch.no_grad():
                    chunk.policy_logits() if keep else next_token_logits(policy, chunk.batch)
        return time.perf_counter() - t0

    best = {True: float("inf"), False: float("inf")}
    for _ in range(repeats):
        for keep in (False, True):
            best[keep] = min(best[keep], run(keep))
    return {
        "forward_rows": rows(False),
        "kept_rows": rows(True),
        "forward_s": best[False],
        "kept_s": best[True],
        "kept_over_forward": best[True] / best[False],
    }


def prompt_cache_side_by_side(judge, tokenizer, prompts, cfg, repeats: int = 2) -> dict:
    """The KL audit's judge forwards over the evaluation's responses, each chunk's whole rows (a plain forward)
    against each chunk's responses on the generate call's cached prompts (:mod:`ablate.models.prompt_cache`,
    ``Evaluator.shared_prompts``), on the evaluation's prompts and samples per prompt (drawn once, untimed),
    interleaved, best of ``repeats``. Seconds each, their ratio, and the largest logit difference at a response
    position (float rounding: the tolerance the audit takes)."""
    from ablate.models.logprobs import next_token_logits
    from ablate.models.prompt_cache import SharedPrompts
    from ablate.models.sampling import iter_sample, sampling_rows

    prompts = prompts[: cfg.eval.n_prompts]
    k = cfg.eval.samples_per_prompt
    kw = dict(max_new_tokens=cfg.task.max_new_tokens, precision="fp32", n_per_prompt=k)
    rows = cfg.eval.sample_batch_size or sampling_rows(
        judge.config, tokenizer, prompts, device=next(judge.parameters()).device, **kw
    )
    batches = list(
        iter_sample(
            judge,
            tokenizer,
            prompts,
            temperature=1.0,
            batch_size=rows,
            seed=0,
            max_sentences=cfg.task.max_sentences,
            **kw,
        )
    )

    def run(cached: bool) -> float:
        t0 = time.perf_counter()
        for sampled in batches:
            shared = SharedPrompts(sampled.batch) if cached else None
            for chunk in sampled.chunks(cfg.eval.batch_size):
                if shared is None:
                    next_token_logits(judge, chunk.batch)
                else:
                    shared.chunk(chunk.index, chunk.offset).next_token_logits(judge, chunk.batch)
        return time.perf_counter() - t0

    worst = 0.0  # untimed: each chunk both ways
    for sampled in batches:
        shared = SharedPrompts(sampled.batch)
        for chunk in sampled.chunks(cfg.eval.batch_size):
            got = shared.chunk(chunk.index, chunk.offset).next_token_logits(judge, chunk.batch)
            m = chunk.batch.target_mask
            worst = max(worst, float((got - next_token_logits(judge, chunk.batch))[m].abs().max()))
    best = {True: float("inf"), False: float("inf")}
    for _ in range(repeats):
        for cached in (False, True):
            best[cached] = min(best[cached], run(cached))
    return {
        "rows": rows,
        "responses": sum(len(b.texts) for b in batches),
        "plain_s": best[False],
        "cached_s": best[True],
        "cached_over_plain": best[True] / best[False],
        "max_logit_diff": worst,
    }
