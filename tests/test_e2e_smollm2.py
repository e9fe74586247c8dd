"""End to end on the real SmolLM2-135M-Instruct (converted from the wheel's GGUF): a few DPO steps."""

from __future__ import annotations

import json
import math

import pytest

from ablate.tracking.run_dir import SUMMARY_KEYS
from tests.conftest import run_cli

pytestmark = pytest.mark.slow


def test_smollm2_dpo_few_steps(tmp_path):
    run_dir = tmp_path / "run"
    res = run_cli(
        "model=smollm2",
        "algo.max_steps=2",
        "algo.batch_size=2",
        "algo.learning_rate=2e-5",
        "task.n_train=6",
        "eval.n_prompts=6",
        "eval.samples_per_prompt=1",
        "task.max_new_tokens=24",
        "task.samples_per_prompt=3",
        "eval.interval=0",
        "eval.batch_size=6",
        f"hydra.run.dir={run_dir}",
        cwd=tmp_path,
        timeout=1200,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert set(SUMMARY_KEYS) <= set(s) and s["status"] == "finished" and s["steps"] == 2
    assert s["kl_true_step0"] == 0.0
    assert s["kl_true"] > 0 and s["kl_approx"] == s["kl_true"]
    # a real pretrained model: fluent text has low perplexity (random weights give ~50,000)
    assert 2 < s["ppl"] < 200
    assert s["ref_bytes"] > 500e6  # a full fp32 copy of 134.5M parameters
    samples = [json.loads(line) for line in (run_dir / "samples.jsonl").read_text().splitlines()]
    assert sum(len(x["policy_response"].split()) for x in samples) > 20
    assert not math.isnan(s["win_rate"])


@pytest.mark.filterwarnings("ignore")
def test_reference_bytes_order_on_smollm2(cache_root):
    """On the default model: nf4 < int8 < full, and the shared regime holds no weights of its own."""
    import torch

    from ablate.config import ModelConfig
    from ablate.models.loading import load_model, load_tokenizer, resolve_source
    from ablate.refs.base import RefContext
    from ablate.refs.full import FullRefConfig, FullReference
    from ablate.refs.int8 import Int8RefConfig, Int8Reference
    from ablate.refs.nf4 import Nf4RefConfig, Nf4Reference

    cpu = torch.device("cpu")
    source = resolve_source(ModelConfig(name="smollm2"), cache_root)
    ctx = RefContext(
        model_dir=str(source.path),
        model_fingerprint=source.fingerprint,
        tokenizer=load_tokenizer(source),
        device=cpu,
        load_model=lambda **kw: load_model(source, cpu, **kw),
    )
    sizes = {}
    for name, cls, cfg in (
        ("full", FullReference, FullRefConfig()),
        ("int8", Int8Reference, Int8RefConfig()),
        ("nf4", Nf4Reference, Nf4RefConfig()),
    ):
        ref = cls(cfg, ctx)
        sizes[name] = ref.cost().bytes_held
        del ref
    assert sizes["nf4"] < sizes["int8"] < sizes["full"]
    print({k: f"{v / 2**20:.1f} MiB ({v / sizes['full']:.2f}x)" for k, v in sizes.items()})
