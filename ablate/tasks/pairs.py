"""DPO preference pairs: several SFT samples per train prompt, best and worst by gold reward.

Generated once and cached content-addressed. The key holds everything that changes the pairs:
the model's fingerprint, the tokenizer (vocab, special tokens, chat template), the generation
settings, the seed, the prompts and the reward's identity. Stored as JSON lines with a checksum.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ablate.cache import CacheEntry
from ablate.models.decode import NAME as DECODER
from ablate.stop_rule import RULE
from ablate.tasks.prompts import prompts_fingerprint

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

PAIRS_FILE = "pairs.jsonl"
_FORMAT = 3  # 2: the coupled sampler; 3: the rows per generate call in the key for every sampler


@dataclass
class Pair:
    prompt: str
    chosen: str
    rejected: str
    chosen_reward: float
    rejected_reward: float


@dataclass(frozen=True)
class PairSettings:
    samples_per_prompt: int
    max_new_tokens: int
    temperature: float
    batch_size: int  # rows per generate call: the multinomial RNG stream, and the rounding of every matmul
    seed: int
    precision: str
    sampler: str = "coupled"  # ablate.models.sampling: coupled (keyed by prompt and sample) or multinomial
    max_sentences: int | None = None  # the task's stop rule (ablate.stop_rule); None: EOS or the cap only
    stop_rule: str = RULE  # and the rule itself: another rule, other responses
    decoder: str = DECODER  # how the coupled sampler decodes (ablate.models.decode)


def pair_key(
    *, model_fingerprint: str, tokenizer_fingerprint: str, settings: PairSettings, prompts: list[str], reward_id: str
) -> dict:
    # Coupled responses do not depend on their batch in exact arithmetic, nor in fp32 here (SmolLM2, 32 prompts:
    # identical at 8 and 32 rows); in bf16 a matmul's rounding depends on its rows (19 of 32 identical), so the
    # rows are part of what the pairs are.
    generation = asdict(settings)
    return {
        "model": model_fingerprint,
        "tokenizer": tokenizer_fingerprint,
        "generation": generation,
        "prompts": prompts_fingerprint(prompts),
        "reward": reward_id,
        "format": _FORMAT,
    }


def select_pair(prompt: str, texts: list[str], rewards: list[float]) -> Pair | None:
    """Best vs worst response by gold reward; None when all rewards tie (no preference to learn)."""
    hi = max(range(len(texts)), key=lambda i: rewards[i])
    lo = min(range(len(texts)), key=lambda i: rewards[i])
    if rewards[hi] == rewards[lo]:
        return None
    return Pair(prompt, texts[hi], texts[lo], rewards[hi], rewards[lo])


def generate_pairs(model, tokenizer, prompts: list[str], reward, settings: PairSettings) -> list[Pair]:
    from ablate.models.sampling import sample

    batches = sample(
        model,
        tokenizer,
        prompts,
        max_new_tokens=settings.max_new_tokens,
        temperature=settings.temperature,
        batch_size=settings.batch_size,
        seed=settings.seed,
        precision=settings.precision,
        n_per_prompt=settings.samples_per_prompt,
        sampler=settings.sampler,
        max_sentences=settings.max_sentences,
        desc="pairs: sampling SFT responses",
    )
    texts = [t for b in batches for t in b.texts]
    k = settings.samples_per_prompt
    rewards = reward(texts, [p for p in prompts for _ in range(k)])
    pairs = []
    for i, prompt in enumerate(prompts):
        pair = select_pair(prompt, texts[i * k : (i + 1) * k], rewards[i * k : (i + 1) * k])
        if pair is not None:
            pairs.append(pair)
    return pairs


def load_or_generate_pairs(
    cache_root: Path, key: dict, make_model, tokenizer, prompts: list[str], reward, settings: PairSettings
) -> tuple[list[Pair], bool, CacheEntry]:
    """The cached pairs for ``key``, generating (and caching) them on a miss. Returns (pairs, hit, entry).
    ``make_model`` is called only on a miss, so a hit loads no model."""
    entry = CacheEntry(cache_root, "pairs", key)
    if entry.valid():
        rows = [json.loads(line) for line in (entry.path / PAIRS_FILE).read_text().splitlines() if line]
        return [Pair(**r) for r in rows], True, entry
    log.info(
        "generating DPO pairs: %d prompts x %d samples (cached afterwards at %s)",
        len(prompts),
        settings.samples_per_prompt,
        entry.path,
    )
    pairs = generate_pairs(make_model(), tokenizer, prompts, reward, settings)
    if not pairs:
        raise RuntimeError(
            "every prompt's samples tied on gold reward: no preference pairs; raise "
            "task.samples_per_prompt or task.n_train"
        )
    with entry.build(extra_meta={"n_pairs": len(pairs)}) as tmp:
        with open(tmp / PAIRS_FILE, "w") as f:
            for p in pairs:
                f.write(json.dumps(asdict(p)) + "\n")
    return pairs, False, entry


def pairs_for_run(
    cfg, cache_root: Path, source, tokenizer, train_prompts: list[str], reward, make_model, device: torch.device
):
    """The run's preference pairs (settings from ``cfg.task``, ``cfg.seed`` and the model's precision):
    ``(pairs, cache hit, cache entry)``. Rows per generate call: ``task.gen_batch_size``, or as many as fit
    (:func:`ablate.models.sampling.sampling_rows`, from the model's config alone: a cache hit loads no model)."""
    from transformers import AutoConfig

    from ablate.models.loading import tokenizer_fingerprint
    from ablate.models.sampling import sampling_rows

    task = cfg.task
    rows = task.gen_batch_size or sampling_rows(
        AutoConfig.from_pretrained(source.path),
        tokenizer,
        train_prompts,
        n_per_prompt=task.samples_per_prompt,
        max_new_tokens=task.max_new_tokens,
        precision=cfg.model.precision,
        device=device,
    )
    settings = PairSettings(
        samples_per_prompt=task.samples_per_prompt,
        max_new_tokens=task.max_new_tokens,
        temperature=task.temperature,
        batch_size=rows,
        seed=cfg.seed,
        precision=cfg.model.precision,
        max_sentences=task.max_sentences,
    )
    key = pair_key(
        model_fingerprint=source.fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        settings=settings,
        prompts=train_prompts,
        reward_id=reward.ID,
    )
    return load_or_generate_pairs(cache_root, key, make_model, tokenizer, train_prompts, reward, settings)


def pairs_dataset(pairs):
    """The pairs in TRL's conversational preference format, for stock TRL, which tokenises them itself (the
    bench's stock-TRL comparison, the tests). The harness trains on :mod:`ablate.tasks.pair_tokens`."""
    from datasets import Dataset

    return Dataset.from_list(
        [
            {
                "prompt": [{"role": "user", "content": p.prompt}],
                "chosen": [{"role": "assistant", "content": p.chosen}],
                "rejected": [{"role": "assistant", "content": p.rejected}],
            }
            for p in pairs
        ]
    )
