"""``ref=cached``: reference log-probs precomputed once for a fixed dataset (the training pairs, in the one
tokenisation DPO trains on: :mod:`ablate.tasks.pair_tokens`), stored content-addressed, and looked up by sequence content during training.

No reference weights are held while training. The cache key covers everything that changes the
numbers: the model's fingerprint, the tokenizer (vocab, special tokens, chat template), the max length
and truncation (and through them the exact token sequences: the dataset fingerprint is a hash of
every sequence as the trainer will see it) and the precision. The values are stored as safetensors
with a checksum per file; a corrupted or partial cache is detected, reported and rebuilt.

A sequence not in the cache (a freshly sampled response, under an online algorithm) follows ``miss``:
``skip`` (no reference term for it: the row comes back all NaN, which PPO and GRPO turn into exactly
zero penalty, zero KL and zero gradient through ``ablate.refs.base.fill_uncovered``; not allowed for
DPO, whose loss has no such rows), ``fallback`` (compute it with a full copy, loaded on the first miss
and counted in ``ref_bytes``) or ``error``. The hit rate is logged.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from ablate.cache import CacheEntry
from ablate.config import RefConfig, require, require_count_or_none
from ablate.models.precision import autocast
from ablate.refs.base import MissingReference, Reference, TokenBatch, module_bytes, register
from ablate.refs.model_backed import freeze, token_logprobs

log = logging.getLogger(__name__)

VALUES, INDEX = "logps.safetensors", "index.json"


@dataclass
class CachedRefConfig(RefConfig):
    name: str = "cached"
    miss: str = (
        "auto"  # skip | fallback | error | auto (settled by validate: error for DPO, skip for online algorithms)
    )
    # precompute batch size, in pairs (2x as many sequences, laid out as DPO's batches); None: algo.batch_size, so
    # the values are those a full reference gives on DPO's own batches (in bf16 the padding of a batch changes the
    # rounding of every row in it: other batches would differ from full in the 4th digit)
    batch_size: int | None = None

    def __post_init__(self) -> None:
        require(
            self.miss in ("skip", "fallback", "error", "auto"),
            f"ref.miss must be skip, fallback, error or auto, got {self.miss!r}",
        )
        require_count_or_none("ref.batch_size", self.batch_size)


def row_key(batch: TokenBatch, i: int) -> str:
    """Content key of row ``i``: its real tokens and which of them are response tokens (padding ignored)."""
    real = batch.attention_mask[i].bool()
    ids = batch.input_ids[i][real].to(torch.int64).cpu().numpy().tobytes()
    comp = batch.completion_mask[i][real].to(torch.int8).cpu().numpy().tobytes()
    return hashlib.sha256(ids + b"|" + comp).hexdigest()


@register(CachedRefConfig)
class CachedReference(Reference):
    rank = 50
    EXTRA_DOCS = {
        "hits": "training sequences whose reference log-probs came from the cache",
        "misses": "training sequences not in the cache (ref.miss: scored by a full copy, NaN, or an error)",
        "hit_rate": "hits / (hits + misses)",
        "model_forwards": "forward passes of the full copy that scored the misses (ref.miss=fallback)",
    }
    wants_training_data = True
    needs_pairs = True

    @classmethod
    def resolve(cls, cfg) -> None:
        """``miss=auto``: ``error`` for DPO (every training pair is cached), ``skip`` for online algorithms;
        ``batch_size=None``: the algorithm's batch size."""
        if cfg.ref.miss == "auto":
            cfg.ref.miss = "error" if cfg.algo.name == "dpo" else "skip"
        if cfg.ref.batch_size is None:
            cfg.ref.batch_size = cfg.algo.batch_size

    @classmethod
    def check_config(cls, cfg) -> None:
        from ablate.errors import ConfigError

        if cfg.algo.name != "dpo" and cfg.ref.miss == "error":  # auto picks skip there
            raise ConfigError(
                f"ref=cached cannot score the fresh samples of algo={cfg.algo.name}: set "
                f"ref.miss=skip (no reference term for them) or ref.miss=fallback (a full copy)"
            )
        if cfg.algo.name == "dpo" and cfg.ref.miss == "skip":
            raise ConfigError(
                "ref.miss=skip is for online algorithms: a DPO pair has no loss without its reference "
                "log-probs; use ref.miss=error (auto: the training pairs are all cached) or fallback"
            )

    def __init__(self, cfg: CachedRefConfig, ctx):
        super().__init__(cfg, ctx)
        require(
            cfg.miss != "auto",
            "ref.miss=auto is settled when the config is validated (ablate.validation.validate): "
            "build CachedReference with miss=skip, fallback or error",
        )
        self.index: dict[str, int] | None = None
        self.values: torch.Tensor | None = None
        self.offsets: torch.Tensor | None = None
        self._fallback: torch.nn.Module | None = None
        self.entry: CacheEntry | None = None
        self.hits = self.misses = self.model_forwards = 0

    # ------------------------------------------------------------------------------------ building
    def cache_key(self, data_fingerprint: str) -> dict:
        from ablate.models.loading import tokenizer_fingerprint

        return {
            "model": self.ctx.model_fingerprint,
            "tokenizer": tokenizer_fingerprint(self.ctx.tokenizer),
            "max_length": self.ctx.max_length,
            "truncation": "keep_start",
            "data": data_fingerprint,
            "precision": str(self.ctx.precision),
            "format": 2,
        }

    def prepare(self, batches: Iterable[TokenBatch]) -> None:
        """Precompute (or load) the log-probs of every sequence in ``batches``: the preference pairs' sequences
        as DPO's collator builds them, the fixed dataset this regime can serve; under online algorithms freshly
        sampled responses then follow ``miss``."""
        t0 = time.perf_counter()
        batches = list(batches)
        keys = [row_key(b, i) for b in batches for i in range(b.input_ids.shape[0])]
        # the batches' padded shapes too: in bf16 a batch's padding changes the rounding of every row in it
        layout = [f"{tuple(b.input_ids.shape)}" for b in batches]
        data_fp = hashlib.sha256("\n".join(keys + layout).encode()).hexdigest()
        self.entry = CacheEntry(self.ctx.cache_root, "refs/cached", self.cache_key(data_fp))
        if not self.entry.valid():
            self._build(batches, keys)
        self._load()
        self._cost.setup_s += time.perf_counter() - t0
        self._cost.cache_bytes = self.entry.nbytes()
        self._update_bytes()

    def _build(self, batches: list[TokenBatch], keys: list[str]) -> None:
        from safetensors.torch import save_file
        from tqdm.auto import tqdm

        model = freeze(self.ctx.load_model())
        rows: dict[str, torch.Tensor] = {}
        k = 0
        for b in tqdm(batches, desc="cached: precomputing reference log-probs", leave=False):
            b = b.to(self.ctx.device)
            with autocast(self.ctx.device, self.ctx.precision):
                lp = token_logprobs(model, b)
            for i in range(b.input_ids.shape[0]):
                pos = b.attention_mask[i].bool().nonzero().squeeze(-1)
                rows.setdefault(keys[k], lp[i, pos[1:] - 1].float().cpu())
                k += 1
        del model
        order = sorted(rows)
        lengths = torch.tensor([rows[r].numel() for r in order], dtype=torch.int64)
        offsets = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        with self.entry.build(extra_meta={"rows": len(order)}) as tmp:
            save_file(
                {"values": torch.cat([rows[r] for r in order]).contiguous(), "offsets": offsets}, str(tmp / VALUES)
            )
            (tmp / INDEX).write_text(json.dumps(order))

    def _load(self) -> None:
        from safetensors.torch import load_file

        tensors = load_file(str(self.entry.path / VALUES))
        self.values, self.offsets = tensors["values"], tensors["offsets"]
        self.index = {key: i for i, key in enumerate(json.loads((self.entry.path / INDEX).read_text()))}

    def _update_bytes(self) -> None:
        held = sum(t.numel() * t.element_size() for t in (self.values, self.offsets) if t is not None)
        self._cost.bytes_held = held + (module_bytes(self._fallback) if self._fallback is not None else 0)

    # ------------------------------------------------------------------------------------- lookups
    def _lookup(self, batch: TokenBatch) -> tuple[torch.Tensor, list[int]]:
        if self.index is None:
            raise RuntimeError("ref=cached was used before its cache was prepared (no training data given)")
        B, T = batch.input_ids.shape
        out = torch.zeros(B, T - 1)
        missing = []
        for i in range(B):
            j = self.index.get(row_key(batch, i))
            if j is None:
                missing.append(i)
                continue
            pos = batch.attention_mask[i].bool().nonzero().squeeze(-1).cpu()
            out[i, pos[1:] - 1] = self.values[self.offsets[j] : self.offsets[j + 1]]
        return out, missing

    def _logprobs(self, batch: TokenBatch) -> torch.Tensor:
        """Cached rows from the cache; missed rows by ``miss``: an error, the full copy's values, or (skip)
        all NaN: no reference term (see :class:`ablate.refs.base.Reference`). Hits and misses are counted in
        training calls only (:attr:`~ablate.refs.base.Reference.counting`)."""
        out, missing = self._lookup(batch)
        if self.counting:
            self.hits += batch.input_ids.shape[0] - len(missing)
            self.misses += len(missing)
            self._publish_counts()
        if missing:
            if self.cfg.miss == "error":
                raise MissingReference(
                    f"ref=cached: {len(missing)} of {batch.input_ids.shape[0]} sequences are not in "
                    f"the cache (miss=error); use ref.miss=fallback or ref.miss=skip"
                )
            if self.cfg.miss == "fallback":
                sub = TokenBatch(*(t[missing] for t in (batch.input_ids, batch.attention_mask, batch.completion_mask)))
                out[missing] = token_logprobs(self._fallback_model(), sub.to(self.ctx.device)).cpu()
                self.model_forwards += 1
                self._cost.extra["model_forwards"] = self.model_forwards
        out = out.to(batch.input_ids.device)
        out = torch.where(batch.target_mask, out, torch.zeros_like(out))
        if missing and self.cfg.miss == "skip":
            out[missing] = torch.nan
        return out

    def state_dict(self) -> dict[str, Any]:
        # the training counters, so that a resumed job's hit rate is the whole job's (as forward_calls)
        return {**super().state_dict(), "hits": self.hits, "misses": self.misses, "model_forwards": self.model_forwards}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.hits, self.misses = int(state.get("hits", 0)), int(state.get("misses", 0))
        self.model_forwards = int(state.get("model_forwards", 0))
        if self.hits or self.misses:
            self._publish_counts()

    def _publish_counts(self) -> None:
        """The training counters as the regime's own cost figures."""
        self._cost.extra.update(
            hits=self.hits,
            misses=self.misses,
            hit_rate=self.hits / max(1, self.hits + self.misses),
            model_forwards=self.model_forwards,
        )

    def _fallback_model(self) -> torch.nn.Module:
        if self._fallback is None:
            log.info("ref=cached: first cache miss, loading a full copy for miss=fallback")
            self._fallback = freeze(self.ctx.load_model())
            self._update_bytes()
        return self._fallback

    def _distribution(self, batch: TokenBatch) -> torch.Tensor:
        raise NotImplementedError(
            "ref=cached stores only per-token log-probs of its dataset: it has no "
            "next-token distribution for fresh samples"
        )
