"""``ref=distilled``: a smaller student distilled from the SFT model stands in for the reference.

The student keeps the teacher's width, tokenizer and (tied) vocabulary and a subset of its decoder
layers: it starts as the teacher's embeddings, final norm and evenly spaced layers (first and last
included when it has two or more), and is then trained to minimise the forward KL(teacher || student)
of the full next-token distributions at the response positions of the SFT distribution, here the
chosen and rejected responses of the DPO pairs (each an SFT sample), in the tokens DPO trains on
(:mod:`ablate.tasks.pair_tokens`).

The student is distilled once and cached content-addressed (safetensors + tokenizer). The key holds
everything that changes its weights: the teacher's fingerprint, the tokenizer, the distillation
sequences' token ids, every config field, the precision and a format version. A cache hit loads no teacher.
Distillation runs under a forked, seeded RNG, so it neither depends on nor disturbs the global
random stream the training run uses afterwards (a hit and a miss leave the run identical).
"""

from __future__ import annotations

import copy
import gc
import hashlib
import json
import logging
import math
import re
import time
from dataclasses import asdict, dataclass, is_dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ablate.cache import CacheEntry
from ablate.config import RefConfig, require
from ablate.errors import ConfigError
from ablate.refs.base import RefContext, register
from ablate.refs.model_backed import ModelReference, freeze

log = logging.getLogger(__name__)

_FORMAT = 2  # 2: keyed on the sequences' token ids (1: on their chat texts)
_KIND = "refs/distilled"
_LAYER_KEY = re.compile(r"^(?P<prefix>(?:.*\.)?layers)\.(?P<idx>\d+)\.(?P<rest>.+)$")


@dataclass
class DistilledRefConfig(RefConfig):
    name: str = "distilled"
    num_layers: int | None = None  # student depth; None: about param_fraction of the teacher's parameters
    param_fraction: float = 0.25  # target student/teacher parameter ratio when num_layers is None
    steps: int = 200  # distillation optimiser steps
    batch_size: int = 8  # sequences per distillation step
    learning_rate: float = 1e-3  # AdamW
    max_length: int = 256  # prompt + response tokens, truncated from the end
    seed: int = 0  # held-out split, batch order and RNG during distillation
    heldout_fraction: float = 0.2  # share of the sequences kept out of training to measure the student's KL

    def __post_init__(self) -> None:
        require(
            self.num_layers is None or self.num_layers >= 1,
            f"ref.num_layers must be >= 1 (or null for param_fraction), got {self.num_layers}",
        )
        require(0.0 < self.param_fraction <= 1.0, f"ref.param_fraction must be in (0, 1], got {self.param_fraction}")
        require(self.steps >= 1, f"ref.steps must be >= 1, got {self.steps}")
        require(self.batch_size >= 1, f"ref.batch_size must be >= 1, got {self.batch_size}")
        require(0.0 < self.learning_rate < 1.0, f"ref.learning_rate must be in (0, 1), got {self.learning_rate}")
        require(self.max_length >= 8, f"ref.max_length must be >= 8, got {self.max_length}")
        require(self.seed >= 0, f"ref.seed must be >= 0, got {self.seed}")
        require(
            0.0 < self.heldout_fraction < 1.0, f"ref.heldout_fraction must be in (0, 1), got {self.heldout_fraction}"
        )


# ------------------------------------------------------------------------------------------ the student
def n_params(model: torch.nn.Module) -> int:
    """Parameters, each shared (tied) tensor counted once."""
    return sum(p.numel() for p in model.parameters())


def _layer_param_counts(model: torch.nn.Module) -> dict[int, int]:
    counts: dict[int, int] = {}
    for name, p in model.named_parameters():
        m = _LAYER_KEY.match(name)
        if m:
            counts[int(m["idx"])] = counts.get(int(m["idx"]), 0) + p.numel()
    return counts


