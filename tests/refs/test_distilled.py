"""The distilled reference: a layer-subset student of the SFT model, distilled by forward KL and cached."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from ablate.errors import ConfigError
from ablate.refs import REGISTRY
from ablate.refs.base import RefContext, module_bytes
from ablate.refs.distilled import (
    DistilledRefConfig,
    DistilledReference,
    cache_key,
    heldout_kl,
    init_student,
    n_params,
    resolve_num_layers,
    select_layers,
    split_heldout,
    training_sequences,
)
from ablate.refs.full import FullRefConfig, FullReference
from ablate.tasks.pairs import Pair
from tests.conftest import compose, token_batch

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
MAIN = dict(num_layers=2, steps=25, batch_size=4)  # the student most tests share
CPU = torch.device("cpu")


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """The tiny model's matmuls gain nothing from threads, and on a busy shared machine they lose a lot."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def source4(cache_root):
    """A 4-layer tiny SFT model, so a student can take a real subset of layers."""
    from ablate.config import TinyModelConfig
    from ablate.models.loading import resolve_source

    return resolve_source(TinyModelConfig(name="tiny", num_layers=4), cache_root)


@pytest.fixture(scope="module")
def tok(source4):
    from ablate.models.loading import load_tokenizer

    return load_tokenizer(source4)


@pytest.fixture(scope="module")
def loads():
    """How many times the teacher (the SFT model) was loaded through the context."""
    return []


@pytest.fixture(scope="module")
def ctx(source4, tok, loads, tmp_path_factory):
    """A RefContext over the 4-layer model, with a fresh cache (so the first build is always a miss)."""
    from ablate.models.loading import load_model

    def counting_load(**kw):
        loads.append(kw)
        return load_model(source4, CPU, **kw)

    return RefContext(
        model_dir=str(source4.path),
        model_fingerprint=source4.fingerprint,
        tokenizer=tok,
        device=CPU,
        load_model=counting_load,
        train_data=PAIRS,
        cache_root=str(tmp_path_factory.mktemp("distilled_cache")),
    )


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


def test_auto_depth_follows_param_fraction(teacher):
    total = n_params(teacher)
    layer = sum(p.numel() for p in teacher.model.layers[0].parameters())
    fixed = total - 4 * layer
    for want in (1, 2, 3, 4):
        assert resolve_num_layers(DistilledRefConfig(param_fraction=(fixed + want * layer) / total), teacher) == want
    assert resolve_num_layers(DistilledRefConfig(param_fraction=0.01), teacher) == 1  # at least one layer
    assert resolve_num_layers(DistilledRefConfig(num_layers=3, param_fraction=0.01), teacher) == 3
    with pytest.raises(ConfigError, match=r"^ref\.num_layers must be <= the SFT model's 4 layers"):
        resolve_num_layers(DistilledRefConfig(num_layers=5), teacher)


def test_response_mask_covers_exactly_the_assistant_reply(tok):
    (ids, n_prompt), (ids_r, n_prompt_r) = training_sequences(tok, PAIRS[:1], max_length=256)
    assert tok.decode(ids[n_prompt:]).startswith(PAIRS[0].chosen)
    assert tok.decode(ids_r[n_prompt_r:]).startswith(PAIRS[0].rejected)
    assert tok.decode(ids[:n_prompt]).endswith("assistant\n")
    (short, n), _ = training_sequences(tok, PAIRS[:1], max_length=n_prompt + 2)  # truncated from the end
    assert len(short) == n_prompt + 2 and n == n_prompt
    assert training_sequences(tok, PAIRS[:1], max_length=n_prompt) == []  # no response token left: dropped


def test_heldout_split_is_seeded_and_disjoint():
    train, held = split_heldout(12, 0.25, seed=0)
    assert len(held) == 3 and sorted(train + held) == list(range(12))
    assert (train, held) == split_heldout(12, 0.25, seed=0)
    assert held != split_heldout(12, 0.25, seed=1)[1]


# ---------------------------------------------------------------------------------------- the regime
def test_distilled_student_is_smaller_and_costed(built):
    ref, n_loads = built
    extra = ref.cost().extra
    assert n_loads == 1 and not ref.cache_hit
    assert extra["teacher_layers"] == 4 and extra["student_layers"] == 2
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
    seqs = training_sequences(tok, ctx.train_data, 256)
    _, held = split_heldout(len(seqs), 0.2, seed=0)
    again = heldout_kl(teacher, ref.model, [seqs[i] for i in held], 4, tok.pad_token_id, CPU)
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


def test_key_changes_with_steps_precision_and_data(built, ctx, tok):
    ref, _ = built
    seqs = training_sequences(tok, PAIRS, 256)
    key = cache_key(DistilledRefConfig(**MAIN), ctx, seqs)
    assert key == ref.entry.key
    assert cache_key(DistilledRefConfig(**{**MAIN, "steps": 26}), ctx, seqs) != key
    assert cache_key(DistilledRefConfig(**MAIN), dataclasses.replace(ctx, precision="bf16"), seqs) != key
    assert cache_key(DistilledRefConfig(**MAIN), ctx, training_sequences(tok, PAIRS[:-1], 256)) != key
    assert cache_key(DistilledRefConfig(**MAIN), dataclasses.replace(ctx, model_fingerprint="other"), seqs) != key


def test_other_steps_is_another_entry_and_a_corrupted_entry_is_rebuilt(built, ctx, loads):
    ref, _ = built
    cfg = DistilledRefConfig(num_layers=2, steps=3, batch_size=4)
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
