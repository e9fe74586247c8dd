"""Schema of the ``task`` group."""

from __future__ import annotations

from dataclasses import dataclass

from ablate.config.checks import require, require_count_or_none


# ------------------------------------------------------------------------------------------------ task
@dataclass
class TaskConfig:
    name: str = "sentiment"
    n_train: int = 64  # train prompts (DPO pairs are sampled from these)
    n_test: int = 64  # held-out prompts kept for final reports
    split_seed: int = 0
    max_new_tokens: int = 64  # with the stop rule, 4% of the SFT model's responses reach 64 tokens (10% reach 48)
    # the stop rule: a response ends after this many sentences (ablate.tasks.stop_rule); None: at EOS or the cap only
    max_sentences: int | None = 1
    temperature: float = 1.0
    samples_per_prompt: int = 4  # SFT samples per train prompt; best/worst by gold reward become a pair
    gen_batch_size: int | None = None  # rows per generate call; None: as many as fit in memory (ablate.models.batching)
    unsafe_threshold: float = 0.5

    def __post_init__(self) -> None:
        require(self.n_train >= 1, f"task.n_train must be >= 1, got {self.n_train}")
        require(self.n_test >= 0, f"task.n_test must be >= 0, got {self.n_test}")
        require(
            1 <= self.max_new_tokens <= 4096, f"task.max_new_tokens must be in [1, 4096], got {self.max_new_tokens}"
        )
        require_count_or_none("task.max_sentences", self.max_sentences)
        require(
            self.temperature == 1.0,
            f"task.temperature must be 1.0, got {self.temperature}: evaluation's k1/k3 KL estimates and win "
            f"rate need samples from the policy itself, and its log-probs are scored untempered",
        )
        require(self.samples_per_prompt >= 2, f"task.samples_per_prompt must be >= 2, got {self.samples_per_prompt}")
        require_count_or_none("task.gen_batch_size", self.gen_batch_size)
        require(
            0.0 <= self.unsafe_threshold <= 1.0, f"task.unsafe_threshold must be in [0, 1], got {self.unsafe_threshold}"
        )
