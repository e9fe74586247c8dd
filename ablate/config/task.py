"""Schema of the ``task`` group."""

from __future__ import annotations

from dataclasses import dataclass, field

from ablate.config.checks import require, require_count_or_none


# ------------------------------------------------------------------------------------------------ task
@dataclass
class TaskConfig:
    name: str = "sentiment"
    n_train: int = 64  # train prompts (DPO pairs are sampled from these)
    n_test: int = 64  # held-out prompts kept for final reports
    split_seed: int = 0
    max_new_tokens: int = 64  # with the stop rule, 4% of the SFT model's responses reach 64 tokens (10% reach 48)
    # the stop rule: a response ends after this many sentences (ablate.stop_rule); None: at EOS or the cap only
    max_sentences: int | None = 1
    temperature: float = 1.0
    samples_per_prompt: int = 4  # SFT samples per train prompt; best/worst by gold reward become a pair
    gen_batch_size: int | None = None  # rows per generate call; None: as many as fit in memory (ablate.models.batching)
    unsafe_threshold: float = 0.5

    def __post_init__(self) -> None:
        self.check_sizes()
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

    def check_sizes(self) -> None:
        require(self.n_train >= 1, f"task.n_train must be >= 1, got {self.n_train}")
        require(self.n_test >= 0, f"task.n_test must be >= 0, got {self.n_test}")


# ---------------------------------------------------------------------------------------------- dataset
@dataclass
class DatasetColumns:
    """Which columns of the data hold what (ablate.tasks.dataset). A file with the prompt column alone is a
    prompts-only task (PPO/GRPO; DPO then samples and judges its pairs as the built-in task does)."""

    prompt: str = "prompt"
    chosen: str = "chosen"
    rejected: str = "rejected"
    split: str = "split"  # a column of `train` / `test` values, when the data splits itself


@dataclass
class DatasetTaskConfig(TaskConfig):
    """A task read from the user's data: preference pairs or prompts, from a JSONL, CSV or Parquet file or a
    Hugging Face dataset id (ablate.tasks.dataset)."""

    name: str = "dataset"
    path: str = ""  # a .jsonl/.json, .csv or .parquet file, or a dataset id (its local cache when offline)
    test_path: str | None = None  # the held-out split as a file of its own; None: the data's split column, or made
    columns: DatasetColumns = field(default_factory=DatasetColumns)
    test_fraction: float = 0.1  # with no split of the data's own: the share of distinct prompts held out
    n_train: int | None = None  # None: every training row; N: the first N
    n_test: int | None = None  # None: every held-out prompt past the evaluation's
    # text the policy's perplexity is measured on: builtin (the package's held-out English), chosen (the held-out
    # split's chosen responses) or a path to a text file (one text a line)
    heldout: str = "builtin"
    max_sentences: int | None = None  # free-form responses: EOS or task.max_new_tokens ends them

    def check_sizes(self) -> None:
        require(bool(self.path), "task=dataset needs task.path=<file or dataset id> (JSONL, CSV, Parquet)")
        require(self.n_train is None or self.n_train >= 1, f"task.n_train must be >= 1 or null, got {self.n_train}")
        require(self.n_test is None or self.n_test >= 0, f"task.n_test must be >= 0 or null, got {self.n_test}")
        require(0.0 < self.test_fraction < 1.0, f"task.test_fraction must be in (0, 1), got {self.test_fraction}")


# ---------------------------------------------------------------------------------------- judge, safety
@dataclass
class JudgeConfig:
    """The gold reward: what `reward_delta`, win rate and the DPO pairs a prompts-only task samples are judged by
    (ablate.tasks.judges)."""

    name: str = "vader"


@dataclass
class RewardModelJudgeConfig(JudgeConfig):
    """Any sequence-classification reward model: a local folder or a hub id, with its own tokenizer and chat
    template; the reward is its logit (the one label's, or `label`'s)."""

    name: str = "reward_model"
    path: str = ""
    label: str | None = None  # a model with several labels: the one whose logit is the reward
    batch_size: int | None = None  # rows per forward; None: as many as fit (ablate.tasks.judges)
    max_length: int = 1024  # tokens of prompt + response the judge reads (longer ones are cut from the left)

    def __post_init__(self) -> None:
        require(bool(self.path), "judge=reward_model needs judge.path=<reward model folder or hub id>")
        require_count_or_none("judge.batch_size", self.batch_size)
        require(self.max_length >= 8, f"judge.max_length must be >= 8, got {self.max_length}")


@dataclass
class SafetyConfig:
    """The safety judge: the unsafe probability of a response; `task.unsafe_threshold` says what counts as unsafe."""

    name: str = "profanity"


@dataclass
class ClassifierSafetyConfig(SafetyConfig):
    """A sequence-classification model (local folder or hub id); the unsafe probability is the softmax of
    `label` (a name in its config's id2label)."""

    name: str = "classifier"
    path: str = ""
    label: str = "toxic"
    batch_size: int | None = None
    max_length: int = 512

    def __post_init__(self) -> None:
        require(bool(self.path), "safety=classifier needs safety.path=<classifier folder or hub id>")
        require_count_or_none("safety.batch_size", self.batch_size)
        require(self.max_length >= 8, f"safety.max_length must be >= 8, got {self.max_length}")


__all__ = [
    "TaskConfig",
    "DatasetColumns",
    "DatasetTaskConfig",
    "JudgeConfig",
    "RewardModelJudgeConfig",
    "SafetyConfig",
    "ClassifierSafetyConfig",
]
