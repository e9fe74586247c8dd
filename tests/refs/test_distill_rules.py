"""``ref=distilled``'s rules: the student's depth by non-embedding parameters, the stopping rule on the held-out
KL, and ``ref.path`` (an existing smaller model with the SFT model's tokenizer, refused in one line otherwise)."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil

import pytest
import torch

from ablate.errors import ConfigError
from ablate.refs.distill_data import pair_sequences, split_by_prompt
from ablate.refs.distill_source import path_source
from ablate.refs.distill_student import init_student, resolve_num_layers, select_layers, size_stats
from ablate.refs.distill_train import distil_loop
from ablate.refs.distilled import DistilledRefConfig, DistilledReference, cache_key
from tests.conftest import typed_config
from tests.refs.conftest import counting_context
from tests.refs.documented import undocumented_extras
from tests.refs.test_distilled import PAIRS

CPU = torch.device("cpu")
pytestmark = pytest.mark.usefixtures("one_thread")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


@pytest.fixture(scope="module")
def teacher(source4):
    from ablate.models.loading import load_model

    return load_model(source4, CPU).eval()


@pytest.fixture
def loads():
    return []


@pytest.fixture
def ctx(source4, tok, loads, tmp_path):
    """A RefContext over the 4-layer teacher with a fresh cache; ``loads`` counts the teacher's loads."""
    return counting_context(source4, tok, loads, PAIRS, tmp_path / "cache")


# ------------------------------------------------------------------------------------------ the depth
def test_depth_is_the_fewest_blocks_holding_the_non_embedding_fraction(teacher):
    """The tiny model's embedding is 98% of its parameters: counting all of them, every fraction gave 1 block."""
    for fraction, want in [(0.01, 1), (0.25, 1), (0.26, 2), (0.5, 2), (0.75, 3), (1.0, 4)]:
        n = resolve_num_layers(DistilledRefConfig(param_fraction=fraction), teacher)
        assert n == want, fraction
        got = size_stats(teacher, init_student(teacher, n))["student_nonembedding_fraction"]
        assert fraction <= got + 1e-9 and (got < fraction + 0.25 or n == 1), (fraction, got)
    assert resolve_num_layers(DistilledRefConfig(num_layers=3, param_fraction=0.01), teacher) == 3
    with pytest.raises(ConfigError, match=r"^ref\.num_layers must be <= the SFT model's 4 layers"):
        resolve_num_layers(DistilledRefConfig(num_layers=5), teacher)


def test_a_quarter_of_smollm2_is_8_of_its_30_blocks_about_every_fourth():
    """SmolLM2-135M's shape, built on the meta device (no weights): a quarter of its non-embedding parameters."""
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = dict(hidden_size=576, intermediate_size=1536, num_attention_heads=9, num_key_value_heads=3)
    config = LlamaConfig(vocab_size=49152, num_hidden_layers=30, tie_word_embeddings=True, **shape)
    with torch.device("meta"):
        smollm2 = LlamaForCausalLM(config)
        student = LlamaForCausalLM(
            LlamaConfig(vocab_size=49152, num_hidden_layers=8, tie_word_embeddings=True, **shape)
        )
    assert resolve_num_layers(DistilledRefConfig(), smollm2) == 8
    assert select_layers(30, 8) == [0, 4, 8, 12, 17, 21, 25, 29]
    stats = size_stats(smollm2, student)
    assert stats["teacher_params"] == 134_515_008 and stats["teacher_nonembedding_params"] == 106_203_456
    assert stats["student_nonembedding_fraction"] == pytest.approx(8 / 30, abs=1e-4)


# ----------------------------------------------------------------------------------- the stopping rule
@pytest.fixture(scope="module")
def split(tok):
    seqs = pair_sequences(tok, PAIRS, 256)
    train, held = split_by_prompt([p for p, _, _ in seqs], 0.2, seed=0)
    return [seqs[i][1:] for i in train], [seqs[i][1:] for i in held]


