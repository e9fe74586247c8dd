"""``python -m ablate.audit`` end to end on the tiny model, in-process: the side-by-side table is printed and written
(audit.md, strict audit.json, audit.csv); the exact reference in fp32 has margin error 0 and gradient cosine 1,
int8 does not; a user's JSONL is audited in place of the task's pairs; overrides go to the regimes they fit."""

from __future__ import annotations

import json

import pytest

from ablate.audit.cli import main, regime_overrides, split_regimes
from tests.eval.test_fidelity import LN2_FP32

FAST = ["model=tiny", "model.precision=fp32", "task.max_new_tokens=8", "--n-prompts", "2"]


def _load(folder) -> dict:
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    data = json.loads((folder / "audit.json").read_text(), parse_constant=refuse)
    return {r["regime"]: r for r in data["regimes"]} | {"_settings": data["settings"]}


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore")
def test_full_and_int8_on_the_task_pairs(tmp_path, capsys):
    out = tmp_path / "audit"
    rc = main(["ref=full,int8", *FAST, "task.n_train=6", "algo.batch_size=2", "--n-pairs", "2", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert [ln.split("|")[1].strip() for ln in printed.splitlines() if ln.startswith("| ")][1:] == ["full", "int8"]
    rows = _load(out)
    full, int8 = rows["full"], rows["int8"]
    assert full["margin_err_mean"] == full["margin_err_sd"] == full["margin_err_max"] == 0.0
    assert full["dpo_grad_cos"] == 1.0 and full["dpo_loss"] == LN2_FP32  # TRL's loss, in fp32
    assert full["kl_penalty_err_mean"] == 0.0 and full["online_grad_cos"] == 1.0 and full["stand_in_kl"] == 0.0
    assert int8["margin_err_max"] > 0 and int8["stand_in_kl"] > 0 and int8["bytes_held"] < full["bytes_held"]
    assert all(r["logprobs_s"] > 0 and r["setup_s"] >= 0 for r in (full, int8))
    assert "task sentiment pairs" in rows["_settings"]["data"] and rows["_settings"]["online_algo"] == "grpo"
    assert rows["_settings"]["dpo"].startswith("beta 0.1") and "batch 8, 4 generations" in rows["_settings"]["online"]
    assert (out / "audit.md").read_text() == printed
    assert (out / "audit.csv").read_text().splitlines()[1].startswith("full,0.0,0.0,0.0,")


@pytest.mark.filterwarnings("ignore")
def test_a_users_jsonl(tmp_path, capsys):
    data = tmp_path / "mine.jsonl"
    pairs = [
        {"prompt": "Review the film Lucky Harbor.", "chosen": "A wonderful film.", "rejected": "An awful mess."},
        {"prompt": "Describe Iron Summer's plot.", "chosen": "Gripping and warm.", "rejected": "It drags."},
        {"prompt": "Write about Glass Kingdom.", "chosen": "Lovely acting.", "rejected": "Boring."},
    ]
    data.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    rc = main(["ref=cached", *FAST, "--data", str(data), "--out", str(tmp_path / "o")])
    assert rc == 0, capsys.readouterr().err[-2000:]
    rows = _load(tmp_path / "o")
    assert rows["_settings"]["data"].startswith(f"{data}: 3 pairs in 1 DPO batches")
    cached = rows["cached"]  # built from these pairs, as DPO batches them: exact for DPO
    assert cached["margin_err_max"] == 0.0 and cached["dpo_grad_cos"] == 1.0 and cached["dpo_loss"] == LN2_FP32
    assert cached["kl_penalty_err_mean"] is None and "not in the cache" in cached["nan_reasons"]["kl_penalty_err_mean"]
    assert cached["stand_in_kl"] is None and "no next-token distribution" in cached["nan_reasons"]["stand_in_kl"]


def test_regimes_and_their_settings_are_split_from_the_overrides():
    regimes, rest = split_regimes(["model=tiny", "ref=full,topk", "ref.k=32", "ref=topk,int8"])
    assert regimes == ["full", "topk", "int8"] and rest == ["model=tiny", "ref.k=32"]
    assert regime_overrides("full", regimes, rest) == ["model=tiny"]
    assert regime_overrides("topk", regimes, rest) == rest
    assert regime_overrides("full", regimes, ["ref.bogus=1"]) == ["ref.bogus=1"]  # composing names it


def test_a_bad_override_is_one_line_naming_the_regime(tmp_path, capsys):
    rc = main(["ref=full,int8", "model=tiny", "algo.betta=0.2", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "algo.betta" in err[0] and err[0].endswith("(ref=full)"), err