def select_layers(n_teacher: int, n_student: int) -> list[int]:
    """Evenly spaced teacher layer indices; the first and last are included when ``n_student >= 2``."""
    if not 1 <= n_student <= n_teacher:
        raise ValueError(f"cannot take {n_student} of {n_teacher} layers")
    if n_student == 1:
        return [0]
    return [int(math.floor(i * (n_teacher - 1) / (n_student - 1) + 0.5)) for i in range(n_student)]


def resolve_num_layers(cfg: DistilledRefConfig, teacher: torch.nn.Module) -> int:
    """``cfg.num_layers``, or the depth whose parameter count is nearest ``param_fraction`` of the teacher's."""
    layers = _layer_param_counts(teacher)
    n_teacher = len(layers)
    if n_teacher == 0:
        raise ConfigError("ref=distilled: the SFT model has no recognisable decoder layers (*.layers.<i>.*)")
    if cfg.num_layers is not None:
        require(
            cfg.num_layers <= n_teacher,
            f"ref.num_layers must be <= the SFT model's {n_teacher} layers, got {cfg.num_layers}",
        )
        return cfg.num_layers
    total = n_params(teacher)
    per_layer = sum(layers.values()) / n_teacher
    fixed = total - sum(layers.values())  # embeddings, final norm (and an untied head)
    n = math.floor((cfg.param_fraction * total - fixed) / per_layer + 0.5)
    return max(1, min(n_teacher, n))


def init_student(teacher: torch.nn.Module, num_layers: int) -> torch.nn.Module:
    """A ``num_layers``-deep copy of the teacher: its config with fewer layers, its embeddings, final norm,
    head and the evenly spaced layers of :func:`select_layers`. Every weight comes from the teacher."""
    from transformers import AutoModelForCausalLM

    n_teacher = len(_layer_param_counts(teacher))
    keep = select_layers(n_teacher, num_layers)
    config = copy.deepcopy(teacher.config)
    config.num_hidden_layers = num_layers
    if isinstance(getattr(config, "layer_types", None), list) and len(config.layer_types) == n_teacher:
        config.layer_types = [config.layer_types[i] for i in keep]
    dtype = next(teacher.parameters()).dtype
    device = next(teacher.parameters()).device
    new_index = {old: new for new, old in enumerate(keep)}
    state = {}
    for name, t in teacher.state_dict().items():
        m = _LAYER_KEY.match(name)
        if m is None:
            state[name] = t
        elif int(m["idx"]) in new_index:
            state[f"{m['prefix']}.{new_index[int(m['idx'])]}.{m['rest']}"] = t
    with torch.random.fork_rng():  # the random init is overwritten; keep it off the global stream
        student = AutoModelForCausalLM.from_config(config, dtype=dtype)
    student.load_state_dict(state, strict=True)  # every student tensor comes from the teacher
    return student.to(device)


# --------------------------------------------------------------------------------------------- the data
def training_sequences(tokenizer, pairs, max_length: int) -> list[tuple[list[int], int]]:
    """(token ids, prompt length) of every pair's chosen then rejected sequence, in the pairs' one tokenisation
    (:mod:`ablate.tasks.pair_tokens`), each truncated from the end to ``max_length``. Sequences with no
    response token left are dropped."""
    from ablate.tasks.pair_tokens import tokenize_pairs

    seqs = []
    for row in tokenize_pairs(tokenizer, pairs, None):
        for ids, n_prompt in row.sequences():
            ids = ids[:max_length]
            if len(ids) > n_prompt >= 1:
                seqs.append((ids, n_prompt))
    return seqs


def sequences_fingerprint(seqs: list[tuple[list[int], int]]) -> str:
    return hashlib.sha256(json.dumps(seqs).encode()).hexdigest()


def split_heldout(n: int, fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, held-out) indices: a seeded permutation, at least one of each."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(n, generator=g).tolist()
    n_held = max(1, min(n - 1, int(math.floor(fraction * n + 0.5))))
    return sorted(perm[n_held:]), sorted(perm[:n_held])


