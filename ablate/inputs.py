"""What a run builds before any model trains, shared by the pipeline and the bench: the cache root, the device,
the model source and its tokenizer, the task's prompts, the gold reward and the safety judge; and from those,
the preference pairs, a model loader, the run's one frozen copy of the SFT model and a reference regime's
context."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ablate.config import Config
from ablate.models.loading import ModelSource, load_model, load_tokenizer, resolve_device, resolve_source
from ablate.paths import cache_root
from ablate.refs.base import RefContext, Reference, regime_class
from ablate.refs.model_backed import ModelReference, freeze
from ablate.tasks import task_registry
from ablate.tasks.dataset import TaskData
from ablate.tasks.judges import make_judge, make_safety
from ablate.tasks.pair_tokens import pair_batches
from ablate.tasks.pairs import Pair, pairs_for_run


@dataclass
class RunInputs:
    """A run's inputs that hold no trained weights (built once per run, or once per bench)."""

    cache_root: Path
    device: torch.device
    source: ModelSource
    tokenizer: Any
    prompts: dict[str, list[str]]  # "train", "eval", "test"
    reward: Any  # the gold reward: ablate.tasks.judges (judge=...)
    safety: Any  # the safety judge (safety=...)
    heldout: list[str]  # the text the policy's perplexity is measured on
    data: TaskData | None = None  # task=dataset: what was read from the user's data
    _frozen: torch.nn.Module | None = field(default=None, init=False, repr=False)  # see frozen_copy

    @classmethod
    def build(cls, cfg: Config) -> RunInputs:
        root = cache_root()
        source = resolve_source(cfg.model, root)
        task, device = cfg.task, resolve_device(cfg.model.device)
        tokenizer = load_tokenizer(source)
        loaded = task_registry.task(task.name).load(cfg, tokenizer)
        return cls(
            cache_root=root,
            device=device,
            source=source,
            tokenizer=tokenizer,
            prompts=loaded.prompts,
            reward=make_judge(cfg.judge, device=device, cache_root=root),
            safety=make_safety(cfg.safety, task.unsafe_threshold, device=device, cache_root=root),
            heldout=loaded.heldout,
            data=loaded.data,
        )

    def load(self, **overrides) -> torch.nn.Module:
        """A fresh copy of the SFT model on the run's device (``overrides``: e.g. a quantisation config)."""
        return load_model(self.source, self.device, **overrides)

    def frozen_copy(self) -> torch.nn.Module:
        """The run's one frozen copy of the SFT model (:meth:`load`'s, in eval mode, without gradients), loaded on
        the first call and kept: the evaluator's judge, and the model of a regime that only reads that copy."""
        if self._frozen is None:
            self._frozen = freeze(self.load())
        return self._frozen

    def pairs(self, cfg: Config) -> tuple[list[Pair], bool, Any]:
        """The run's preference pairs: ``(pairs, cache hit, cache entry)``: the data's own (``task=dataset`` with
        pairs; the entry is the data, hit true), else sampled from the SFT model and judged (generated on a miss)."""
        if self.data is not None and self.data.pairs is not None:
            return self.data.pairs, True, self.data
        return pairs_for_run(
            cfg,
            self.cache_root,
            self.source,
            self.tokenizer,
            self.prompts["train"],
            self.reward,
            self.load,
            self.device,
        )

    def ref_context(self, cfg: Config, *, policy=None, pairs=None) -> RefContext:
        """What the run's reference regime is built from: the run's settings by name, not its config. Its loader
        hands a regime that only reads the SFT model (``ModelReference.reads_sft_copy``: ``ref=full``) the frozen
        copy the run holds, if it holds one (:meth:`frozen_copy`), rather than a second copy of the same weights."""
        return RefContext(
            model_dir=str(self.source.path),
            model_fingerprint=self.source.fingerprint,
            tokenizer=self.tokenizer,
            device=self.device,
            algo=cfg.algo.name,
            max_length=getattr(cfg.algo, "max_length", None),  # DPO truncates; PPO and GRPO have no such setting
            precision=cfg.model.precision,
            policy=policy,
            load_model=self._loader(regime_class(cfg.ref.name)),
            train_data=pairs,
            max_sentences=cfg.task.max_sentences,
            cache_root=str(self.cache_root),
        )

    def _loader(self, regime: type[Reference]) -> Callable[..., torch.nn.Module]:
        """How ``regime`` loads the SFT model: :meth:`load` (a fresh copy per call), or, for a regime that only
        reads it while the run holds its frozen copy, that copy (a fresh one all the same with overrides, e.g. a
        quantisation config)."""
        frozen = self._frozen
        if frozen is None or not (issubclass(regime, ModelReference) and regime.reads_sft_copy):
            return self.load
        return lambda **overrides: self.load(**overrides) if overrides else frozen


def prepare_from_pairs(reference: Reference, tokenizer, pairs: list[Pair] | None) -> None:
    """Hand a regime that wants training data (``ref=cached``) the preference pairs' sequences, exactly as DPO
    trains on them (:mod:`ablate.tasks.pair_tokens`, truncated to the algorithm's ``max_length``), in batches of
    the regime's precompute ``batch_size`` pairs: the fixed dataset it can serve."""
    if reference.wants_training_data:
        ctx, rows = reference.ctx, reference.cfg.batch_size
        if rows is None:
            raise ValueError(
                f"ref={reference.name}: ref.batch_size=null (the algorithm's) is settled when the config is validated "
                "(ablate.validation.validate); a regime built by hand needs a batch size"
            )
        reference.prepare(pair_batches(tokenizer, pairs or [], rows, ctx.max_length))
