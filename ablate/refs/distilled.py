"""``ref=distilled``: a smaller model distilled from the SFT model stands in for the reference.

By default the student is built from the SFT model itself: its embeddings, final norm and head, and evenly spaced
decoder blocks (about every k-th, the first and last included), as many as hold ``param_fraction`` of the
teacher's *non-embedding* parameters (:mod:`.distill_student`: a quarter of SmolLM2-135M is 8 of its 30 blocks).
``ref.path`` instead names an existing smaller model with the SFT model's tokenizer (a local folder, or a hub id
on a machine that can download it), refused in one line otherwise (:mod:`.distill_source`); with ``steps=0`` it
is used as it is.

The student is trained to minimise the forward KL(teacher || student) of the full next-token distributions at
the response positions of the SFT distribution (:mod:`.distill_data`: the DPO pairs' responses, plus fresh SFT
samples on the training prompts), until its held-out per-token KL is at most ``target_kl`` or ``steps`` steps are
done (:mod:`.distill_train`). What it reached, after how many steps and how long, are the regime's cost figures.

The student is distilled once and cached content-addressed (safetensors + tokenizer). The key holds everything
that changes its weights: the teacher's fingerprint, the tokenizer, the pairs' token ids, every config field, the
``ref.path`` model's fingerprint, the precision and a format version. A cache hit loads no teacher. Distillation
runs under a forked, seeded RNG, so it neither depends on nor disturbs the global random stream the training run
uses afterwards (a hit and a miss leave the run identical).
"""

from __future__ import annotations

import gc
import logging
import time
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

import torch

from ablate.cache import CacheEntry
from ablate.config import RefConfig, require
from ablate.errors import ConfigError
from ablate.refs.base import RefContext, register
from ablate.refs.distill_data import fresh_sequences, pair_sequences, sequences_fingerprint, split_by_prompt
from ablate.refs.distill_source import check_compatible, check_path, path_source
from ablate.refs.distill_student import init_student, layer_param_counts, resolve_num_layers, select_layers, size_stats
from ablate.refs.distill_train import distil_loop, heldout_kl, reached
from ablate.refs.model_backed import ModelReference, freeze

log = logging.getLogger(__name__)

_FORMAT = 4  # 4: fresh samples end by the task's stop rule; 3: non-embedding depth, stopping rule, fresh samples
_KIND = "refs/distilled"


@dataclass
class DistilledRefConfig(RefConfig):
    name: str = "distilled"
    path: str | None = None  # an existing smaller model (folder or hub id) with the SFT model's tokenizer
    num_layers: int | None = None  # student depth; None: param_fraction of the teacher's non-embedding parameters
    param_fraction: float = 0.25  # smallest student with at least this share of the non-embedding parameters
    target_kl: float | None = 0.5  # stop once the held-out KL per token (nats) is <= this; None: run all steps
    eval_every: int = 50  # steps between held-out KL measurements (the stopping rule's checks)
    steps: int = 400  # at most this many optimiser steps; 0 (ref.path only): use that model as it is
    batch_size: int = 8  # sequences per distillation step
    learning_rate: float = 5e-4  # AdamW, constant, gradients clipped at norm 1
    train_embeddings: bool = False  # also train the (copied) embedding and head
    fresh_per_prompt: int = 8  # SFT samples drawn per training prompt to distil on, besides the pairs' responses
    fresh_max_new_tokens: int = 64  # their length cap (the task's default); they end by the task's stop rule too
    max_length: int = 256  # prompt + response tokens, truncated from the end
    seed: int = 0  # held-out split, batch order, fresh samples and RNG during distillation
    heldout_fraction: float = 0.2  # share of the pairs' prompts kept out of training to measure the student's KL

    def __post_init__(self) -> None:
        require(
            self.num_layers is None or self.num_layers >= 1,
            f"ref.num_layers must be >= 1 (or null for param_fraction), got {self.num_layers}",
        )
        require(
            self.path is None or self.num_layers is None,
            "ref.num_layers sets the depth of a student built from the SFT model; with ref.path the student is "
            "that model: drop one",
        )
        require(0.0 < self.param_fraction <= 1.0, f"ref.param_fraction must be in (0, 1], got {self.param_fraction}")
        require(
            self.target_kl is None or self.target_kl > 0,
            f"ref.target_kl must be > 0 (or null: run all steps), got {self.target_kl}",
        )
        require(self.eval_every >= 1, f"ref.eval_every must be >= 1, got {self.eval_every}")
        require(
            self.steps >= (0 if self.path else 1),
            f"ref.steps must be >= 1 (0 only with ref.path: use that model as it is), got {self.steps}",
        )
        require(self.batch_size >= 1, f"ref.batch_size must be >= 1, got {self.batch_size}")
        require(0.0 < self.learning_rate < 1.0, f"ref.learning_rate must be in (0, 1), got {self.learning_rate}")
        require(self.fresh_per_prompt >= 0, f"ref.fresh_per_prompt must be >= 0, got {self.fresh_per_prompt}")
        require(
            self.fresh_max_new_tokens >= 1, f"ref.fresh_max_new_tokens must be >= 1, got {self.fresh_max_new_tokens}"
        )
        require(self.max_length >= 8, f"ref.max_length must be >= 8, got {self.max_length}")
        require(self.seed >= 0, f"ref.seed must be >= 0, got {self.seed}")
        require(
            0.0 < self.heldout_fraction < 1.0, f"ref.heldout_fraction must be in (0, 1), got {self.heldout_fraction}"
        )


