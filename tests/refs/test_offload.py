"""ref=offload: ``ref=full``'s model with its weights on the CPU or on disk (Accelerate's hooks) gives ``full``'s
numbers bit for bit, through TRL's fused head as through the full logits, with the tied embedding offloaded once; the
disk folder lives under the cache root (or ``ref.offload_dir``) and goes with the reference; whole tiny runs of DPO,
GRPO and PPO equal ``ref=full``'s metric for metric."""

from __future__ import annotations

import gc
import json
import os
import re
from pathlib import Path

import pytest
import torch

from ablate.errors import ConfigError
from ablate.models.logprobs import has_logprob_head, token_logprobs
from ablate.models.precision import autocast
from ablate.refs import REGISTRY, regime_names
from ablate.refs.base import AUDIT, TRAINING, module_bytes
from ablate.refs.offload import OffloadRefConfig, OffloadReference
from tests.conftest import TINY_FAST, popen_cli, typed_config
from tests.refs.documented import undocumented_extras
from tests.refs.test_quantized import left_padded

MODES = ("cpu", "disk")


@pytest.fixture(params=MODES)
def offloaded(request, ref_ctx):
    return OffloadReference(OffloadRefConfig(offload=request.param), ref_ctx)


def test_registered_next_to_full_in_the_lists_not_audited():
    assert REGISTRY["offload"] is OffloadReference
    assert regime_names("all")[:2] == regime_names("sweep")[:2] == ["full", "offload"]
    assert "offload" not in regime_names("audit")  # exact by construction: nothing to measure


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_logprobs_and_distribution_are_full_s_bit_for_bit(offloaded, full, batch, tokenizer, precision):
    for rows in (batch, left_padded(batch, tokenizer.pad_token_id)):
        for purpose in (TRAINING, AUDIT):
            got, want = offloaded.logprobs(rows, purpose, precision), full.logprobs(rows, purpose, precision)
            assert torch.equal(got, want), purpose
        with autocast(torch.device("cpu"), precision):
            assert torch.equal(offloaded.distribution(rows), full.distribution(rows))
    assert offloaded.cost().forward_calls == 2  # training calls only (one a layout)


def test_the_weights_stay_off_the_model_and_the_fused_head_reads_them(offloaded, batch):
    """The hooks leave every weight on the meta device between calls, the LM head's too: TRL's fused head, which
    multiplies by ``lm_head.weight`` outside the head's forward, is given it for the call (not the full logits)."""
    model = offloaded.model
    offloaded.logprobs(batch)
    assert has_logprob_head(model)  # the log-probs went through the fused head
    assert {p.device.type for p in model.parameters()} == {"meta"}
    with pytest.raises(RuntimeError):  # the head's weight left on the meta device: the trap the regime steps around
        token_logprobs(model, batch)
    assert torch.equal(offloaded.logprobs(batch), offloaded.logprobs(batch, AUDIT))  # and the model is still sound


def test_the_tied_embedding_is_offloaded_once(ref_ctx, full):
    assert full.model.lm_head.weight is full.model.model.embed_tokens.weight  # the tiny model ties them
    on_cpu = OffloadReference(OffloadRefConfig(offload="cpu"), ref_ctx)
    on_disk = OffloadReference(OffloadRefConfig(offload="disk"), ref_ctx)
    full_bytes = module_bytes(full.model)  # the tied matrix once
    assert on_cpu.cost().bytes_held == on_cpu.cost().extra["offload_bytes"] == full_bytes
    head, embed = (on_disk.folder / f"{name}.weight.dat" for name in ("lm_head", "model.embed_tokens"))
    assert os.path.samefile(head, embed)  # one file, two names
    index = json.loads((on_disk.folder / "index.json").read_text())
    assert index["lm_head.weight"] == index["model.embed_tokens.weight"]
    assert full_bytes < on_disk.cost().cache_bytes < full_bytes + 64 * 1024  # the weights once, and the index


def test_cost_counts_what_each_mode_holds(ref_ctx, full, batch):
    full_bytes = full.cost().bytes_held
    for mode in MODES:
        ref = OffloadReference(OffloadRefConfig(offload=mode), ref_ctx)
        ref.logprobs(batch)
        c = ref.cost()
        assert c.extra["device_bytes"] == 0  # the tiny model keeps no persistent buffer on its modules
        if mode == "cpu":  # a CPU box: the CPU copy is the process's own RAM
            assert (c.bytes_held, c.cache_bytes, c.extra["offload_bytes"]) == (full_bytes, 0, full_bytes)
            assert c.extra["bytes_vs_bf16"] == full.cost().extra["bytes_vs_bf16"]
        else:  # on disk: nothing held between calls
            assert c.bytes_held == 0 and c.cache_bytes == c.extra["offload_bytes"] > full_bytes
        assert c.forward_calls == 1 and c.setup_s > 0
        assert not undocumented_extras(ref)