def _loop(teacher, split, tok, **cfg):
    train, held = split
    c = DistilledRefConfig(**{"num_layers": 1, "batch_size": 4, "eval_every": 2, "steps": 4, **cfg})
    return distil_loop(
        teacher, init_student(teacher, 1), train, held, c, device=CPU, precision="fp32", pad_id=tok.pad_token_id
    )


def test_stopping_rule_runs_to_the_cap_or_stops_at_the_first_check_meeting_the_target(teacher, split, tok):
    capped = _loop(teacher, split, tok, target_kl=1e-12)
    assert capped["distill_steps"] == 4 and capped["distill_target_reached"] is False
    assert [s for s, _ in capped["distill_kl_trace"]] == [0, 2, 4]
    assert capped["distill_kl_heldout"] == capped["distill_kl_trace"][-1][1] > 0
    at_2 = capped["distill_kl_trace"][1][1]
    assert at_2 < capped["distill_kl_heldout_before"]
    stopped = _loop(teacher, split, tok, target_kl=at_2)  # met at the check after step 2: stops there
    assert stopped["distill_steps"] == 2 and stopped["distill_target_reached"] is True
    assert stopped["distill_kl_heldout"] == at_2 and [s for s, _ in stopped["distill_kl_trace"]] == [0, 2]
    met = _loop(teacher, split, tok, target_kl=10.0)  # met before training: no step at all
    assert met["distill_steps"] == 0 and met["distill_target_reached"] is True
    assert met["distill_kl_heldout"] == met["distill_kl_heldout_before"] and math.isnan(met["distill_kl_train_last"])


def test_a_target_met_before_training_samples_nothing_and_is_reported(ctx, loads):
    ref = DistilledReference(DistilledRefConfig(num_layers=1, target_kl=10.0), ctx)
    extra = ref.cost().extra
    assert extra["distill_steps"] == 0 and extra["distill_target_reached"] is True
    assert "n_fresh_sequences" not in extra and extra["n_train_sequences"] == 2 * (len(PAIRS) - 1)
    assert extra["distill_s"] > 0 and ref.entry.valid() and len(loads) == 1


# ------------------------------------------------------------------------------------------- ref.path
def test_ref_path_with_steps_0_is_that_model_as_it_is(ctx, loads, tiny_source):
    from ablate.models.loading import load_model

    ref = DistilledReference(DistilledRefConfig(path=str(tiny_source.path), steps=0), ctx)
    own = load_model(tiny_source, CPU).state_dict()
    assert ref.model.state_dict().keys() == own.keys()
    assert all(torch.equal(v, own[k]) for k, v in ref.model.state_dict().items())
    extra = ref.cost().extra
    assert extra["student_source"] == str(tiny_source.path) and extra["student_layers"] == 2
    assert extra["teacher_layers"] == 4 and extra["distill_steps"] == 0
    assert extra["distill_kl_heldout"] == extra["distill_kl_heldout_before"] > 0  # measured against the teacher
    assert ref.entry is None and ref.cost().cache_bytes == 0 and len(loads) == 1


def test_ref_path_distilled_further_is_cached_under_its_fingerprint(ctx, tiny_source, tok):
    cfg = DistilledRefConfig(path=str(tiny_source.path), steps=3, batch_size=4, target_kl=None, fresh_per_prompt=1)
    ref = DistilledReference(cfg, ctx)
    fingerprint = ref.entry.key["student_source"]
    assert ref.entry.valid() and fingerprint == path_source(str(tiny_source.path), ctx.cache_root).fingerprint
    assert fingerprint.startswith("local:")  # the folder's bytes, whatever its name
    assert ref.cost().extra["distill_steps"] == 3
    assert ref.cost().extra["distill_kl_heldout"] < ref.cost().extra["distill_kl_heldout_before"]
    assert "n_fresh_sequences" in ref.cost().extra and not undocumented_extras(ref)
    seqs = pair_sequences(tok, PAIRS, 256)
    assert cache_key(cfg, ctx, seqs, dataclasses.replace(tiny_source, fingerprint="other")) != ref.entry.key


