"""The one tokenisation of preference pairs equals what stock TRL's DPO trainer builds, token for token."""

from __future__ import annotations

import pytest
import torch

from ablate.tasks.pair_tokens import (
    COLUMNS,
    PairCollator,
    pad_id,
    pair_batches,
    tokenize_pairs,
    tokenized_dataset,
)
from ablate.tasks.pairs import Pair

PAIRS = [
    Pair("Review the film Lucky Harbor.", "A wonderful, joyful film.", "A dull and awful mess.", 0.8, -0.7),
    Pair("Continue: I watched it and", "loved every minute of it and then some more.", "hated it.", 0.6, -0.5),
    Pair("Write a review of Iron Summer, " + "a long film " * 12, "Great.", "Boring.", 0.7, -0.3),  # dropped
    Pair("Continue: the plot was", "clever and beautiful.", "a disaster from start to finish.", 0.7, -0.6),
]
MAX_LENGTH = 48  # truncates the longer responses, and drops the pair whose prompt alone fills it


@pytest.fixture(scope="module")
def stock(tmp_path_factory, tiny_source, tokenizer):
    """Stock TRL's DPO trainer on the conversational pairs: its tokenised dataset and its collator."""
    from trl import DPOConfig, DPOTrainer

    from ablate.models.loading import load_model
    from ablate.tasks.pairs import pairs_dataset

    cpu = torch.device("cpu")
    args = DPOConfig(
        output_dir=str(tmp_path_factory.mktemp("stock")),
        max_length=MAX_LENGTH,
        truncation_mode="keep_start",
        report_to="none",
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
    )
    return DPOTrainer(
        model=load_model(tiny_source, cpu),
        ref_model=load_model(tiny_source, cpu),
        args=args,
        train_dataset=pairs_dataset(PAIRS),
        processing_class=tokenizer,
    )


@pytest.mark.filterwarnings("ignore")
def test_tokens_equal_stock_trls(stock, tokenizer):
    ours = tokenized_dataset(tokenizer, PAIRS, MAX_LENGTH)
    theirs = stock.train_dataset
    assert len(ours) == len(theirs) == 3  # the long prompt's pair is dropped by both
    for a, b in zip(ours, theirs):
        assert {c: a[c] for c in COLUMNS} == {c: b[c] for c in COLUMNS}
    rows = tokenize_pairs(tokenizer, PAIRS, MAX_LENGTH)
    assert tokenizer.decode(rows[0].chosen_ids).startswith(PAIRS[0].chosen)  # the response, then end-of-turn
    assert rows[0].chosen_ids[-2] == tokenizer.eos_token_id or rows[0].chosen_ids[-1] == tokenizer.eos_token_id


@pytest.mark.filterwarnings("ignore")
def test_batches_equal_stock_trls_collator(stock, tokenizer):
    """DPO's batches and ``ref=cached``'s precompute batches are stock TRL's collator output, tensor for tensor
    (one of them truncated to ``max_length``)."""
    rows = [stock.train_dataset[i] for i in range(len(stock.train_dataset))]
    ours = PairCollator(pad_id(tokenizer), MAX_LENGTH)
    truncated = False
    for size in (1, 2, 3):
        batches = pair_batches(tokenizer, PAIRS, size, MAX_LENGTH)
        for k, start in enumerate(range(0, len(rows), size)):
            theirs = stock.data_collator(rows[start : start + size])
            mine = ours(rows[start : start + size])
            for key in ("input_ids", "attention_mask", "completion_mask"):
                assert torch.equal(mine[key], theirs[key]), key
                assert torch.equal(getattr(batches[k], key), theirs[key]), key
            truncated |= theirs["input_ids"].shape[1] == MAX_LENGTH
    assert truncated


@pytest.mark.filterwarnings("ignore")
def test_reward_model_tokens_equal_stock_trls(tmp_path, tiny_source, tokenizer):
    """The learned reward model trains on the same tokens: TRL's reward trainer, given the conversational pairs,
    builds exactly the whole conversations :func:`reward_dataset` hands it."""
    from trl import RewardConfig, RewardTrainer

    from ablate.tasks.pair_tokens import reward_dataset
    from ablate.tasks.pairs import pairs_dataset

    args = RewardConfig(output_dir=str(tmp_path), max_length=None, report_to="none", use_cpu=True, bf16=False)
    stock = RewardTrainer(
        model=str(tiny_source.path), args=args, train_dataset=pairs_dataset(PAIRS), processing_class=tokenizer
    )
    ours = reward_dataset(tokenizer, PAIRS)
    assert len(ours) == len(stock.train_dataset) == len(PAIRS)
    for a, b in zip(ours, stock.train_dataset):
        assert (a["chosen_ids"], a["rejected_ids"]) == (b["chosen_ids"], b["rejected_ids"])
