"""GRPO's rollouts (TRL's own generate) end where the task's stop rule ends a response, as the harness's sampler's do."""

from __future__ import annotations

import pytest
import torch

from ablate.algos.grpo import build_trainer
from ablate.models.loading import load_model
from ablate.refs.full import FullRefConfig, FullReference
from ablate.stop_rule import SENTENCE_END
from ablate.tasks.reward import GoldReward
from tests.conftest import typed_config


def tiny_grpo(tmp_path, tiny_source, tokenizer, ref_ctx, *overrides):
    """The harness's GRPO trainer on the tiny model, 4 prompts a step in pairs, ``ref=full``."""
    cfg = typed_config(tmp_path, "model=tiny", "algo=grpo", "algo.batch_size=4", "algo.num_generations=2", *overrides)
    return build_trainer(
        cfg,
        policy=load_model(tiny_source, torch.device("cpu")),
        tokenizer=tokenizer,
        prompts=["Review Iron Summer.", "Continue: I watched it and"],
        reward=GoldReward(),
        reference=FullReference(FullRefConfig(), ref_ctx),
        callbacks=[],
        out_dir=tmp_path,
        device=torch.device("cpu"),
    )


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("max_sentences", [1, None])
def test_grpo_rollouts_are_cut_after_the_first_sentence(tmp_path, tiny_source, tokenizer, ref_ctx, max_sentences):
    trainer = tiny_grpo(
        tmp_path, tiny_source, tokenizer, ref_ctx,
        "task.max_new_tokens=12", f"task.max_sentences={'null' if max_sentences is None else max_sentences}",
    )  # fmt: skip
    period, word = tokenizer.convert_tokens_to_ids("."), tokenizer(" Great", add_special_tokens=False)["input_ids"][0]
    trainer.generation_config.sequence_bias = {(period,): 60.0, (word,): 60.0}  # the random model writes ". Great"
    prompt_ids = [tokenizer("Review Iron Summer.", add_special_tokens=False)["input_ids"]] * 2
    completions, _ = trainer._generate_single_turn(prompt_ids, None, {}, 2)
    texts = [tokenizer.decode(c, skip_special_tokens=True) for c in completions]
    ends = [len(SENTENCE_END.findall(t + " ")) for t in texts]  # a kept final terminator counts once
    if max_sentences is None:
        assert all(len(c) == 12 for c in completions) and max(ends) > 1
    else:
        assert (
            len(texts) == 2
            and ends == [1, 1]
            and all(t.rstrip().endswith(".") for t in texts)
            and all(len(c) < 12 for c in completions)
        )


@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("precision", ["bf16", "fp32"])
def test_bf16_rollouts_run_in_one_autocast_region(tmp_path, tiny_source, tokenizer, ref_ctx, precision):
    """In bf16 training TRL's generate runs inside one bf16 autocast region (so autocast keeps its bf16 weight copies
    for the whole call instead of making them again at every decoded token); in fp32 training, in none."""
    trainer = tiny_grpo(
        tmp_path, tiny_source, tokenizer, ref_ctx, f"model.precision={precision}", "task.max_new_tokens=4"
    )
    seen, generate = [], trainer.model.generate

    def recording(*a, **k):
        seen.append((torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")))
        return generate(*a, **k)

    trainer.model.generate = recording
    prompt_ids = [tokenizer("Review Iron Summer.", add_special_tokens=False)["input_ids"]] * 2
    trainer._generate_single_turn(prompt_ids, None, {}, 2)
    assert seen == ([(True, torch.bfloat16)] if precision == "bf16" else [(False, torch.get_autocast_dtype("cpu"))])