def _copy_tokenizer_folder(src, dst):
    """A model folder holding only config.json and the tokenizer (no weights: a refusal must read no more)."""
    dst.mkdir()
    for name in ("config.json", *TOKENIZER_FILES):
        if (src / name).is_file():
            shutil.copy(src / name, dst / name)
    return dst


@pytest.mark.parametrize(
    "change, message",
    [
        ("added_token", r"its tokenizer is not the SFT model's \(49153 tokens, the SFT model's 49152\)"),
        ("eos", r"its tokenizer is not the SFT model's \(eos_token is '<\|endoftext\|>' there, '<\|im_end\|>'"),
        ("vocab_rows", r"its vocabulary has 49280 rows, the SFT model's 49152"),
    ],
)
def test_ref_path_with_another_tokenizer_is_refused_in_one_line_before_any_load(
    ctx, loads, tiny_source, tmp_path, change, message
):
    from transformers import AutoTokenizer

    folder = _copy_tokenizer_folder(tiny_source.path, tmp_path / "other")
    if change == "vocab_rows":
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "vocab_size": 49280}))
    else:
        other = AutoTokenizer.from_pretrained(folder)
        if change == "added_token":
            other.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
        else:
            other.eos_token = "<|endoftext|>"
        other.save_pretrained(folder)
    with pytest.raises(ConfigError, match=rf"^ref\.path={folder}: {message}") as e:
        DistilledReference(DistilledRefConfig(path=str(folder), steps=0), ctx)
    assert "\n" not in str(e.value) and loads == []  # one line; the teacher never loaded


def test_ref_path_settings_are_checked_before_anything_loads(tmp_path):
    from ablate.validation import validate

    for path, message in [
        (tmp_path / "nope", "no such folder"),
        (tmp_path, "has no config.json"),
    ]:
        cfg = typed_config(tmp_path, "model=tiny", "ref=distilled", f"ref.path={path}")
        with pytest.raises(ConfigError, match=rf"^ref\.path={path}:? {message}"):
            validate(cfg)
    with pytest.raises(ConfigError, match=r"^ref\.num_layers sets the depth .* with ref\.path"):
        DistilledRefConfig(path="x", num_layers=2)
    with pytest.raises(ConfigError, match=r"^ref\.steps must be >= 1 \(0 only with ref\.path"):
        DistilledRefConfig(steps=0)
    assert DistilledRefConfig(path="x", steps=0).steps == 0


def test_fresh_samples_end_by_the_task_stop_rule(teacher, tok):
    """The student learns the SFT distribution the run samples: fresh responses end where the task's stop rule
    ends them (the same keyed samples as without the rule, cut by it), and the rule is in the cache key."""
    from types import SimpleNamespace

    from ablate.refs.distill_data import fresh_sequences
    from ablate.stop_rule import cut_completion

    kw = dict(n_per_prompt=8, max_new_tokens=48, max_length=256, seed=0, precision="fp32")
    prompts = [p.prompt for p in PAIRS[:4]]
    free = fresh_sequences(teacher, tok, prompts, **kw)
    ruled = fresh_sequences(teacher, tok, prompts, max_sentences=1, **kw)
    cut = [(ids[:n] + cut_completion(tok, ids[n:], {tok.eos_token_id}, 1), n) for ids, n in free]
    assert ruled == [(ids, n) for ids, n in cut if len(ids) > n]
    assert sum(len(ids) for ids, _ in ruled) < sum(len(ids) for ids, _ in free)  # the rule cut some

    ctx = dict(model_fingerprint="m", tokenizer=tok, device=CPU, precision="fp32")
    one, none = (cache_key(DistilledRefConfig(), SimpleNamespace(**ctx, max_sentences=m), []) for m in (1, None))
    assert one != none
