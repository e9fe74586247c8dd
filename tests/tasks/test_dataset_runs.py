"""``python -m ablate task=dataset``, end to end on the tiny model: the built-in task exported and read back trains
metric for metric as the built-in task does; a reward model the test builds judges DPO, GRPO and PPO runs."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from ablate.tracking.schema import summary_metrics
from tests.conftest import REPO, TINY_FAST, run_cli
from tests.judges import score

# what differs between two runs of the same job by nature: time, memory, bytes written, what was reused
MEASURED_NOT_COMPUTED = {
    "wall_s",
    "train_s",
    "eval_s",
    "eval_phases_s",
    "peak_rss_bytes",
    "peak_rss_train_bytes",
    "disk_bytes_written",
}


def summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


def export(out, *overrides: str) -> list[str]:
    """``python -m ablate.export``; returns the command it prints, as arguments after ``python -m ablate``."""
    done = subprocess.run(
        [sys.executable, "-m", "ablate.export", "--out", str(out), *overrides],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr
    command = done.stdout.strip().split()
    assert command[:3] == ["python", "-m", "ablate"], done.stdout
    return command[3:]


def same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b))


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dpo", "grpo"])
def test_the_exported_task_trains_metric_for_metric_as_the_builtin_one(tmp_path, algo):
    overrides = [*TINY_FAST, f"algo={algo}", *(["algo.batch_size=4"] if algo == "grpo" else [])]
    command = export(tmp_path / "pairs.jsonl", *overrides)
    assert "task=dataset" in command and "task.max_sentences=1" in command
    builtin = run_cli(*overrides, f"hydra.run.dir={tmp_path / 'builtin'}")
    assert builtin.returncode == 0, builtin.stderr[-3000:]
    data = run_cli(*command, f"hydra.run.dir={tmp_path / 'data'}")
    assert data.returncode == 0, data.stderr[-3000:]
    a, b = summary(tmp_path / "builtin"), summary(tmp_path / "data")
    keys = [m.key for m in summary_metrics() if m.key not in MEASURED_NOT_COMPUTED and not m.key.startswith("ref_")]
    keys += [k + "_step0" for k in keys if k + "_step0" in a]
    assert len(keys) > 30
    differ = {k: (a.get(k), b.get(k)) for k in keys if not same(a.get(k), b.get(k))}
    assert differ == {}
    assert a["status"] == b["status"] == "finished" and a.get("n_pairs") == b.get("n_pairs")
    assert b["data"]["sizes"]["eval_prompts"] == 4 and b["provenance"]["task"]["task"] == "dataset"
    samples_a = (tmp_path / "builtin" / "samples.jsonl").read_text()
    assert samples_a == (tmp_path / "data" / "samples.jsonl").read_text()


@pytest.fixture(scope="module")
def reward_model(tmp_path_factory):
    from tests.judges import save_classifier

    return save_classifier(tmp_path_factory.mktemp("rm") / "reward_model")


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory):
    rows = [
        {"prompt": f"Review film {i}.", "chosen": f"Film {i} is a delight.", "rejected": f"Film {i} is dull.",
         "split": "train"}
        for i in range(8)
    ] + [{"prompt": f"Review play {i}.", "split": "test"} for i in range(4)]  # fmt: skip
    path = tmp_path_factory.mktemp("data") / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["dpo", "grpo", "ppo"])
def test_a_reward_model_judges_each_algorithm(tmp_path, reward_model, pairs_file, algo, cache_root):
    args = [*TINY_FAST, "algo.batch_size=4", f"algo={algo}", "task=dataset", f"task.path={pairs_file}"]
    args += ["judge=reward_model", f"judge.path={reward_model}", f"hydra.run.dir={tmp_path / 'run'}"]
    done = run_cli(*args)
    assert done.returncode == 0, done.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["status"] == "finished"
    task = s["provenance"]["task"]
    assert task["judge_id"].startswith("reward-model:") and task["safety_id"].startswith("alt-profanity-check")
    assert {k: v for k, v in task.items() if not k.endswith("_id")} == {
        "task": "dataset",
        "judge": "reward_model",
        "safety": "profanity",
        "data": str(pairs_file),
        "judge_path": str(reward_model),
    }
    # TINY_FAST's task.n_train=6 takes the first 6 training rows
    assert s["data"]["sizes"] == {"train_prompts": 6, "eval_prompts": 4, "test_prompts": 0, "train_pairs": 6}
    assert s["data"]["dropped"] == {}
    # the gold reward is the reward model's logit: not VADER's [-1, 1] compound of these short responses
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    expected = score(reward_model, [r["prompt"] for r in rows], [r["policy_response"] for r in rows])
    assert [r["policy_reward"] for r in rows] == pytest.approx(expected, abs=1e-4)
    assert list((cache_root / "judge_scores").glob("*.jsonl"))  # scores kept by content


@pytest.mark.slow
def test_the_learned_reward_trains_on_the_datas_own_pairs(tmp_path, pairs_file):
    """GRPO's proxy reward (algo.reward=learned) is trained on the data's pairs, not on sampled ones."""
    args = [*TINY_FAST, "algo=grpo", "algo.batch_size=4", "algo.reward=learned", "algo.reward_model.epochs=1"]
    done = run_cli(*args, "task=dataset", f"task.path={pairs_file}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["pairs_cache"] == str(pairs_file) and s["n_pairs"] == 6  # TINY_FAST: task.n_train=6
    assert s["reward_model_n_pairs"] == 6


@pytest.mark.slow
def test_dpo_on_prompts_alone_samples_and_judges_its_pairs(tmp_path):
    """A prompts-only file: DPO's pairs are the SFT model's samples, best and worst by the judge, as the built-in
    task makes them (cached by content); ref=cached precomputes on them."""
    rows = [{"prompt": f"Write one sentence about film {i}.", "split": "train"} for i in range(6)]
    rows += [{"prompt": f"Write one sentence about play {i}.", "split": "test"} for i in range(4)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    done = run_cli(*TINY_FAST, "ref=cached", "task=dataset", f"task.path={path}", f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    s = summary(tmp_path / "run")
    assert s["status"] == "finished" and s["n_pairs"] >= 1 and "/pairs/" in s["pairs_cache"]
    assert s["data"]["sizes"]["train_pairs"] == 0 and s["data"]["sizes"]["train_prompts"] == 6


@pytest.mark.slow
def test_a_safety_classifier_scores_the_responses(tmp_path, pairs_file):
    """safety=classifier: each response's unsafe probability is the classifier's softmax of safety.label."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from tests.judges import save_classifier

    folder = save_classifier(tmp_path / "safety", labels=["ok", "toxic"], seed=3)
    args = [*TINY_FAST, "task=dataset", f"task.path={pairs_file}", "safety=classifier", f"safety.path={folder}"]
    done = run_cli(*args, f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "run" / "samples.jsonl").read_text().splitlines()]
    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32).eval()
    want = []
    with torch.no_grad():
        for r in rows:  # the response alone, one at a time (no padding)
            ids = tok(r["policy_response"], return_tensors="pt", add_special_tokens=False)
            want.append(float(torch.softmax(model(**ids).logits[0], -1)[1]))
    assert [r["policy_unsafe_prob"] for r in rows] == pytest.approx(want, abs=1e-5)
    assert summary(tmp_path / "run")["provenance"]["task"]["safety_id"].startswith("classifier:")