def collate(seqs: list[tuple[list[int], int]], pad_id: int, device: torch.device):
    """Right-padded ids, attention mask and the [B, T-1] mask of positions that predict a response token."""
    width = max(len(ids) for ids, _ in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), width), dtype=torch.long)
    resp = torch.zeros((len(seqs), width), dtype=torch.bool)
    for i, (row, n_prompt) in enumerate(seqs):
        ids[i, : len(row)] = torch.tensor(row)
        att[i, : len(row)] = 1
        resp[i, n_prompt : len(row)] = True
    return ids.to(device), att.to(device), resp[:, 1:].to(device)


def response_logprobs(model: torch.nn.Module, ids, att, target) -> torch.Tensor:
    """[N, V] float32 next-token log-probs at the N positions of ``target``. The head is applied only there,
    so no [B, T, V] logits are materialised (the student and teacher are causal LMs with a plain linear head)."""
    hidden = model.get_decoder()(input_ids=ids, attention_mask=att, use_cache=False).last_hidden_state
    logits = model.get_output_embeddings()(hidden[:, :-1][target])
    return torch.log_softmax(logits.float(), dim=-1)


def forward_kl_sum(teacher_lp: torch.Tensor, student_lp: torch.Tensor) -> torch.Tensor:
    """Sum over positions of KL(teacher || student) = sum_v p_t (log p_t - log p_s)."""
    return F.kl_div(student_lp, teacher_lp, log_target=True, reduction="sum")


@torch.no_grad()
def heldout_kl(teacher, student, seqs, batch_size: int, pad_id: int, device: torch.device) -> float:
    """Mean per-token forward KL(teacher || student) over every response position of ``seqs``, in fp32."""
    was_training = student.training
    student.eval()
    total, count = 0.0, 0
    with torch.autocast(device.type, enabled=False):
        for i in range(0, len(seqs), batch_size):
            ids, att, target = collate(seqs[i : i + batch_size], pad_id, device)
            total += forward_kl_sum(
                response_logprobs(teacher, ids, att, target), response_logprobs(student, ids, att, target)
            ).item()
            count += int(target.sum())
    student.train(was_training)
    return total / max(count, 1)


