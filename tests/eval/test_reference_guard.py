"""Guards against the wrong reference: an SFT adapter folder is the SFT model (base + adapter), and at step 0 the
full reference must give the policy's log-probs exactly (ablate.eval.reference_guard)."""

from __future__ import annotations

import json

import pytest
import torch

from ablate.config import HFModelConfig, TinyModelConfig
from ablate.eval.reference_guard import ReferenceMismatch, check_reference, first_batch
from ablate.models.loading import load_model, resolve_source
from ablate.tasks.pairs import Pair
from tests.conftest import TINY_FAST, run_cli

CPU = torch.device("cpu")
PAIRS = [Pair(f"Review film {i}.", "A delight.", "A bore.", 1.0, 0.0) for i in range(4)]


@pytest.fixture(scope="module")
def sft_adapter(tmp_path_factory, cache_root):
    """A LoRA adapter over the tiny model with non-zero weights (an SFT adapter), saved as peft saves it."""
    from peft import LoraConfig, get_peft_model

    base_path = resolve_source(TinyModelConfig(), cache_root).path
    torch.manual_seed(0)
    model = get_peft_model(
        load_model(resolve_source(TinyModelConfig(), cache_root), CPU),
        LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], init_lora_weights=False),
    )
    folder = tmp_path_factory.mktemp("adapter") / "sft"
    model.save_pretrained(folder)
    config = json.loads((folder / "adapter_config.json").read_text())
    assert config["base_model_name_or_path"] == str(base_path)
    return folder, model


def batch(tokenizer):
    return first_batch(tokenizer, pairs=PAIRS, prompts=[], rows=2, max_length=64)


def test_the_same_model_passes_exactly_with_or_without_a_fresh_adapter(tiny_source, tokenizer):
    from ablate.config import AdapterConfig
    from ablate.models.loading import add_adapter

    ids, mask = batch(tokenizer)
    assert check_reference(load_model(tiny_source, CPU), load_model(tiny_source, CPU), ids, mask) == 0.0
    policy = add_adapter(load_model(tiny_source, CPU), AdapterConfig(enabled=True))  # LoRA's B starts at zero
    assert check_reference(policy, load_model(tiny_source, CPU), ids, mask) == 0.0
    prompts_only = first_batch(
        tokenizer, pairs=None, prompts=["Hello there.", "Review a film."], rows=2, max_length=None
    )
    assert check_reference(policy, load_model(tiny_source, CPU), *prompts_only) == 0.0


def test_a_reference_from_another_checkpoint_stops_the_run(tiny_source, tokenizer, cache_root):
    other = resolve_source(TinyModelConfig(init_seed=1), cache_root)
    ids, mask = batch(tokenizer)
    with pytest.raises(ReferenceMismatch, match="the full reference is not the SFT model the policy starts from") as e:
        check_reference(load_model(tiny_source, CPU), load_model(other, CPU), ids, mask)
    assert "\n" not in str(e.value) and "another checkpoint" in str(e.value)


def test_the_pipeline_checks_its_own_frozen_copy(tmp_path, tiny_source, cache_root):
    """The run's check reads the run's frozen copy: planted from another checkpoint, the run stops."""
    from ablate.inputs import RunInputs
    from ablate.pipeline import check_reference_is_policy
    from tests.conftest import typed_config

    cfg = typed_config(tmp_path, *TINY_FAST)
    inputs = RunInputs.build(cfg)
    check_reference_is_policy(cfg, inputs, inputs.load(), PAIRS)  # the run's own copy: passes
    inputs._frozen = load_model(resolve_source(TinyModelConfig(init_seed=2), cache_root), CPU)
    with pytest.raises(ReferenceMismatch):
        check_reference_is_policy(cfg, inputs, inputs.load(), PAIRS)
    with pytest.raises(ReferenceMismatch):
        check_reference_is_policy(cfg, inputs, inputs.load(), None)  # online algorithms: the first prompts


def test_an_adapter_folder_is_base_plus_adapter(sft_adapter, tokenizer, cache_root):
    """The QLoRA trap: base alone as the reference. An adapter folder resolves to the merged SFT model, which
    scores as the adapter model does and not as the base."""
    from ablate.cli import check_config
    from ablate.compose import compose

    folder, peft_model = sft_adapter
    source = resolve_source(HFModelConfig(name_or_path=str(folder)), cache_root)
    assert source.fingerprint.startswith("adapter:") and (source.path / "config.json").is_file()
    merged = load_model(source, CPU)
    base = load_model(resolve_source(TinyModelConfig(), cache_root), CPU)
    ids, mask = batch(tokenizer)
    with torch.no_grad():
        want = peft_model.eval()(input_ids=ids, attention_mask=mask).logits
        got = merged(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(got, want, atol=1e-4)
    with pytest.raises(ReferenceMismatch):
        check_reference(merged, base, ids, mask)
    check_config(compose("model=hf", f"model.name_or_path={folder}", "logger=none"))  # preflight accepts it


@pytest.mark.slow
def test_a_run_on_an_sft_adapter_trains_against_base_plus_adapter(tmp_path, sft_adapter):
    folder, _ = sft_adapter
    done = run_cli(*TINY_FAST, "model=hf", f"model.name_or_path={folder}", "ref=shared", "model.adapter.enabled=true",
                   f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "reference check: the full reference gives the policy's log-probs exactly" in done.stdout + done.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_data_refused_once_the_tokenizer_is_known_is_one_line(tmp_path):
    """A mistake found after preflight (every prompt fills algo.max_length) ends a run with one line too."""
    rows = [{"prompt": "word " * 200, "chosen": "yes", "rejected": "no", "split": "train"}]
    rows.append({"prompt": "Review a film.", "split": "test"})
    path = tmp_path / "long.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = run_cli(*TINY_FAST, "task=dataset", f"task.path={path}", "algo.max_length=32",
                   f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("ablate")]
    assert len(lines) == 1 and "every pair's prompt alone fills algo.max_length=32 tokens" in lines[0]
    assert "Traceback" not in done.stderr
