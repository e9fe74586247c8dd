"""Sampling responses from a chat model, as token batches ready for scoring.

Samples are drawn at the given temperature with no top-k/top-p truncation, so they are samples
from the model's own distribution: the per-token log-probs the evaluator scores are the ones
the sampler used (at temperature 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ablate.models.precision import autocast
from ablate.refs.base import TokenBatch


@dataclass
class SampledBatch:
    prompts: list[str]
    texts: list[str]  # decoded responses, special tokens removed
    batch: TokenBatch  # prompt (left-padded) + response; completion_mask covers response tokens up to the first EOS
    lengths: list[int]  # response tokens, EOS included


def chat_prompt_texts(tokenizer, prompts: list[str]) -> list[str]:
    return [
        tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
        for p in prompts
    ]


def _response_mask(resp: torch.Tensor, eos_id: int) -> torch.Tensor:
    """1 for response tokens up to and including the first EOS, 0 after it."""
    is_eos = resp == eos_id
    after_first = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (~after_first).long()


@torch.no_grad()
def sample(
    model,
    tokenizer,
    prompts: list[str],
    *,
    max_new_tokens: int,
    temperature: float,
    batch_size: int,
    seed: int,
    precision: str = "fp32",
    n_per_prompt: int = 1,
    desc: str | None = None,
) -> list[SampledBatch]:
    """Sample ``n_per_prompt`` responses per prompt. Deterministic for a seed; leaves the global RNG alone."""
    from transformers import GenerationConfig

    device = next(model.parameters()).device
    eos_id = tokenizer.eos_token_id
    gen_cfg = GenerationConfig(
        do_sample=True,
        temperature=temperature,
        top_k=0,
        top_p=1.0,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos_id,
    )
    expanded = [p for p in prompts for _ in range(n_per_prompt)]
    was_training = model.training
    model.eval()
    out: list[SampledBatch] = []
    fork_devices = [device] if device.type == "cuda" else []
    try:
        with torch.random.fork_rng(devices=fork_devices):
            torch.manual_seed(seed)
            starts = range(0, len(expanded), batch_size)
            for start in tqdm(starts, desc=desc or "sampling", unit="batch", leave=False, disable=desc is None):
                chunk = expanded[start : start + batch_size]
                enc = tokenizer(
                    chat_prompt_texts(tokenizer, chunk), return_tensors="pt", padding=True, add_special_tokens=False
                ).to(device)
                with autocast(device, precision):
                    seqs = model.generate(**enc, generation_config=gen_cfg)
                prompt_len = enc["input_ids"].shape[1]
                resp = seqs[:, prompt_len:]
                resp_mask = _response_mask(resp, eos_id)
                attention = torch.cat([enc["attention_mask"], resp_mask], dim=1)
                completion = torch.cat([torch.zeros_like(enc["attention_mask"]), resp_mask], dim=1)
                texts = tokenizer.batch_decode(
                    resp.masked_fill(resp_mask == 0, tokenizer.pad_token_id), skip_special_tokens=True
                )
                out.append(
                    SampledBatch(
                        chunk,
                        [t.strip() for t in texts],
                        TokenBatch(seqs, attention, completion),
                        resp_mask.sum(1).tolist(),
                    )
                )
    finally:
        model.train(was_training)
    return out
