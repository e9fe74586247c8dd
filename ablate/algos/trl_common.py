"""The TrainingArguments every TRL trainer here shares: CPU-sane, no hub, no reports, seeds and precision
from our config; checkpoints (for resuming) in ``<run>/checkpoints`` when ``cfg.checkpoint`` says (the run's
checkpoint callback decides at each step), pruned by ``ablate.tracking.checkpoint`` rather than by the Trainer (so a kill mid-save leaves an older one)."""

from __future__ import annotations

from pathlib import Path

import torch

from ablate.refs.base import data_seed
from ablate.tracking.checkpoint import SavePolicy, checkpoints_dir


def common_args(cfg, out_dir: Path, device: torch.device) -> dict:
    from ablate.distributed import world_size

    algo = cfg.algo
    return dict(
        output_dir=str(checkpoints_dir(out_dir)),
        # algo.batch_size is the global batch: each of several processes trains on its share (config refuses uneven)
        per_device_train_batch_size=algo.batch_size // world_size(),
        gradient_accumulation_steps=algo.grad_accum,
        learning_rate=cfg.model.adapter.learning_rate(algo.learning_rate),
        max_steps=algo.max_steps,
        warmup_steps=algo.warmup_steps,
        lr_scheduler_type=algo.lr_scheduler,
        weight_decay=algo.weight_decay,
        max_grad_norm=algo.max_grad_norm,
        logging_steps=1,
        # the run's CheckpointCallback decides at each step end whether to save (SavePolicy)
        save_strategy="steps" if SavePolicy.from_config(cfg.checkpoint).ever else "no",
        save_steps=cfg.checkpoint.interval or algo.max_steps,
        save_total_limit=None,
        save_only_model=False,
        report_to="none",
        use_cpu=device.type == "cpu",
        bf16=cfg.model.precision == "bf16",
        gradient_checkpointing=False,  # TRL defaults it on; slower for models this size
        seed=cfg.seed,
        data_seed=data_seed(cfg),  # the run's seed but for a placebo (ablate.refs.placebo)
        disable_dropout=True,
        dataloader_num_workers=0,
        ddp_find_unused_parameters=False,  # on several processes: every trainable parameter takes part in the loss
    )