# ----------------------------------------------------------------------------------------------- regime
def cache_key(cfg: DistilledRefConfig, ctx: RefContext, seqs: list[tuple[list[int], int]]) -> dict[str, Any]:
    """Everything that changes the student's weights."""
    from ablate.models.loading import tokenizer_fingerprint

    return {
        "model": ctx.model_fingerprint,
        "tokenizer": tokenizer_fingerprint(ctx.tokenizer),
        "sequences": sequences_fingerprint(seqs),
        "config": _config_dict(cfg),
        "precision": _precision(ctx),
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
    """A layer-subset student of the SFT model, distilled on the SFT samples of the DPO pairs (cached)."""

    needs_pairs = True

    def __init__(self, cfg: DistilledRefConfig, ctx: RefContext):
        if not ctx.train_data:
            raise ConfigError("ref=distilled distils on the DPO pairs, but RefContext.train_data is empty")
        self.cache_hit = False
        self._stats: dict[str, Any] = {}
        super().__init__(cfg, ctx)
        self._cost.cache_bytes = self.entry.nbytes()
        self._cost.extra.update(self._stats, cache_hit=self.cache_hit)

    # --- cache ----------------------------------------------------------------------------------------
    def _cache_root(self):
        if self.ctx.cache_root is not None:
            return self.ctx.cache_root
        from ablate.paths import cache_root

        return cache_root()

    # --- build ----------------------------------------------------------------------------------------
    def build_model(self) -> torch.nn.Module:
        from ablate.models.loading import ModelSource, load_model

        seqs = training_sequences(self.ctx.tokenizer, self.ctx.train_data, self.cfg.max_length)
        self.entry = CacheEntry(self._cache_root(), _KIND, cache_key(self.cfg, self.ctx, seqs))
        if self.entry.valid():
            meta = self.entry.meta
            self._stats = dict(meta["distill"])
            self.cache_hit = True
            dtype = getattr(torch, meta.get("dtype", "float32"))
            log.info("distilled reference: cache hit at %s", self.entry.path)
            return load_model(
                ModelSource(self.entry.path, "distilled:" + self.entry.digest), self.ctx.device, dtype=dtype
            )
        assert self.ctx.load_model is not None, "RefContext.load_model is required to distil a reference"
        student, stats = self.distil(seqs)
        dtype = str(next(student.parameters()).dtype).removeprefix("torch.")
        with self.entry.build(extra_meta={"distill": stats, "dtype": dtype}) as tmp:
            student.save_pretrained(tmp)
            self.ctx.tokenizer.save_pretrained(tmp)
        self._stats = stats
        return student

    def distil(self, seqs: list[tuple[list[int], int]]) -> tuple[torch.nn.Module, dict[str, Any]]:
        """Load the teacher, train the student on the sequences, free the teacher. Returns (student, stats)."""
        from tqdm.auto import tqdm

        from ablate.models.precision import autocast

        cfg, ctx, device = self.cfg, self.ctx, self.ctx.device
        tok = ctx.tokenizer
        pad_id = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        if len(seqs) < 2:
            raise ConfigError(
                f"ref=distilled needs at least 2 sequences with a response token within "
                f"ref.max_length={cfg.max_length}, got {len(seqs)}"
            )
        train_idx, held_idx = split_heldout(len(seqs), cfg.heldout_fraction, cfg.seed)
        train, held = [seqs[i] for i in train_idx], [seqs[i] for i in held_idx]

        t0 = time.perf_counter()
        teacher = freeze(ctx.load_model())
        n_layers = resolve_num_layers(cfg, teacher)
        stats: dict[str, Any] = {
            "teacher_params": n_params(teacher),
            "teacher_layers": len(_layer_param_counts(teacher)),
            "student_layers": n_layers,
            "student_layer_indices": select_layers(len(_layer_param_counts(teacher)), n_layers),
            "n_train_sequences": len(train),
            "n_heldout_sequences": len(held),
        }
        with torch.random.fork_rng():  # seeded, and the global stream is left as it was
            torch.manual_seed(cfg.seed)
            student = init_student(teacher, n_layers)
            stats["student_params"] = n_params(student)
            stats["distill_kl_heldout_before"] = heldout_kl(teacher, student, held, cfg.batch_size, pad_id, device)

            student.train()
            opt = torch.optim.AdamW(student.parameters(), lr=cfg.learning_rate, weight_decay=0.0)
            g = torch.Generator().manual_seed(cfg.seed)
            order: list[int] = []
            bar = tqdm(range(cfg.steps), desc="distilling reference", dynamic_ncols=True)
            train_kl = float("nan")
            for _ in bar:
                while len(order) < min(cfg.batch_size, len(train)):
                    order += torch.randperm(len(train), generator=g).tolist()
                batch, order = [train[i] for i in order[: cfg.batch_size]], order[cfg.batch_size :]
                ids, att, target = collate(batch, pad_id, device)
                with autocast(device, ctx.precision):
                    with torch.no_grad():
                        t_lp = response_logprobs(teacher, ids, att, target)
                    s_lp = response_logprobs(student, ids, att, target)
                loss = forward_kl_sum(t_lp, s_lp) / target.sum()
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                train_kl = loss.item()
                bar.set_postfix(kl=f"{train_kl:.4g}")
            bar.close()
            del opt
            stats["distill_kl_train_last"] = train_kl
            stats["distill_kl_heldout"] = heldout_kl(teacher, student, held, cfg.batch_size, pad_id, device)
        stats["distill_s"] = time.perf_counter() - t0
        log.info(
            "distilled a %d-layer reference (%d of %d parameters): held-out KL %.4g -> %.4g",
            n_layers,
            stats["student_params"],
            stats["teacher_params"],
            stats["distill_kl_heldout_before"],
            stats["distill_kl_heldout"],
        )
        del teacher
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return student, stats