def cache_key(cfg: DistilledRefConfig, ctx: RefContext, seqs, source=None) -> dict[str, Any]:
    """Everything that changes the student's weights (``source``: the ``ref.path`` model, if any)."""
    from ablate.models.loading import tokenizer_fingerprint

    return {
        "model": ctx.model_fingerprint,
        "tokenizer": tokenizer_fingerprint(ctx.tokenizer),
        "sequences": sequences_fingerprint(seqs),
        "config": _config_dict(cfg),
        "student_source": source.fingerprint if source is not None else None,
        "precision": _precision(ctx),
        "device": ctx.device.type,  # kernels differ, and so would the trained weights
        "max_sentences": ctx.max_sentences,  # the fresh samples' stop rule
        "format": _FORMAT,
    }


def _config_dict(cfg) -> dict[str, Any]:
    if is_dataclass(cfg):
        return asdict(cfg)
    from omegaconf import OmegaConf

    return OmegaConf.to_container(cfg, resolve=True)


def _precision(ctx: RefContext) -> str:
    from ablate.models.precision import is_bf16

    return "bf16" if is_bf16(ctx.precision) else "fp32"


@register(DistilledRefConfig)
class DistilledReference(ModelReference):
    """A smaller student of the SFT model (its own layers, or ``ref.path``), distilled on the SFT distribution
    until its held-out KL meets a target (cached)."""

    rank = 70
    audited = True

    EXTRA_DOCS = {
        "cache_hit": "1 when the student came from the cache (distilled by an earlier job, whose figures below are), "
        "else 0",
        "distill_kl_heldout_before": "held-out KL(SFT || student) per token before distillation (nats)",
        "distill_kl_heldout": "held-out KL(SFT || student) per token after distillation (nats)",
        "distill_kl_train_last": "the last distillation step's training KL per token (nats)",
        "distill_steps": "distillation steps taken",
        "distill_target_reached": "1 when the held-out KL reached ref.target_kl, else 0",
        "distill_s": "seconds the distillation took (on a cache hit, in the job that built the student)",
        "fresh_sample_s": "seconds sampling the fresh SFT responses the student trains on (likewise)",
        "n_fresh_sequences": "fresh SFT responses sampled for distillation",
        "n_train_sequences": "sequences the student trained on (the pairs' responses and the fresh ones)",
        "n_heldout_sequences": "sequences held out to measure the student's KL",
        "teacher_params": "parameters of the SFT model",
        "teacher_nonembedding_params": "the SFT model's parameters outside the embedding and head",
        "teacher_layers": "transformer blocks of the SFT model",
        "student_params": "parameters of the student",
        "student_nonembedding_params": "the student's parameters outside the embedding and head",
        "student_nonembedding_fraction": "student_nonembedding_params / teacher_nonembedding_params",
        "student_layers": "transformer blocks of the student",
    }

    needs_pairs = True

    @classmethod
    def check_config(cls, cfg) -> None:
        check_path(cfg.ref.path)

    def __init__(self, cfg: DistilledRefConfig, ctx: RefContext):
        if not ctx.train_data:
            raise ConfigError("ref=distilled distils on the DPO pairs, but RefContext.train_data is empty")
        self.cache_hit = False
        self.entry: CacheEntry | None = None  # None: a ref.path model used as it is (steps=0), nothing cached
        self._stats: dict[str, Any] = {}
        super().__init__(cfg, ctx)
        self._cost.cache_bytes = self.entry.nbytes() if self.entry is not None else 0
        self._cost.extra.update(self._stats, cache_hit=self.cache_hit)

    def _cache_root(self):
        if self.ctx.cache_root is not None:
            return self.ctx.cache_root
        from ablate.paths import cache_root

        return cache_root()

    # --- build ----------------------------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        from ablate.models.loading import ModelSource, load_model

        cfg, ctx = self.cfg, self.ctx
        seqs = pair_sequences(ctx.tokenizer, ctx.train_data, cfg.max_length)
        source = None
        if cfg.path:
            source = path_source(cfg.path, self._cache_root())
            check_compatible(cfg.path, source, ctx.tokenizer, ctx.model_dir)  # one line, before any weights load
            if cfg.steps == 0:
                student, self._stats = self.distil(seqs, source)
                return student
        self.entry = CacheEntry(self._cache_root(), _KIND, cache_key(cfg, ctx, seqs, source))
        if self.entry.valid():
            meta = self.entry.meta
            self._stats = dict(meta["distill"])
            self.cache_hit = True
            dtype = getattr(torch, meta.get("dtype", "float32"))
            log.info("distilled reference: cache hit at %s", self.entry.path)
            return load_model(ModelSource(self.entry.path, "distilled:" + self.entry.digest), ctx.device, dtype=dtype)
        student, stats = self.distil(seqs, source)
        dtype = str(next(student.parameters()).dtype).removeprefix("torch.")
        with self.entry.build(extra_meta={"distill": stats, "dtype": dtype}) as tmp:
            student.save_pretrained(tmp)
            ctx.tokenizer.save_pretrained(tmp)
        self._stats = stats
        return student

    def distil(self, seqs, source=None) -> tuple[torch.nn.Module, dict[str, Any]]:
        """Load the teacher, build the student (the teacher's blocks, or ``source``'s model), sample fresh SFT
        responses if training is needed, train to the target or the cap, free the teacher. Returns (student,
        figures)."""
        from ablate.models.loading import load_model

        assert self.ctx.load_model is not None, "RefContext.load_model is required to distil a reference"
        cfg, ctx, device = self.cfg, self.ctx, self.ctx.device
        tok = ctx.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        train_idx, held_idx = split_by_prompt([p for p, _, _ in seqs], cfg.heldout_fraction, cfg.seed)
        train = [seqs[i][1:] for i in train_idx]
        held = [seqs[i][1:] for i in held_idx]
        train_prompts = list(dict.fromkeys(seqs[i][0] for i in train_idx))

        t0 = time.perf_counter()
        teacher = freeze(ctx.load_model())
        stats: dict[str, Any] = {"student_source": str(cfg.path) if source is not None else "teacher layers"}
        with torch.random.fork_rng():  # seeded, and the global stream is left as it was
            torch.manual_seed(cfg.seed)
            if source is not None:
                student = load_model(source, device)
            else:
                n_layers = resolve_num_layers(cfg, teacher)
                student = init_student(teacher, n_layers)
                stats["student_layer_indices"] = select_layers(len(layer_param_counts(teacher)), n_layers)
            stats.update(size_stats(teacher, student))
            before = heldout_kl(teacher, student, held, cfg.batch_size, pad_id, device)
            train_more = cfg.steps > 0 and not reached(before, cfg.target_kl)
            fresh = self._fresh(teacher, train_prompts, stats) if train_more else []
            stats.update(n_train_sequences=len(train) + len(fresh), n_heldout_sequences=len(held))
            stats.update(
                distil_loop(
                    teacher,
                    student,
                    train + fresh,
                    held,
                    cfg,
                    device=device,
                    precision=ctx.precision,
                    pad_id=pad_id,
                    kl_before=before,
                )
            )
        stats["distill_s"] = time.perf_counter() - t0
        log.info(
            "distilled reference (%s, %d of %d non-embedding parameters): held-out KL %.4g -> %.4g in %d steps, %.0f s",
            stats["student_source"],
            stats["student_nonembedding_params"],
            stats["teacher_nonembedding_params"],
            stats["distill_kl_heldout_before"],
            stats["distill_kl_heldout"],
            stats["distill_steps"],
            stats["distill_s"],
        )
        del teacher
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return student, stats

    def _fresh(self, teacher, prompts: list[str], stats: dict[str, Any]) -> list:
        """``ref.fresh_per_prompt`` SFT samples per training prompt (:func:`.distill_data.fresh_sequences`);
        their count and sampling time go into ``stats``."""
        cfg = self.cfg
        t0 = time.perf_counter()
        fresh = fresh_sequences(
            teacher,
            self.ctx.tokenizer,
            prompts,
            n_per_prompt=cfg.fresh_per_prompt,
            max_new_tokens=cfg.fresh_max_new_tokens,
            max_length=cfg.max_length,
            seed=cfg.seed,
            precision=self.ctx.precision,
            max_sentences=self.ctx.max_sentences,
        )
        stats.update(n_fresh_sequences=len(fresh), fresh_sample_s=time.perf_counter() - t0)
        return fresh
