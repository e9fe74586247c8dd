"""DPO through TRL's ``DPOTrainer``, with reference log-probs from a regime instead of a model.

The subclass touches one hook: before TRL computes the loss, it puts the regime's summed
reference log-probs for the chosen and rejected responses into the batch, exactly where TRL's
own precomputation would. TRL is told it has precomputed log-probs (so it loads no reference
model of its own), and its precompute pass is a no-op: the regime decides what, if anything,
is precomputed.

Under ``ref=none ref.loss=simpo`` the same slot carries SimPO's margin, and TRL's ``sigmoid_norm`` loss
runs with SimPO's beta (see :mod:`ablate.algos.simpo`): the loss is SimPO's, not DPO's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ablate.algos.simpo import SimPOParams, margin_reference
from ablate.algos.trl_common import common_args
from ablate.config import value_of
from ablate.refs.base import Reference, TokenBatch
from ablate.tasks.pairs import pairs_dataset


def _dpo_trainer_cls():
    from trl import DPOTrainer

    class RegimeDPOTrainer(DPOTrainer):
        def __init__(self, *args, reference: Reference, **kwargs):
            self.reference = reference
            self.simpo = simpo_params(reference)
            super().__init__(*args, ref_model=None, **kwargs)
            if self.simpo is not None:
                check_simpo_args(self.args, self.simpo)

        def _precompute_ref_logps(self, dataset, name, batch_size):
            """TRL's precompute pass, handed to the regime: regimes that precompute (``cached``) get the
            training sequences exactly as the collator will build them; the others need nothing."""
            if getattr(self.reference, "wants_training_data", False) and name == "train":
                from torch.utils.data import DataLoader

                bs = getattr(self.reference.cfg, "batch_size", batch_size)
                loader = DataLoader(dataset, batch_size=bs, collate_fn=self.data_collator, shuffle=False)
                self.reference.prepare(
                    TokenBatch(b["input_ids"], b["attention_mask"], b["completion_mask"]) for b in loader
                )
            return dataset

        def reference_logps(self, inputs) -> dict[str, torch.Tensor]:
            """The regime's summed reference log-probs of the chosen and rejected responses (plus SimPO's
            margin under ``ref.loss=simpo``), under the keys TRL reads."""
            batch = TokenBatch(inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"])
            ref_chosen, ref_rejected = self.reference.sequence_logprobs(batch).chunk(2, dim=0)
            if self.simpo is not None:
                margin_chosen, margin_rejected = margin_reference(batch.completion_mask, self.simpo)
                ref_chosen = ref_chosen + margin_chosen.to(ref_chosen)
                ref_rejected = ref_rejected + margin_rejected.to(ref_rejected)
            return {"ref_chosen_logps": ref_chosen, "ref_rejected_logps": ref_rejected}

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            if "ref_chosen_logps" not in inputs:
                inputs = {**inputs, **self.reference_logps(inputs)}
            out = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            extra = self.reference.extra_loss(model) if hasattr(self.reference, "extra_loss") else None
            if extra is None:
                return out
            self._metrics["train"]["ref_extra_loss"].append(float(extra.detach()))
            return (out[0] + extra, out[1]) if return_outputs else out + extra

    return RegimeDPOTrainer


def simpo_params(reference: Reference | None) -> SimPOParams | None:
    """SimPO's beta and margin when the regime trains with SimPO (``ref=none ref.loss=simpo``), else None."""
    return reference.simpo() if reference is not None and hasattr(reference, "simpo") else None


def check_simpo_args(args, simpo: SimPOParams) -> None:
    """SimPO runs as TRL's ``sigmoid_norm`` loss with SimPO's beta: refuse arguments that would silently train
    another loss (as ``trl_args`` builds them, they agree)."""
    if args.beta != simpo.beta or "sigmoid_norm" not in args.loss_type:
        raise ValueError(
            f"ref.loss=simpo needs DPOConfig(beta={simpo.beta}, loss_type containing 'sigmoid_norm'), "
            f"got beta={args.beta}, loss_type={args.loss_type}: build the arguments with trl_args"
        )


def trl_args(cfg, out_dir: Path, device: torch.device, reference: Reference | None = None):
    """TRL ``DPOConfig`` from our config: CPU-sane defaults (no gradient checkpointing, no hub, no reports).
    Under SimPO, TRL's beta is SimPO's (``ref.simpo_beta``), not ``algo.beta``."""
    from trl import DPOConfig

    algo = cfg.algo
    loss_types = [value_of(algo.loss_type)]
    loss_weights = None
    if reference is not None and hasattr(reference, "dpo_loss_types"):  # ref=none: SimPO, SFT replay
        loss_types, loss_weights = reference.dpo_loss_types(loss_types[0])
    simpo = simpo_params(reference)
    return DPOConfig(
        **common_args(cfg, out_dir, device),
        beta=simpo.beta if simpo is not None else algo.beta,
        loss_type=loss_types,
        loss_weights=loss_weights,
        max_length=algo.max_length,
        truncation_mode="keep_start",
        precompute_ref_log_probs=True,  # TRL loads no reference of its own; the regime provides it
        remove_unused_columns=True,
    )


def build_trainer(
    cfg, *, policy, tokenizer, pairs, reference: Reference, callbacks, out_dir: Path, device: torch.device
):
    cls = _dpo_trainer_cls()
    return cls(
        model=policy,
        args=trl_args(cfg, out_dir, device, reference),
        train_dataset=pairs_dataset(pairs),
        processing_class=tokenizer,
        reference=reference,
        callbacks=callbacks,
    )
