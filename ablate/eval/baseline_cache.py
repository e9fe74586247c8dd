"""The evaluation's SFT baseline (the judge's responses to the evaluation prompts and their scores), cached
content-addressed so that a sweep samples and scores it once, whatever the regimes of its jobs.

The key holds everything that changes the stored responses and numbers: the model's fingerprint, the tokenizer
(vocab, special tokens, chat template), the evaluation prompts, the sampling settings and seed, the device type the
responses were drawn on, the gold reward's and the safety judge's identities, and a format version. Stored as
JSON lines (one per prompt) with the checksum :class:`ablate.cache.CacheEntry` keeps; a corrupted entry is
removed and the baseline sampled again. A single-process job also stores the sampled token batches
(:class:`~ablate.models.sampling.SampledBatch`, ``samples.pt``): at step 0 a policy that is the SFT model draws
exactly these, so its evaluation reads them instead of sampling again (:meth:`Evaluator.evaluate`).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from ablate.batch import TokenBatch
from ablate.cache import CacheEntry
from ablate.models.decode import NAME as DECODER
from ablate.models.sampling import SampledBatch
from ablate.stop_rule import RULE
from ablate.tasks.prompts import prompts_fingerprint

log = logging.getLogger(__name__)

KIND = "sft_baselines"
BASELINE_FILE = "baseline.jsonl"
SAMPLES_FILE = "samples.pt"  # the sampled token batches (single-process jobs)
_FORMAT = 4  # 2: the rows per generate call in the key for every sampler; 3: samples per prompt; 4: the batches


@dataclass(frozen=True)
class BaselineSettings:
    """The settings the SFT baseline's responses are sampled with (the evaluation's)."""

    max_new_tokens: int
    temperature: float
    samples_per_prompt: int  # keys (prompt i, sample 0..k-1), prompt-major
    batch_size: int  # rows per generate call: the multinomial RNG stream, and the float rounding of every matmul
    seed: int
    precision: str
    sampler: str
    device: str  # the device type: kernels differ, and so may the sampled tokens
    max_sentences: int | None  # the task's stop rule (ablate.stop_rule)
    stop_rule: str = RULE  # and the rule itself: another rule, other responses
    decoder: str = DECODER  # how the coupled sampler decodes (ablate.models.decode)


def baseline_key(
    *,
    model_fingerprint: str,
    tokenizer_fingerprint: str,
    settings: BaselineSettings,
    prompts: list[str],
    reward_id: str,
    safety_id: str,
) -> dict:
    """The cache key of an SFT baseline: every input that changes its texts, rewards or unsafe probabilities."""
    # A coupled response depends on its key, not its batch, in exact arithmetic; a matmul's rounding still depends
    # on its row count, so a baseline drawn at other rows could differ from the step-0 policy's in a rare token.
    sampling = asdict(settings)
    return {
        "model": model_fingerprint,
        "tokenizer": tokenizer_fingerprint,
        "sampling": sampling,
        "prompts": prompts_fingerprint(prompts),
        "reward": reward_id,
        "safety": safety_id,
        "format": _FORMAT,
    }


def write_baseline(folder: Path, prompts: list[str], baseline: dict) -> None:
    """Write ``baseline`` (texts, rewards, unsafe: one each per prompt) as JSON lines, one per prompt."""
    with open(folder / BASELINE_FILE, "w") as f:
        for p, t, r, u in zip(prompts, baseline["texts"], baseline["rewards"], baseline["unsafe"], strict=True):
            f.write(json.dumps({"prompt": p, "text": t, "reward": r, "unsafe": u}) + "\n")
    if baseline.get("batches") is not None:
        torch.save([_packed(b) for b in baseline["batches"]], folder / SAMPLES_FILE)


def _packed(b: SampledBatch) -> dict:
    t = b.batch
    return {
        "prompts": b.prompts, "texts": b.texts, "lengths": b.lengths, "truncated": b.truncated,
        "tensors": [t.input_ids, t.attention_mask, t.completion_mask],
    }  # fmt: skip


def _unpacked(d: dict) -> SampledBatch:
    return SampledBatch(d["prompts"], d["texts"], TokenBatch(*d["tensors"]), d["lengths"], d["truncated"])


def read_baseline(entry: CacheEntry) -> dict:
    """The baseline stored in a verified entry, in :meth:`Evaluator.sft_baseline`'s shape."""
    rows = [json.loads(line) for line in (entry.path / BASELINE_FILE).read_text().splitlines() if line]
    samples = entry.path / SAMPLES_FILE
    return {
        "texts": [r["text"] for r in rows],
        "rewards": [float(r["reward"]) for r in rows],
        "unsafe": [float(r["unsafe"]) for r in rows],
        "batches": [_unpacked(d) for d in torch.load(samples, weights_only=True)] if samples.exists() else None,
    }


def load_or_sample_baseline(
    cache_root: str | Path, key: dict, prompts: list[str], make_baseline: Callable[[], dict], save: bool = True
) -> tuple[dict, bool, CacheEntry]:
    """The cached baseline for ``key``, made by ``make_baseline`` (and cached, unless ``save`` is false: a process
    other than rank 0) on a miss: ``(baseline, hit, entry)``. ``make_baseline`` is called only on a miss, so a hit
    samples and scores nothing."""
    entry = CacheEntry(cache_root, KIND, key)
    if entry.valid():
        log.info("SFT baseline: cache hit, %d responses from %s", len(prompts), entry.path)
        return read_baseline(entry), True, entry
    log.info("SFT baseline: cache miss, sampling %d responses (cached afterwards at %s)", len(prompts), entry.path)
    baseline = make_baseline()
    if not save:
        return baseline, False, entry
    with entry.build(extra_meta={"n_prompts": len(prompts)}) as tmp:
        write_baseline(tmp, prompts, baseline)
    return baseline, False, entry
