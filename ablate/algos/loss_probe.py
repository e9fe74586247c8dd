"""What a trainer offers the fidelity audit (:mod:`ablate.eval.fidelity`): its own loss on its first batch, with
reference log-probs the audit chooses (the regime's, as training receives them, or the truth's).

Every trainer an algorithm builds implements the protocol below, so the audit measures the loss the optimiser
steps on, not a copy of it:

- ``reference_use``: what its loss reads of the reference, :data:`SEQUENCE_MARGIN` (DPO: the chosen-minus-rejected
  sum of log-probs) or :data:`TOKEN_PENALTY` (GRPO, PPO: a per-token KL penalty); it decides which fidelity
  figures apply.
- ``first_batch(probe)`` -> :class:`FirstBatch`: the batch of its first optimiser step (DPO: exactly the one its
  data loader yields first; GRPO and PPO: fresh rollouts of its first prompts, drawn as it draws them, seeded by
  the probe).
- ``batch_loss(first, ref_logps)``: the loss its optimiser would step on for that batch, given ``[B, T-1]``
  reference log-probs of ``first.tokens``' response tokens (NaN rows: no reference term, as training treats
  them); with the graph to the policy's weights, in the precision training computes it in, and without touching
  the trainer's logs or counters.

A trainer reads its regime from its ``reference`` attribute (the audit measures several regimes with one trainer).

The private TRL / Accelerate state read here is checked at start-up with the rest of the fence
(:data:`ablate.algos.trl_fence.CONTRACT`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from ablate.batch import TokenBatch

SEQUENCE_MARGIN = "sequence_margin"
TOKEN_PENALTY = "token_penalty"


@dataclass
class FirstBatch:
    """A trainer's first batch: the token rows whose reference log-probs its loss reads, and what else the trainer
    needs to compute that loss (its own batch format), and the gold rewards of an online batch."""

    tokens: TokenBatch
    inputs: Any
    rewards: torch.Tensor | None = None


@contextmanager
def untracked(trainer) -> Iterator[None]:
    """Run the trainer's loss without a trace: TRL's metrics buffer, its token counters and the Trainer's count of
    tokens seen are put back as they were (an audit at step 0 would otherwise be averaged into step 1's logs)."""
    metrics = copy.deepcopy(getattr(trainer, "_metrics", None))
    tokens = getattr(trainer, "_total_train_tokens", None)
    seen = trainer.state.num_input_tokens_seen
    try:
        yield
    finally:
        if metrics is not None:
            trainer._metrics = metrics
        if tokens is not None:
            trainer._total_train_tokens = tokens
        trainer.state.num_input_tokens_seen = seen


def first_train_batch(trainer) -> dict:
    """The first batch the HF trainer's training loop draws, collated and on the trainer's device, without drawing
    from its data loader: the loop's prepared loader (the last one Accelerate prepared, once ``train`` has started;
    a new one before that) is asked for its first indices (its sampler is seeded by ``data_seed`` and the epoch,
    and reseeds itself on every pass) and its collator builds the batch from them, as its fetcher does."""
    loaders = trainer.accelerator._dataloaders
    loader = loaders[-1] if loaders else trainer.get_train_dataloader()
    indices = next(iter(loader.batch_sampler))
    batch = loader.collate_fn([loader.dataset[i] for i in indices])
    if isinstance(batch, dict):
        return {k: v.to(trainer.accelerator.device) if torch.is_tensor(v) else v for k, v in batch.items()}
    return batch  # GRPO's rows: prompts, collated as a list


def planned_train_batches(trainer) -> list[dict]:
    """The batches of the training loop's current pass over its data, in the order its loader will yield them,
    collated as :func:`first_train_batch` collates the first (for a reference that asks ahead: ``Reference.prefetch``).
    Listing a whole pass moves a seedable sampler to its next epoch: its epoch is put back."""
    loaders = trainer.accelerator._dataloaders
    loader = loaders[-1] if loaders else trainer.get_train_dataloader()
    sampler = getattr(loader.batch_sampler, "sampler", None)
    epoch = getattr(sampler, "epoch", None)
    try:
        order = list(iter(loader.batch_sampler))
    finally:
        if epoch is not None:
            sampler.set_epoch(epoch)
    return [loader.collate_fn([loader.dataset[i] for i in indices]) for indices in order]


def _base(model):
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def installed_head(model):
    """The forward a trainer installed on ``model`` (TRL's trainers put a fused LM head with the outputs their loss
    reads on the policy at construction; None: the class's own forward)."""
    return _base(model).__dict__.get("forward")


def install_head(model, forward) -> None:
    """Put back a forward :func:`installed_head` returned: several trainers on one policy (the audit's) each compute
    their loss with their own head."""
    base = _base(model)
    if forward is None:
        base.__dict__.pop("forward", None)
    else:
        base.forward = forward
