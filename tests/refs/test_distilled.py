"""The distilled reference: a layer-subset student of the SFT model, distilled by forward KL and cached.
(Its depth rule, stopping rule and ``ref.path``: ``test_distill_rules.py``.)"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablate.errors import ConfigError
from ablate.refs import REGISTRY
from ablate.refs.base import module_bytes
from ablate.refs.distill_data import pair_sequences, split_by_prompt
from ablate.refs.distill_student import init_student, n_params, select_layers
from ablate.refs.distill_train import heldout_kl
from ablate.refs.distilled import DistilledRefConfig, DistilledReference, cache_key
from ablate.refs.full import FullRefConfig, FullReference
from ablate.tasks.pairs import Pair
from tests.conftest import compose, token_batch
from tests.refs.conftest import counting_context

PAIRS = [
    Pair("Review the film Lucky Harbor.", "A wonderful, joyful film.", "A dull and awful mess.", 0.8, -0.7),
    Pair("Continue: I watched it and", "loved every minute of it.", "hated the ending.", 0.6, -0.5),
    Pair("Write a review of Iron Summer.", "Great acting and a lovely score.", "Boring.", 0.7, -0.3),
    Pair("Continue: the plot was", "clever and beautiful.", "a disaster.", 0.7, -0.6),
    Pair("Review the film Grey Tide.", "Moving and honest.", "Tedious and far too long.", 0.6, -0.4),
    Pair("Continue: the actors", "gave warm, funny performances.", "seemed bored throughout.", 0.7, -0.5),
]
PROMPTS = ["Review the film:", "Continue: I watched it and"]
RESPONSES = ["It was a wonderful, moving story.", "regretted every minute"]
# the student most tests share: all 25 steps (no target), on the pairs and 2 fresh 8-token samples per prompt
MAIN = dict(num_layers=2, steps=25, batch_size=4, target_kl=None, fresh_per_prompt=2, fresh_max_new_tokens=8)
CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def loads():
    """How many times the teacher (the SFT model) was loaded through the context."""
    return []


@pytest.fixture(scope="module")
def ctx(source4, tok, loads, tmp_path_factory):
    """A RefContext over the 4-layer model, with a fresh cache (so the first build is always a miss)."""
    return counting_context(source4, tok, loads, PAIRS, tmp_path_factory.mktemp("distilled_cache"))


@pytest.fixture(scope="module")
def built(ctx, loads):
    """The shared student, built (distilled) once: (reference, teacher loads it took)."""
    before = len(loads)
    ref = DistilledReference(DistilledRefConfig(**MAIN), ctx)
    return ref, len(loads) - before


@pytest.fixture
def teacher(source4):
    from ablate.models.loading import load_model

    return load_model(source4, CPU).eval()


def _state(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


# ------------------------------------------------------------------------------------------ registration
def test_registered_and_yaml_matches_schema_defaults():
    from omegaconf import OmegaConf

    assert REGISTRY["distilled"] is DistilledReference
    assert OmegaConf.to_object(compose("ref=distilled").ref) == DistilledRefConfig()


@pytest.mark.parametrize(
    "field, value",
    [
        ("param_fraction", 0.0),
        ("param_fraction", 1.5),
        ("steps", 0),
        ("target_kl", 0.0),
        ("eval_every", 0),
        ("fresh_per_prompt", -1),
        ("fresh_max_new_tokens", 0),
        ("num_layers", 0),
        ("batch_size", 0),
        ("learning_rate", 0.0),
        ("max_length", 4),
        ("seed", -1),
        ("heldout_fraction", 0.0),
        ("heldout_fraction", 1.0),
    ],
)
def test_config_validation_names_the_field(field, value):
    with pytest.raises(ConfigError, match=rf"^ref\.{field} must"):
        DistilledRefConfig(**{field: value})


def test_empty_train_data_is_a_config_error(ctx, loads):
    before = len(loads)
    for empty in ([], None):
        with pytest.raises(ConfigError, match="train_data"):
            DistilledReference(DistilledRefConfig(**MAIN), dataclasses.replace(ctx, train_data=empty))
    assert len(loads) == before


# --------------------------------------------------------------------------------------- student shape
def test_select_layers_evenly_spaced_first_and_last():
    assert select_layers(4, 1) == [0]
    assert select_layers(4, 2) == [0, 3]
    assert select_layers(4, 3) == [0, 2, 3]
    assert select_layers(4, 4) == [0, 1, 2, 3]
    assert select_layers(30, 4) == [0, 10, 19, 29]
    with pytest.raises(ValueError):
        select_layers(4, 5)


def test_student_init_copies_the_teachers_weights(teacher):
    student = init_student(teacher, 2)
    assert len(student.model.layers) == 2 and student.config.num_hidden_layers == 2
    assert n_params(student) < n_params(teacher)
    assert torch.equal(student.model.embed_tokens.weight, teacher.model.embed_tokens.weight)
    assert student.model.embed_tokens.weight.data_ptr() != teacher.model.embed_tokens.weight.data_ptr()
    assert student.lm_head.weight.data_ptr() == student.model.embed_tokens.weight.data_ptr()  # still tied
    assert torch.equal(student.model.norm.weight, teacher.model.norm.weight)
    for s_layer, t_idx in zip(student.model.layers, [0, 3]):
        t_state = teacher.model.layers[t_idx].state_dict()
        for k, v in s_layer.state_dict().items():
            assert torch.equal(v, t_state[k]), (t_idx, k)


def test_response_mask_covers_exactly_the_assistant_reply(tok):
    (p, ids, n_prompt), (p_r, ids_r, n_prompt_r) = pair_sequences(tok, PAIRS[:1], max_length=256)
    assert p == p_r == PAIRS[0].prompt
    assert tok.decode(ids[n_prompt:]).startswith(PAIRS[0].chosen)
    assert tok.decode(ids_r[n_prompt_r:]).startswith(PAIRS[0].rejected)
    assert tok.decode(ids[:n_prompt]).endswith("assistant\n")
    (_, short, n), _ = pair_sequences(tok, PAIRS[:1], max_length=n_prompt + 2)  # truncated from the end
    assert len(short) == n_prompt + 2 and n == n_prompt
    assert pair_sequences(tok, PAIRS[:1], max_length=n_prompt) == []  # no response token left: dropped


def test_heldout_split_holds_out_whole_prompts_seeded():
    prompts = [f"p{i // 2}" for i in range(24)]  # 12 prompts, 2 sequences each (a pair's chosen and rejected)
    train, held = split_by_prompt(prompts, 0.25, seed=0)
    assert len(held) == 6 and sorted(train + held) == list(range(24))
    assert not {prompts[i] for i in train} & {prompts[i] for i in held}  # no prompt on both sides
    assert (train, held) == split_by_prompt(prompts, 0.25, seed=0)
    assert held != split_by_prompt(prompts, 0.25, seed=1)[1]
    assert len(split_by_prompt(prompts[:4], 0.9, seed=0)[0]) == 2  # never every prompt
    with pytest.raises(ConfigError, match="at least 2 distinct prompts"):
        split_by_prompt(["a", "a"], 0.5, seed=0)


# ---------------------------------------------------------------------------------------- the regime
def test_distilled_student_is_smaller_and_costed(built):
    ref, n_loads = built
    extra = ref.cost().extra
    assert n_loads == 1 and not ref.cache_hit
    assert extra["teacher_layers"] == 4 and extra["student_layers"] == 2
    assert extra["student_layer_indices"] == [0, 3] and extra["student_source"] == "teacher layers"
    n_train_prompts = len(PAIRS) - 1  # one of the six prompts is held out
    assert extra["n_fresh_sequences"] == 2 * n_train_prompts and extra["fresh_sample_s"] > 0
    assert extra["n_train_sequences"] == 2 * n_train_prompts + extra["n_fresh_sequences"]
    assert extra["n_heldout_sequences"] == 2
    assert extra["distill_steps"] == 25 and "distill_target_reached" not in extra  # no target: every step
    assert [s for s, _ in extra["distill_kl_trace"]] == [0, 25]
    assert len(ref.model.model.layers) == 2
    assert extra["student_params"] == n_params(ref.model) < extra["teacher_params"]
    c = ref.cost()
    assert c.bytes_held == module_bytes(ref.model) > 0
    assert c.cache_bytes == ref.entry.nbytes() >= c.bytes_held  # safetensors weights + tokenizer + meta
    assert c.setup_s > 0


def test_distillation_lowers_the_heldout_kl(built, teacher, ctx, tok):
    ref, _ = built
    extra = ref.cost().extra
    before, after = extra["distill_kl_heldout_before"], extra["distill_kl_heldout"]
    print(f"held-out KL(teacher || student): before {before:.4g}, after {after:.4g}")
    assert 0 < after < before / 2
    # the reported number is the final student's: recompute it on the same held-out split
    seqs = pair_sequences(tok, ctx.train_data, 256)
    _, held = split_by_prompt([p for p, _, _ in seqs], 0.2, seed=0)
    again = heldout_kl(teacher, ref.model, [seqs[i][1:] for i in held], 4, tok.pad_token_id, CPU)
    assert again == pytest.approx(after, rel=1e-4)


def test_frozen_eval_mode_and_differs_from_the_full_reference(built, ctx, tok):
    ref, _ = built
    assert not ref.model.training
    assert all(not p.requires_grad for p in ref.model.parameters())
    assert all(not m.training for m in ref.model.modules())
    batch = token_batch(tok, PROMPTS, RESPONSES)
    lp = ref.logprobs(batch)
    mask = batch.target_mask
    assert (lp[~mask] == 0).all() and (lp[mask] < 0).all()
    full = FullReference(FullRefConfig(), ctx).logprobs(batch)
    gap = (lp - full)[mask].abs()
    print(f"|distilled - full| log-prob per response token: mean {gap.mean():.4g}, max {gap.max():.4g}")
    assert gap.max() > 1e-4
    dist = ref.distribution(batch).log_softmax(-1)
    assert torch.allclose(dist.gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)[mask], lp[mask], atol=1e-4)


def test_second_construction_hits_the_cache(built, ctx, loads):
    ref, _ = built
    before = len(loads)
    again = DistilledReference(DistilledRefConfig(**MAIN), ctx)
    assert len(loads) == before  # the teacher was not loaded
    assert again.cache_hit and again.entry.path == ref.entry.path
    first, second = ref.model.state_dict(), again.model.state_dict()
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    stats = {k: v for k, v in ref.cost().extra.items() if k != "cache_hit"}
    assert {k: v for k, v in again.cost().extra.items() if k != "cache_hit"} == stats
    assert again.cost().cache_bytes == ref.cost().cache_bytes


@pytest.mark.slow
def test_key_changes_with_every_setting_precision_and_data(built, ctx, tok):
    ref, _ = built
    seqs = pair_sequences(tok, PAIRS, 256)
    key = cache_key(DistilledRefConfig(**MAIN), ctx, seqs)
    assert key == ref.entry.key
    for field, value in [
        ("steps", 26),
        ("target_kl", 0.4),
        ("eval_every", 5),
        ("fresh_per_prompt", 3),
        ("fresh_max_new_tokens", 9),
        ("train_embeddings", True),
        ("learning_rate", 1e-3),
        ("heldout_fraction", 0.5),
    ]:
        assert cache_key(DistilledRefConfig(**{**MAIN, field: value}), ctx, seqs) != key, field
    assert cache_key(DistilledRefConfig(**MAIN), dataclasses.replace(ctx, precision="bf16"), seqs) != key
    assert cache_key(DistilledRefConfig(**MAIN), ctx, pair_sequences(tok, PAIRS[:-1], 256)) != key
    assert cache_key(DistilledRefConfig(**MAIN), dataclasses.replace(ctx, model_fingerprint="other"), seqs) != key


@pytest.mark.slow
def test_other_steps_is_another_entry_and_a_corrupted_entry_is_rebuilt(built, ctx, loads):
    ref, _ = built
    cfg = DistilledRefConfig(num_layers=2, steps=3, batch_size=4, target_kl=None, fresh_per_prompt=1)
    torch.manual_seed(1234)  # a global stream unlike the distillation's own seeded one
    rng = torch.get_rng_state()
    before = len(loads)
    other = DistilledReference(cfg, ctx)
    assert len(loads) == before + 1 and not other.cache_hit
    assert other.entry.path != ref.entry.path and ref.entry.valid()
    assert torch.equal(torch.get_rng_state(), rng)  # distillation leaves the global RNG stream alone
    weights = _state(other.model)
    payload = other.entry.path / "model.safetensors"
    payload.write_bytes(payload.read_bytes()[:-64] + b"\0" * 64)
    rebuilt = DistilledReference(cfg, ctx)
    assert len(loads) == before + 2 and not rebuilt.cache_hit  # detected, removed, distilled again
    assert rebuilt.entry.valid()
    assert all(torch.equal(v, weights[k]) for k, v in rebuilt.model.state_dict().items())  # deterministic