def test_the_disk_folder_is_under_the_cache_root_and_goes_with_the_reference(ref_ctx, cache_root, tmp_path, batch):
    for offload_dir, parent in ((None, cache_root / "offload"), (str(tmp_path / "fast"), tmp_path / "fast")):
        ref = OffloadReference(OffloadRefConfig(offload="disk", offload_dir=offload_dir), ref_ctx)
        folder = ref.folder
        assert folder.parent == parent and (folder / "index.json").is_file()
        ref.logprobs(batch)
        del ref
        gc.collect()
        assert not folder.exists()
    assert OffloadReference(OffloadRefConfig(), ref_ctx).folder is None  # cpu: no folder


def test_a_second_reference_never_reads_another_s_folder(ref_ctx):
    a, b = (OffloadReference(OffloadRefConfig(offload="disk"), ref_ctx) for _ in range(2))
    assert a.folder != b.folder and a.folder.parent == b.folder.parent


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["ref.offload=gpu"], "ref.offload must be one of cpu, disk, got 'gpu'"),
        (["ref.offload_dir=/tmp/x"], "ref.offload_dir is for ref.offload=disk, got ref.offload=cpu"),
    ],
)
def test_a_bad_option_is_one_line_at_compose_time(tmp_path, overrides, message):
    with pytest.raises(ConfigError) as e:
        typed_config(tmp_path, "model=tiny", "ref=offload", *overrides)
    assert str(e.value) == message
    cfg = typed_config(tmp_path, "model=tiny", "ref=offload", "ref.offload=disk", "ref.offload_dir=/tmp/x")
    assert (cfg.ref.offload, cfg.ref.offload_dir) == ("disk", "/tmp/x")


# ------------------------------------------------------------------------------------------------ whole runs
ALGOS = {
    "dpo": ["algo=dpo"],
    "grpo": ["algo=grpo", "algo.num_generations=2"],
    "ppo": ["algo=ppo", "algo.minibatch_size=2"],
}
RUNS = {"full": ["ref=full"], **{mode: ["ref=offload", f"ref.offload={mode}"] for mode in MODES}}
#: what may differ between the runs: the regime's name, its cost, timing and memory, and cache bookkeeping
NOT_METRICS = ("regime", "provenance", "pairs_cache_hit", "sft_baseline_cache_hit")
TIMING = ("time", "runtime", "per_second", "_ms", "bytes", "peak_rss")


def _metric(key: str) -> bool:
    return (
        key not in NOT_METRICS
        and not key.startswith(("ref_", "cost/"))
        and not key.endswith("_s")
        and not any(w in key for w in TIMING)
    )


def _metrics(out: Path) -> tuple[dict, list[dict]]:
    summary = json.loads((out / "summary.json").read_text())
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {k: v for k, v in summary.items() if _metric(k)}, [{k: v for k, v in r.items() if _metric(k)} for r in rows]


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_a_tiny_run_equals_full_s_metric_for_metric(tmp_path, algo):
    """full, offload=cpu and offload=disk side by side, one torch thread each (the same in every run)."""
    procs = {
        name: popen_cli(
            *TINY_FAST,
            *ALGOS[algo],
            *ref,
            "threads=1",
            f"hydra.run.dir={tmp_path / name}",
            log=tmp_path / f"{name}.log",
        )
        for name, ref in RUNS.items()
    }
    for name, proc in procs.items():
        assert proc.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    (summary, rows), runs = _metrics(tmp_path / "full"), {m: _metrics(tmp_path / m) for m in MODES}
    assert summary["status"] == "finished" and {"kl_true", "reward_delta", "win_rate"} <= set(summary)
    for mode, (got, got_rows) in runs.items():
        differ = {k: (summary.get(k), got.get(k)) for k in set(summary) | set(got) if summary.get(k) != got.get(k)}
        assert json.dumps(got, sort_keys=True) == json.dumps(summary, sort_keys=True), (mode, differ)
        assert json.dumps(got_rows, sort_keys=True) == json.dumps(rows, sort_keys=True), mode
    disk = json.loads((tmp_path / "disk" / "summary.json").read_text())
    assert disk["ref_bytes"] == 0 < disk["ref_cache_bytes"] == disk["ref_offload_bytes"]
    log = (tmp_path / "disk" / "ablate.log").read_text()
    folder = Path(re.search(r"the reference's weights go to (\S+)", log).group(1))
    assert not folder.is_relative_to(tmp_path) and not folder.exists()  # outside the results, removed at the end
