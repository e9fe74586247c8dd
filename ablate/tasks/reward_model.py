"""A learned (proxy) reward: the policy's architecture with a scalar head, trained by TRL's
``RewardTrainer`` (Bradley-Terry) on the gold-labelled SFT preference pairs.

It is the realistic case for online RL: the policy optimises a proxy it can exploit, while the
evaluation keeps judging by the gold reward. Trained once and cached content-addressed (model
fingerprint, tokenizer, pairs, settings, precision).
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ablate.cache import CacheEntry

log = logging.getLogger(__name__)

_FORMAT = 1


def pairs_fingerprint(pairs) -> str:
    blob = json.dumps([[p.prompt, p.chosen, p.rejected] for p in pairs], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


class LearnedReward:
    """Scores (prompt, response) with a trained reward model; call it with texts and their prompts."""

    ID_PREFIX = "learned-rm"

    def __init__(self, model_dir: Path, tokenizer, device: torch.device, precision: str, meta: dict):
        from transformers import AutoModelForSequenceClassification

        self.model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).to(device)
        self.model.eval().requires_grad_(False)
        self.tok, self.device, self.precision, self.meta = tokenizer, device, precision, meta

    @torch.no_grad()
    def __call__(self, texts: list[str], prompts: list[str], batch_size: int = 8) -> list[float]:
        from ablate.models.precision import autocast
        from ablate.tasks.prompts import as_chat

        chats = [
            self.tok.apply_chat_template(as_chat(p) + [{"role": "assistant", "content": t}], tokenize=False)
            for p, t in zip(prompts, texts)
        ]
        out: list[float] = []
        for i in range(0, len(chats), batch_size):
            enc = self.tok(chats[i : i + batch_size], return_tensors="pt", padding=True, add_special_tokens=False).to(
                self.device
            )
            with autocast(self.device, self.precision):
                out += self.model(**enc).logits[:, 0].float().tolist()
        return out


def train_or_load(
    *, source, tokenizer, pairs, cfg, cache_root: Path, device: torch.device, precision: str, tokenizer_fingerprint: str
) -> LearnedReward:
    """The cached reward model for these inputs, training it with TRL's RewardTrainer on a miss."""
    key = {
        "model": source.fingerprint,
        "tokenizer": tokenizer_fingerprint,
        "pairs": pairs_fingerprint(pairs),
        "settings": asdict(cfg),
        "precision": precision,
        "format": _FORMAT,
    }
    entry = CacheEntry(cache_root, "reward_models", key)
    if not entry.valid():
        from trl import RewardConfig, RewardTrainer

        from ablate.tasks.pair_tokens import reward_dataset

        log.info("training the proxy reward model on %d gold-labelled pairs (cached afterwards)", len(pairs))
        t0 = time.perf_counter()
        with entry.build() as tmp:
            args = RewardConfig(
                output_dir=str(tmp / "trainer"),
                per_device_train_batch_size=cfg.batch_size,
                num_train_epochs=cfg.epochs,
                learning_rate=cfg.learning_rate,
                max_length=cfg.max_length,
                use_cpu=device.type == "cpu",
                bf16=precision == "bf16",
                gradient_checkpointing=False,
                report_to="none",
                save_strategy="no",
                logging_steps=1,
                seed=cfg.seed,
                data_seed=cfg.seed,
                disable_tqdm=False,
            )
            trainer = RewardTrainer(
                model=str(source.path),
                args=args,
                train_dataset=reward_dataset(tokenizer, pairs),
                processing_class=tokenizer,
            )
            trainer.train()
            trainer.model.config.pad_token_id = tokenizer.pad_token_id
            trainer.save_model(str(tmp / "model"))
            tokenizer.save_pretrained(str(tmp / "model"))
            logs = [h for h in trainer.state.log_history if "loss" in h]
            stats = {
                "train_s": time.perf_counter() - t0,
                "final_loss": logs[-1]["loss"] if logs else None,
                "final_accuracy": logs[-1].get("accuracy") if logs else None,
                "n_pairs": len(pairs),
            }
            import shutil

            shutil.rmtree(tmp / "trainer", ignore_errors=True)
            (tmp / "stats.json").write_text(json.dumps(stats))
    meta = json.loads((entry.path / "stats.json").read_text())
    return LearnedReward(entry.path / "model", tokenizer, device, precision, meta)
