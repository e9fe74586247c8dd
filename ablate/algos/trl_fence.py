"""Every use of TRL's private API, in one module, checked against the installed TRL at start-up.

The harness hands TRL a reference that is not a model (a regime), which TRL 1.x has no public way to take:

- DPO: ``precompute_ref_log_probs=True`` is what makes TRL load no reference model and read the reference's
  summed log-probs from the batch (``inputs["ref_chosen_logps"/"ref_rejected_logps"]``); its precompute pass
  (``_precompute_ref_logps``) does nothing (the pipeline prepared the regime), and the batch gets the regime's
  values. ``_prepare_dataset`` passes a dataset already in token ids through untouched, so DPO trains on the
  pairs' one tokenisation (:mod:`ablate.tasks.pair_tokens`).
- GRPO: TRL has no ``ref_model`` argument and loads its own copy whenever ``beta > 0``; the trainer is built
  with ``beta = 0`` (loading nothing), then gets its real beta and a placeholder ``ref_model``; TRL's one
  reference call, ``_get_per_token_logps_and_entropies(self.ref_model, ...)``, is answered by the regime, and
  the same override fills uncovered rows at loss time. ``_compute_loss`` runs with TRL's KL term, without it,
  or with one of ours summed as TRL sums its per-token loss under ``loss_type="dapo"``.
- Both: the fused LM head (``add_fused_lm_head``, called from :mod:`ablate.models.fused_head`, which the models
  layer uses; its CPU tile functions replaced by memory-lean ones that
  compute bit for bit the same, :func:`use_lean_head`), TRL's metrics buffer ``_metrics`` (DPO also reads its
  ``logps/chosen`` back, to log the SFT replay term) and DPO's token counter ``_total_train_tokens`` (not in the
  Trainer's own state, so a resumed run restores it).
- What ablate reads of TRL's and Accelerate's internals elsewhere, checked here too: GRPO's train sampler
  (``_get_train_sampler``, ``RepeatSampler``'s seed, generator and draw; :func:`ablate.algos.grpo.replayable_epochs`
  reseeds it per epoch, called through Accelerate's ``DataLoaderShard.set_epoch``), Accelerate's prepared data
  loaders (``_dataloaders``, :mod:`ablate.algos.loss_probe`) and the forward it keeps before mixed-precision
  autocast (``_original_forward``, :func:`ablate.models.precision.unwrapped_forward`).

:func:`check` compares what this module relies on (the signatures of the methods it overrides or calls, and
the attributes and batch keys their source reads) with the installed TRL and Accelerate, and fails with one line
naming the library to install.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

import torch

from ablate.errors import MissingAsset
from ablate.models.fused_head import (  # noqa: F401  (the fused head's home is ablate.models.fused_head)
    CHECKED_WITH,
    FUSED_KWARG,
    _fused_head_fn,
    _trl_version,
    add_fused_head,
    fused_logprobs,
    has_fused_head,
    use_lean_head,
)
from ablate.versions import incompatible


# ------------------------------------------------------------------------------------------ the contract
@dataclass(frozen=True)
class Expect:
    """One thing the fence relies on: a TRL function's leading parameters and text its source contains."""

    name: str  # how a failure names it
    get: Callable[[], Callable]  # the function (resolved lazily: TRL imports slowly)
    params: tuple[str, ...]  # its first parameters, in order
    reads: tuple[str, ...] = ()  # attributes / batch keys its source must mention
    library: str = "trl"  # whose function it is: a failure says which library to install


def _dpo():
    from trl import DPOTrainer

    return DPOTrainer


def _accelerator():
    from accelerate import Accelerator

    return Accelerator


def _grpo():
    from trl import GRPOTrainer

    return GRPOTrainer


def _repeat_sampler():
    from trl.trainer.utils import RepeatSampler

    return RepeatSampler


def _data_loader_shard():
    from accelerate.data_loader import DataLoaderShard

    return DataLoaderShard


