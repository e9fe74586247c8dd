"""Preference pairs: deterministic, cached content-addressed, regenerated when any input changes."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablate.models.loading import load_model, tokenizer_fingerprint
from ablate.tasks.pairs import PAIRS_FILE, PairSettings, load_or_generate_pairs, pair_key, select_pair
from ablate.tasks.prompts import make_prompts
from ablate.tasks.reward import GoldReward

SETTINGS = PairSettings(
    samples_per_prompt=4, max_new_tokens=16, temperature=1.0, batch_size=8, seed=0, precision="fp32"
)


def test_select_pair_best_vs_worst_and_skips_ties():
    p = select_pair("q", ["meh", "great", "awful"], [0.0, 0.9, -0.8])
    assert (p.chosen, p.rejected, p.chosen_reward, p.rejected_reward) == ("great", "awful", 0.9, -0.8)
    assert select_pair("q", ["a", "b"], [0.0, 0.0]) is None


@pytest.fixture
def pair_inputs(tiny_source, tokenizer):
    prompts = make_prompts(6, 1, 1)["train"]
    calls = []

    def make_model():
        calls.append(1)
        return load_model(tiny_source, torch.device("cpu"))

    key = pair_key(
        model_fingerprint=tiny_source.fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        settings=SETTINGS,
        prompts=prompts,
        reward_id=GoldReward.ID,
    )
    return prompts, make_model, calls, key


def test_generate_then_cache_hit_loads_no_model(tmp_path, tokenizer, pair_inputs):
    prompts, make_model, calls, key = pair_inputs
    pairs, hit, entry = load_or_generate_pairs(tmp_path, key, make_model, tokenizer, prompts, GoldReward(), SETTINGS)
    assert not hit and calls == [1] and pairs
    assert all(p.chosen_reward > p.rejected_reward for p in pairs)
    again, hit2, _ = load_or_generate_pairs(tmp_path, key, make_model, tokenizer, prompts, GoldReward(), SETTINGS)
    assert hit2 and calls == [1]  # no model was loaded, nothing regenerated
    assert again == pairs


def test_generation_is_deterministic(tmp_path, tokenizer, pair_inputs):
    prompts, make_model, calls, key = pair_inputs
    a, _, _ = load_or_generate_pairs(tmp_path / "a", key, make_model, tokenizer, prompts, GoldReward(), SETTINGS)
    b, _, _ = load_or_generate_pairs(tmp_path / "b", key, make_model, tokenizer, prompts, GoldReward(), SETTINGS)
    assert a == b and calls == [1, 1]


@pytest.mark.parametrize(
    "change", ["seed", "max_new_tokens", "temperature", "samples_per_prompt", "model", "tokenizer", "prompts", "reward"]
)
def test_any_input_change_is_a_cache_miss(tmp_path, tokenizer, tiny_source, change):
    prompts = make_prompts(6, 1, 1)["train"]
    base = dict(
        model_fingerprint=tiny_source.fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        settings=SETTINGS,
        prompts=prompts,
        reward_id=GoldReward.ID,
    )
    changed = dict(base)
    if change in ("seed", "max_new_tokens", "temperature", "samples_per_prompt"):
        value = {"seed": 1, "max_new_tokens": 17, "temperature": 0.9, "samples_per_prompt": 5}[change]
        changed["settings"] = dataclasses.replace(SETTINGS, **{change: value})
    elif change == "model":
        changed["model_fingerprint"] = "tiny:another"
    elif change == "tokenizer":
        old = tokenizer.chat_template
        tokenizer.chat_template = old.replace("assistant", "bot")
        changed["tokenizer_fingerprint"] = tokenizer_fingerprint(tokenizer)
        tokenizer.chat_template = old
    elif change == "prompts":
        changed["prompts"] = prompts[:-1]
    else:
        changed["reward_id"] = "another-reward"
    assert pair_key(**base) != pair_key(**changed)


def test_the_rows_per_generate_call_are_in_the_key_for_every_sampler(tokenizer, tiny_source):
    """In bf16 a matmul's rounding depends on its rows, so even coupled pairs can differ with the batch size
    (SmolLM2: 19 of 32 responses identical at 8 vs 32 rows); the multinomial RNG stream depends on it too."""
    base = dict(
        model_fingerprint=tiny_source.fingerprint,
        tokenizer_fingerprint=tokenizer_fingerprint(tokenizer),
        prompts=make_prompts(6, 1, 1)["train"],
        reward_id=GoldReward.ID,
    )
    for sampler in ("coupled", "multinomial"):
        settings = dataclasses.replace(SETTINGS, sampler=sampler)
        other = dataclasses.replace(settings, batch_size=3)
        assert pair_key(**base, settings=settings) != pair_key(**base, settings=other)
    multi = dataclasses.replace(SETTINGS, sampler="multinomial")
    assert pair_key(**base, settings=multi) != pair_key(**base, settings=SETTINGS)


def test_a_run_keys_its_pairs_on_the_rows_that_fit(tmp_path, tokenizer, tiny_source):
    """task.gen_batch_size=None: the rows come from the memory budget (all 24 sequences fit for the tiny model),
    resolved from the model's config before any model loads."""
    from ablate.compose import compose
    from ablate.tasks.pairs import pairs_for_run

    cfg = compose("model=tiny", "task.n_train=6", "task.max_new_tokens=4")
    prompts = make_prompts(6, 1, 1)["train"]
    _, _, entry = pairs_for_run(
        cfg,
        tmp_path,
        tiny_source,
        tokenizer,
        prompts,
        GoldReward(),
        lambda: load_model(tiny_source, torch.device("cpu")),
        torch.device("cpu"),
    )
    assert entry.key["generation"]["batch_size"] == 6 * cfg.task.samples_per_prompt


def test_corrupted_pairs_file_is_rebuilt(tmp_path, tokenizer, pair_inputs):
    prompts, make_model, calls, key = pair_inputs
    pairs, _, entry = load_or_generate_pairs(tmp_path, key, make_model, tokenizer, prompts, GoldReward(), SETTINGS)
    with open(entry.path / PAIRS_FILE, "a") as f:
        f.write('{"prompt": "injected"}\n')
    again, hit, _ = load_or_generate_pairs(tmp_path, key, make_model, tokenizer, prompts, GoldReward(), SETTINGS)
    assert not hit and calls == [1, 1] and again == pairs
