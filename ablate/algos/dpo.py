"""DPO through TRL's ``DPOTrainer``, with reference log-probs from a regime instead of a model.

Before TRL computes the loss, the regime's summed reference log-probs for the chosen and rejected
responses go into the batch, exactly where TRL's own precomputation would put them; TRL loads no
reference model of its own, and its precompute pass is the regime's preparation: the regime decides
what, if anything, is precomputed. How that is done with TRL is in :mod:`ablate.algos.trl_fence`.

Under ``ref=none ref.loss=simpo`` the same slot carries SimPO's margin, and TRL's ``sigmoid_norm`` loss
runs with SimPO's beta (see :mod:`ablate.algos.simpo`): the loss is SimPO's, not DPO's.
"""

from __future__ import annotations

from pathlib import Path

import torch

from ablate.algos import registry, trl_fence
from ablate.algos.simpo import SimPOParams, margin_reference
from ablate.algos.trl_common import common_args
from ablate.refs.base import Reference, TokenBatch
from ablate.refs.none import NoReference
from ablate.tasks.pairs import pairs_dataset


def _dpo_trainer_cls():
    class RegimeDPOTrainer(trl_fence.dpo_base()):
        def __init__(self, *args, reference: Reference, **kwargs):
            self.reference = reference
            self.simpo = simpo_params(reference)
            super().__init__(*args, **kwargs)
            if self.simpo is not None:
                check_simpo_args(self.args, self.simpo)

        def prepare_reference(self, dataset) -> None:
            """Regimes that precompute (``cached``) get the training sequences exactly as the collator will build
            them, in their own batch size; the others need nothing."""
            if not self.reference.wants_training_data:
                return
            from torch.utils.data import DataLoader

            loader = DataLoader(
                dataset, batch_size=self.reference.cfg.batch_size, collate_fn=self.data_collator, shuffle=False
            )
            self.reference.prepare(
                TokenBatch(b["input_ids"], b["attention_mask"], b["completion_mask"]) for b in loader
            )

        def reference_logps(self, inputs) -> tuple[torch.Tensor, torch.Tensor]:
            """The regime's summed reference log-probs of the chosen and rejected responses (plus SimPO's
            margin under ``ref.loss=simpo``)."""
            batch = TokenBatch(inputs["input_ids"], inputs["attention_mask"], inputs["completion_mask"])
            ref_chosen, ref_rejected = self.reference.sequence_logprobs(batch).chunk(2, dim=0)
            if self.simpo is not None:
                margin_chosen, margin_rejected = margin_reference(batch.completion_mask, self.simpo)
                ref_chosen = ref_chosen + margin_chosen.to(ref_chosen)
                ref_rejected = ref_rejected + margin_rejected.to(ref_rejected)
            return ref_chosen, ref_rejected

        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            out = super().compute_loss(
                model, inputs, return_outputs=return_outputs, num_items_in_batch=num_items_in_batch
            )
            extra = self.reference.extra_loss(model)
            if extra is None:
                return out
            self.log_metric("ref_extra_loss", float(extra.detach()))
            return (out[0] + extra, out[1]) if return_outputs else out + extra

        # ------------------------------------------------------------------ what resume and KL control read
        @property
        def kl_coef(self) -> float:
            """DPO's beta (fixed)."""
            return float(self.beta)

        def resume_state(self) -> dict:
            """What a checkpoint records to resume exactly: beta and TRL's token counter."""
            return {"kl_coef": self.kl_coef, "trl_train_tokens": self.train_tokens}

        def restore(self, saved: dict) -> None:
            """Continue from :meth:`resume_state`'s record (beta is fixed: only the token counter moves)."""
            if saved.get("trl_train_tokens") is not None:
                self.train_tokens = saved["trl_train_tokens"]

    return RegimeDPOTrainer


def simpo_params(reference: Reference | None) -> SimPOParams | None:
    """SimPO's beta and margin when the regime trains with SimPO (``ref=none ref.loss=simpo``), else None."""
    return reference.simpo() if isinstance(reference, NoReference) else None


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
    loss_types, loss_weights = [algo.loss_type], None
    if reference is not None:  # ref=none: SimPO, SFT replay
        loss_types, loss_weights = reference.dpo_loss_types(loss_types[0])
    simpo = simpo_params(reference)
    return DPOConfig(
        **common_args(cfg, out_dir, device),
        beta=simpo.beta if simpo is not None else algo.beta,
        loss_type=loss_types,
        loss_weights=loss_weights,
        max_length=algo.max_length,
        truncation_mode="keep_start",
        **trl_fence.DPO_ARGS,  # TRL loads no reference of its own; the regime provides it
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


def build(*, cfg, policy, tokenizer, pairs, reference, callbacks, out_dir, device, **_):
    """:func:`build_trainer` with the algorithm registry's keywords."""
    return build_trainer(
        cfg,
        policy=policy,
        tokenizer=tokenizer,
        pairs=pairs,
        reference=reference,
        callbacks=callbacks,
        out_dir=out_dir,
        device=device,
    )


registry.register("dpo", build, needs_pairs=True, prepares_reference=True)