CONTRACT: tuple[Expect, ...] = (
    Expect(
        "DPOTrainer.__init__",
        lambda: _dpo().__init__,
        ("self", "model", "ref_model", "args"),
        (
            "self.precompute_ref_logps",
            "self._total_train_tokens",
            "self._metrics",
            "self._precompute_ref_logps(",
            "self._prepare_dataset(",
        ),
    ),
    Expect("DPOTrainer._precompute_ref_logps", lambda: _dpo()._precompute_ref_logps, ("self", "dataset", "name")),
    Expect(
        "DPOTrainer._prepare_dataset",
        lambda: _dpo()._prepare_dataset,
        ("self", "dataset", "processing_class", "args", "dataset_name"),
    ),
    Expect(
        "DPOTrainer._compute_loss",
        lambda: _dpo()._compute_loss,
        ("self", "model", "inputs", "return_outputs"),
        ('inputs["ref_chosen_logps"]', 'inputs["ref_rejected_logps"]', "self.precompute_ref_logps", '"logps/chosen"'),
    ),
    Expect(
        "DPOTrainer.compute_loss",
        lambda: _dpo().compute_loss,
        ("self", "model", "inputs", "return_outputs", "num_items_in_batch"),
    ),
    Expect("GRPOTrainer.__init__", lambda: _grpo().__init__, ("self",), ("self.beta = args.beta", "self._metrics")),
    Expect(
        "GRPOTrainer._get_per_token_logps_and_entropies",
        lambda: _grpo()._get_per_token_logps_and_entropies,
        ("self", "model", "input_ids", "attention_mask", "logits_to_keep", "batch_size", "compute_entropy"),
    ),
    Expect(
        "GRPOTrainer._generate_and_score_completions",
        lambda: _grpo()._generate_and_score_completions,
        ("self",),
        ("self.ref_model", "self._get_per_token_logps_and_entropies(", '"ref_per_token_logps"'),
    ),
    Expect(
        "GRPOTrainer._compute_loss",
        lambda: _grpo()._compute_loss,
        ("self", "model", "inputs"),
        (
            "self.beta",
            'inputs["ref_per_token_logps"]',
            "self._get_per_token_logps_and_entropies(",
            "self.args.use_bias_correction_kl",  # k3 times the importance ratio (kl_estimators.loss_penalty)
            '"tool_mask"',
            'normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes',
            "normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation",
        ),
    ),
    Expect(
        "GRPOTrainer._generate_single_turn",
        lambda: _grpo()._generate_single_turn,
        ("self", "prompt_ids", "images", "multimodal_fields", "num_generations"),
        ("return completion_ids, logprobs",),
    ),
    Expect(  # wrapped by ablate.algos.grpo.replayable_epochs: each run's data order, and a resumed epoch's
        "GRPOTrainer._get_train_sampler",
        lambda: _grpo()._get_train_sampler,
        ("self", "dataset"),
        ("RepeatSampler(", "shuffle=self.shuffle_dataset"),
    ),
    Expect(
        "RepeatSampler.__init__",
        lambda: _repeat_sampler().__init__,
        ("self", "data_source"),
        ("self.num_samples = len(data_source)", "self.shuffle = shuffle", "self.seed = seed", "self.generator"),
    ),
    Expect(
        "RepeatSampler.__iter__",
        lambda: _repeat_sampler().__iter__,
        ("self",),
        ("torch.randperm(self.num_samples, generator=self.generator)",),
    ),
    Expect("trl.trainer.add_fused_lm_head", _fused_head_fn, ("model",), (FUSED_KWARG,)),
    Expect(  # where the training loop's data loader is kept once prepared (ablate.algos.loss_probe reads it)
        "Accelerator.prepare_data_loader",
        lambda: _accelerator().prepare_data_loader,
        ("self", "data_loader"),
        ("self._dataloaders",),
        library="accelerate",
    ),
    Expect(  # a resumed epoch's order: the sampler's set_epoch is called through the prepared loader
        "DataLoaderShard.set_epoch",
        lambda: _data_loader_shard().set_epoch,
        ("self", "epoch"),
        ("self.batch_sampler.sampler.set_epoch(epoch)",),
        library="accelerate",
    ),
    Expect(  # where ablate.models.precision.unwrapped_forward finds the forward before mixed-precision autocast
        "Accelerator.prepare_model",
        lambda: _accelerator().prepare_model,
        ("self", "model"),
        ("model._original_forward = model.forward",),
        library="accelerate",
    ),
)


def problems(contract: tuple[Expect, ...] = CONTRACT) -> list[str]:
    """What the installed TRL (and Accelerate) lack of ``contract``, one phrase each (empty: compatible)."""
    return [phrase for found in _problems_by_library(contract).values() for phrase in found]


