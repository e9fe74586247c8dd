"""DPO through TRL's ``DPOTrainer``, with reference log-probs from a regime instead of a model.

Before TRL computes the loss, the regime's summed reference log-probs for the chosen and rejected
responses go into the batch, exactly where TRL's own precomputation would put them; TRL loads no
reference model of its own and precomputes nothing (the pipeline prepared the regime, from the same
tokens). TRL trains on the pairs' one tokenisation and collator (:mod:`ablate.tasks.pair_tokens`). How
that is done with TRL is in :mod:`ablate.algos.trl_fence`.

The loss is the algorithm's (:class:`LossOptions`, from ``cfg.algo``), whatever the regime. Under
``algo.loss_type=simpo`` (``ref=none`` only) the reference slot carries SimPO's margin, and TRL's
``sigmoid_norm`` loss runs with SimPO's beta (see :mod:`ablate.algos.simpo`): the loss is SimPO's, not DPO's.
``algo.sft_weight`` adds TRL's ``sft`` loss (logged as ``sft_loss``), ``algo.l2_init`` the L2 to the initial
weights (:mod:`ablate.algos.l2_init`, logged as ``l2_init_loss``; its copy's bytes as ``loss_extra_bytes``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from ablate.algos import loss_probe, registry, trl_fence
from ablate.algos.l2_init import L2ToInit
from ablate.algos.simpo import SimPOParams, margin_reference
from ablate.algos.trl_common import common_args
from ablate.config import algo as schemas
from ablate.refs.base import Reference, TokenBatch
from ablate.tasks.pair_tokens import PairCollator, pad_id, tokenized_dataset


@dataclass(frozen=True)
class LossOptions:
    """DPO's loss beyond TRL's configured ``loss_type``: SimPO in its place, SFT replay and L2 to the initial
    weights beside it. The default changes nothing."""

    simpo: SimPOParams | None = None  # SimPO's beta and margin under algo.loss_type=simpo
    sft_weight: float = 0.0
    l2_init: float = 0.0

    @classmethod
    def from_algo(cls, algo) -> LossOptions:
        """The options of a ``DPOConfig``."""
        simpo = SimPOParams(beta=algo.simpo_beta, gamma=algo.simpo_gamma) if algo.loss_type == "simpo" else None
        return cls(simpo=simpo, sft_weight=algo.sft_weight, l2_init=algo.l2_init)

    def trl_loss(self, loss_type: str) -> tuple[list[str], list[float] | None]:
        """TRL's ``loss_type`` list and ``loss_weights``: the configured loss (SimPO as TRL's ``sigmoid_norm``),
        then TRL's ``sft`` loss with its weight when ``sft_weight > 0``."""
        types = ["sigmoid_norm" if self.simpo is not None else loss_type]
        if self.sft_weight > 0:
            return types + ["sft"], [1.0, self.sft_weight]
        return types, None