def _problems_by_library(contract: tuple[Expect, ...]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for e in contract:
        found = out.setdefault(e.library, [])
        try:
            fn = e.get()
        except (ImportError, AttributeError) as err:
            found.append(f"{e.name} is missing ({err})")
            continue
        params = tuple(inspect.signature(fn).parameters)[: len(e.params)]
        if params != e.params:
            found.append(f"{e.name}{_sig(params)} is not {e.name}{_sig(e.params)}")
        source = _source(fn)
        missing = [r for r in e.reads if r not in source]
        if missing:
            found.append(f"{e.name} no longer reads {', '.join(missing)}")
    return {library: found for library, found in out.items() if found}


def check(contract: tuple[Expect, ...] | None = None) -> None:
    """Raise :class:`MissingAsset` (one line) when the installed TRL or Accelerate lacks what this fence relies on."""
    lines = []
    for library, found in _problems_by_library(CONTRACT if contract is None else contract).items():
        if library != "trl":  # pinned by pyproject.toml: ablate.versions says which version
            lines.append(incompatible(library, found))
            continue
        lines.append(
            f"trl {_trl_version()} is incompatible with ablate (checked with trl=={', '.join(CHECKED_WITH)}): "
            f"{'; '.join(found)}; install trl=={CHECKED_WITH[-1]}"
        )
    if lines:
        raise MissingAsset("; ".join(lines))


def _sig(params: tuple[str, ...]) -> str:
    return f"({', '.join(params)})"


def _source(fn: Callable) -> str:
    try:
        return inspect.getsource(fn)
    except (OSError, TypeError):
        return ""


# ----------------------------------------------------------------------------------------- the trainers
class RegimeRefSlot(torch.nn.Module):
    """Stands where TRL's GRPO keeps its reference model; never called as a model."""


class TRLState:
    """What both fenced trainers read and write of TRL's private state: its metrics buffer, its token counter
    (DPO's ``num_tokens``, not in the Trainer's own state; GRPO counts in the Trainer state and keeps it at 0),
    and the resume record built from them. Mixed in before TRL's trainer class."""

    #: bytes the loss holds beyond the policy and the reference (DPO's ``algo.l2_init`` copy), for the summary
    loss_extra_bytes: int = 0

    def log_metric(self, name: str, value: float) -> None:
        """One value of a metric of the current mode, averaged into TRL's next log."""
        self._metrics["train" if self.model.training else "eval"][name].append(value)

    def last_metric(self, name: str) -> float:
        """The value TRL's loss logged last under ``name`` (the micro-batch whose loss was just computed)."""
        return self._metrics["train" if self.model.training else "eval"][name][-1]

    @property
    def train_tokens(self) -> int:
        """TRL's own count of training tokens, kept for the resume record."""
        return self._total_train_tokens

    @train_tokens.setter
    def train_tokens(self, n: int) -> None:
        self._total_train_tokens = n

    # ------------------------------------------------------------------------ what resume and KL control read
    @property
    def kl_coef(self) -> float:
        """The KL coefficient now: DPO's fixed beta; GRPO's controller's (0 without a reference)."""
        return float(self.beta)

    def resume_state(self) -> dict:
        """What a checkpoint records to resume exactly: the KL coefficient and TRL's token counter."""
        return {"kl_coef": self.kl_coef, "trl_train_tokens": self.train_tokens}

    def restore(self, saved: dict) -> None:
        """Continue from :meth:`resume_state`'s record: TRL's token counter (subclasses add what else moves)."""
        if saved.get("trl_train_tokens") is not None:
            self.train_tokens = saved["trl_train_tokens"]


@cache
def dpo_base():
    """``DPOTrainer`` with a regime's reference in place of TRL's. Subclasses implement
    :meth:`reference_logps`; TRL's args must have
    ``precompute_ref_log_probs=True`` (:data:`DPO_ARGS`)."""
    from trl import DPOTrainer

    use_lean_head()

    class FencedDPOTrainer(TRLState, DPOTrainer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, ref_model=None, **kwargs)
            if not self.precompute_ref_logps:
                raise ValueError("the regime's DPO trainer needs DPOConfig(precompute_ref_log_probs=True)")

        def _precompute_ref_logps(self, dataset, name, batch_size):
            """TRL's precompute pass does nothing: the pipeline prepared the regime before the trainer was built."""
            return dataset

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            """A dataset already in token ids (:func:`ablate.tasks.pair_tokens.tokenized_dataset`) is used as is:
            the pairs have one tokenisation; any other goes through TRL's own."""
            from ablate.tasks.pair_tokens import COLUMNS

            if set(COLUMNS) <= set(dataset.column_names):
                return dataset
            return super()._prepare_dataset(dataset, processing_class, args, dataset_name)

        def reference_logps(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
            """[B/2] each: the reference's summed log-probs of the chosen and the rejected responses."""
            raise NotImplementedError

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if "ref_chosen_logps" not in inputs:
                chosen, rejected = self.reference_logps(inputs)
                inputs = {**inputs, "ref_chosen_logps": chosen, "ref_rejected_logps": rejected}
            return super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )

    return FencedDPOTrainer


#: the DPOConfig settings the fenced DPO trainer needs: TRL loads no reference and reads the batch's values
DPO_ARGS = {"precompute_ref_log_probs": True}


@cache
def grpo_base():
    """``GRPOTrainer`` with a regime's reference in place of TRL's, built with ``GRPOConfig(beta=0)`` and the real
    ``beta``: subclasses implement :meth:`reference_token_logps` (:meth:`loss_reference`, :meth:`loss_kl` too)."""
    from trl import GRPOTrainer

    use_lean_head()

    class FencedGRPOTrainer(TRLState, GRPOTrainer):
        #: False: TRL's loss runs without its KL term (the KL is in the reward, or :meth:`loss_kl`'s)
        kl_in_loss = True
        #: the task's stop rule (``task.max_sentences``, :mod:`ablate.stop_rule`); None: EOS or the cap only
        max_sentences: int | None = None

        def __init__(self, *args, beta: float, **kwargs):
            if kwargs["args"].beta != 0.0:
                raise ValueError("the regime's GRPO trainer is built with GRPOConfig(beta=0); pass beta= instead")
            self._loss_inputs: dict | None = None  # the inputs of the loss being computed
            super().__init__(*args, **kwargs)  # beta = 0: TRL loads no reference model
            self.beta = beta
            self.ref_model = RegimeRefSlot() if beta != 0.0 else None

        def _generate_single_turn(self, prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs):
            """TRL's rollouts cut by the task's stop rule (:func:`ablate.stop_rule.cut_rollouts`). In bf16 training
            the whole ``generate`` runs inside one bf16 autocast region: Accelerate's wrapper enters and leaves
            autocast at every forward, which empties autocast's cache of bf16 weight copies, so each decoded token
            cast every weight again; nested in an outer region the copies are made once per call (the same values,
            so the same tokens; docs/measured.md)."""
            from ablate.models.precision import autocast
            from ablate.stop_rule import cut_rollouts

            with autocast(self.accelerator.device, "bf16") if self.args.bf16 else contextlib.nullcontext():
                out = super()._generate_single_turn(
                    prompt_ids, images, multimodal_fields, num_generations, *args, **kwargs
                )
            return cut_rollouts(self.processing_class, *out, set(self.eos_token_ids), self.max_sentences)

        def reference_token_logps(self, input_ids, attention_mask, logits_to_keep, batch_size) -> torch.Tensor:
            """[B, logits_to_keep] the reference's log-probs of the completion tokens (TRL's reference call)."""
            raise NotImplementedError

        def loss_reference(self, ref_logps: torch.Tensor, policy_logps: torch.Tensor) -> torch.Tensor:
            """The reference log-probs TRL's loss uses, given the loss-time policy log-probs (default: as is)."""
            return ref_logps

        def loss_kl(self, policy_logps, ref_logps, mask) -> torch.Tensor | None:
            """[B, T] with :attr:`kl_in_loss` False: a per-token KL term added to the loss times beta (None: none)."""
            return None

        def policy_token_logps(self, input_ids, attention_mask, logits_to_keep, batch_size) -> torch.Tensor:
            """[B, logits_to_keep] the policy's log-probs of the completion tokens, computed as TRL computes them."""
            logps, _, _ = super()._get_per_token_logps_and_entropies(
                self.model, input_ids, attention_mask, logits_to_keep, batch_size
            )
            return logps

        def _compute_loss(self, model, inputs):
            beta, own = self.beta, not self.kl_in_loss and self.beta != 0.0  # own: TRL's KL term left out
            self._loss_inputs, self._loss_logps, self.beta = dict(inputs), None, 0.0 if own else beta
            try:
                loss = super()._compute_loss(model, self._loss_inputs)
                mask = inputs["completion_mask"] * inputs.get("tool_mask", 1)  # the tokens TRL's loss sums over
                term = self.loss_kl(self._loss_logps, inputs["ref_per_token_logps"], mask) if own else None
            finally:
                self.beta, self._loss_inputs, self._loss_logps = beta, None, None
            return loss if term is None else loss + beta * self.dapo_sum(term, mask, inputs)

        def dapo_sum(self, per_token: torch.Tensor, mask: torch.Tensor, inputs: dict) -> torch.Tensor:
            """A per-token loss term summed as TRL's ``_compute_loss`` sums its own under ``loss_type="dapo"``."""
            normalizer = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if self.model.training:
                normalizer = normalizer * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            return (per_token * mask).sum() / normalizer

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, *a, **kw):
            if isinstance(model, RegimeRefSlot):
                batch_size = kw.get("batch_size", a[0] if a else None)
                return self.reference_token_logps(input_ids, attention_mask, logits_to_keep, batch_size), None, None
            out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep, *a, **kw)
            inputs = self._loss_inputs
            if inputs is not None:  # inside _compute_loss: the loss-time log-probs, and the reference TRL reads next
                self._loss_logps = out[0]
                if inputs.get("ref_per_token_logps") is not None:
                    inputs["ref_per_token_logps"] = self.loss_reference(inputs["ref_per_token_logps"], out[0])
            return out

    return FencedGRPOTrainer