def _dpo_trainer_cls():
    class RegimeDPOTrainer(trl_fence.dpo_base()):
        def __init__(self, *args, reference: Reference, loss: LossOptions = LossOptions(), **kwargs):
            self.reference = reference
            self.prefetched = False  # the pass's batches handed to a regime that asks ahead
            self.loss_options = loss
            self.simpo = loss.simpo
            super().__init__(*args, **kwargs)
            check_loss_args(self.args, loss)
            self.l2_init = L2ToInit(loss.l2_init, self.model) if loss.l2_init > 0 else None
            self.loss_extra_bytes = self.l2_init.nbytes if self.l2_init is not None else 0

        reference_use = loss_probe.SEQUENCE_MARGIN

        def reference_logps(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
            """The regime's summed reference log-probs of the chosen and rejected responses (plus SimPO's
            margin under ``algo.loss_type=simpo``). At the first, a regime that asks ahead is handed the pass's
            batches in the loader's order (``Reference.prefetch``)."""
            if self.reference.prefetches and not self.prefetched:
                self.prefetched = True
                self.reference.prefetch(_tokens(b) for b in loss_probe.planned_train_batches(self))
            return self.reference_slot(_tokens(inputs), self.reference.logprobs(_tokens(inputs)).sum(dim=1))

        def reference_slot(self, batch: TokenBatch, ref_sums: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            """What TRL's loss reads as the reference of the chosen and the rejected responses, from the [B] summed
            reference log-probs of the batch's rows ([chosen; rejected]): those, plus SimPO's margin."""
            ref_chosen, ref_rejected = ref_sums.chunk(2, dim=0)
            if self.simpo is not None:
                margin_chosen, margin_rejected = margin_reference(batch.completion_mask, self.simpo)
                ref_chosen = ref_chosen + margin_chosen.to(ref_chosen)
                ref_rejected = ref_rejected + margin_rejected.to(ref_rejected)
            return ref_chosen, ref_rejected

        def first_batch(self, probe=None) -> loss_probe.FirstBatch:
            """The pairs of the first optimiser step, as the training loop draws them (:mod:`~ablate.algos.loss_probe`)."""
            inputs = loss_probe.first_train_batch(self)
            return loss_probe.FirstBatch(_tokens(inputs), inputs)

        def batch_loss(self, first: loss_probe.FirstBatch, ref_logps: torch.Tensor) -> torch.Tensor:
            """The loss TRL optimises on ``first`` with ``ref_logps`` ([B, T-1]) as the reference's log-probs."""
            chosen, rejected = self.reference_slot(first.tokens, ref_logps.sum(dim=1))
            with loss_probe.untracked(self), self.compute_loss_context_manager():
                return self.compute_loss(
                    self.model, {**first.inputs, "ref_chosen_logps": chosen, "ref_rejected_logps": rejected}
                )

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            if self.loss_options.sft_weight > 0:
                self.log_metric("sft_loss", sft_loss(self.last_metric("logps/chosen"), inputs["completion_mask"]))
            if self.l2_init is None:
                return out
            extra = self.l2_init()
            self.log_metric("l2_init_loss", float(extra.detach()))
            self.log_metric("loss_extra_bytes", float(self.l2_init.nbytes))
            return (out[0] + extra, out[1]) if return_outputs else out + extra

    return RegimeDPOTrainer


def _tokens(inputs) -> TokenBatch:
    """The token rows of a collated DPO batch ([chosen; rejected])."""
    return TokenBatch(inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"])


def check_loss_args(args, loss: LossOptions) -> None:
    """Refuse TRL arguments that would silently train another loss than ``loss`` (as :func:`trl_args` builds
    them, they agree): SimPO runs as TRL's ``sigmoid_norm`` loss with SimPO's beta, SFT replay as its ``sft``."""
    if loss.simpo is not None and (args.beta != loss.simpo.beta or "sigmoid_norm" not in args.loss_type):
        raise ValueError(
            f"algo.loss_type=simpo needs DPOConfig(beta={loss.simpo.beta}, loss_type containing 'sigmoid_norm'), "
            f"got beta={args.beta}, loss_type={args.loss_type}: build the arguments with trl_args"
        )
    if loss.sft_weight > 0 and "sft" not in args.loss_type:
        raise ValueError(
            f"algo.sft_weight={loss.sft_weight} needs DPOConfig(loss_type containing 'sft'), "
            f"got loss_type={args.loss_type}: build the arguments with trl_args"
        )


def sft_loss(chosen_logps_mean: float, completion_mask: torch.Tensor) -> float:
    """TRL's ``sft`` term (the mean negative log-prob of the chosen responses' tokens) from TRL's logged mean
    summed log-prob of the chosen responses (``logps/chosen``, 0 outside the responses) and the batch's
    completion mask ([chosen; rejected]). NaN when no chosen token is left (as TRL's mean over none)."""
    chosen_mask, _ = completion_mask[:, 1:].chunk(2, dim=0)
    n_tokens = float(chosen_mask.sum())
    return -chosen_logps_mean * chosen_mask.shape[0] / n_tokens if n_tokens else float("nan")


def trl_args(cfg, out_dir: Path, device: torch.device):
    """TRL ``DPOConfig`` from our config: CPU-sane defaults (no gradient checkpointing, no hub, no reports) and
    the algorithm's loss (:class:`LossOptions`). Under SimPO, TRL's beta is SimPO's (``algo.simpo_beta``), not
    ``algo.beta``."""
    from trl import DPOConfig

    algo = cfg.algo
    loss = LossOptions.from_algo(algo)
    loss_types, loss_weights = loss.trl_loss(algo.loss_type)
    return DPOConfig(
        **common_args(cfg, out_dir, device),
        beta=loss.simpo.beta if loss.simpo is not None else algo.beta,
        loss_type=loss_types,
        loss_weights=loss_weights,
        max_length=algo.max_length,
        truncation_mode="keep_start",
        **trl_fence.DPO_ARGS,  # TRL loads no reference of its own; the regime provides it
        remove_unused_columns=True,
    )


def build_trainer(
    cfg, *, policy, tokenizer, pairs, reference: Reference, callbacks, out_dir: Path, device: torch.device, **_
):
    """The DPO trainer; registered as is (the registry's other keywords are ignored)."""
    cls = _dpo_trainer_cls()
    max_length = cfg.algo.max_length
    return cls(
        model=policy,
        args=trl_args(cfg, out_dir, device),
        train_dataset=tokenized_dataset(tokenizer, pairs, max_length),
        data_collator=PairCollator(pad_id(tokenizer), max_length),
        processing_class=tokenizer,
        reference=reference,
        loss=LossOptions.from_algo(cfg.algo),
        callbacks=callbacks,
    )


registry.register("dpo", build_trainer, schema=schemas.DPOConfig, needs_pairs=True, rank=10)
