"""Resume and determinism on model=tiny, in subprocesses as a user runs them: a job killed with SIGKILL
after a checkpoint resumes from it and ends with exactly the metrics of an uninterrupted run with the same
seed; the same seed twice gives the same metrics, another seed does not."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, popen_cli

BASE = [
    "model=tiny",
    "algo.max_steps=6",
    "eval.interval=3",
    "task.n_train=8",
    "eval.n_prompts=4",
    "eval.samples_per_prompt=1",
    "task.max_new_tokens=12",
    "algo.batch_size=2",
    "logger=none",
    "threads=1",
    "checkpoint.interval=2",
]
# Each killed after its first checkpoint, in its second epoch: GRPO's 5 prompts, one a step, where that epoch starts
# (step 5) or inside it (step 6; TRL's sampler replayed the first epoch's prompt order after either resume); DPO's 7
# pairs, two a step, at step 5. Each with a reference or controller whose state must survive the restart.
GRPO_5 = ["algo=grpo", "algo.num_generations=2", "task.n_train=5", "algo.max_steps=8"]
ALGOS = {
    "dpo": ["algo=dpo", "ref=ema", "ref.tau=1", "algo.learning_rate=1e-3", "checkpoint.interval=5"],
    "grpo": [*GRPO_5, "ref=full", "algo.kl_control=adaptive", "algo.learning_rate=1e-3", "checkpoint.interval=6"],
    "grpo_at_epoch_2": [*GRPO_5, "checkpoint.interval=5"],
    "ppo": ["algo=ppo", "ref=snapshot", "ref.tau=3", "algo.minibatch_size=2", "algo.learning_rate=1e-3"],
}
# wall-clock figures differ between any two runs; everything else must not
TIMING_WORDS = (
    "time",
    "wall_s",
    "train_s",
    "eval_s",
    "eval_phases_s",
    "ms_per_step",
    "setup_s",
    "runtime",
    "per_second",
    "peak_rss",
)
OTHER = (
    "pairs_cache_hit",
    "resumed_from_step",
    "disk_bytes_written",  # the killed job wrote a checkpoint more
    "sft_baseline_cache_hit",  # the first job of the test samples the SFT baseline, the later ones read it
    "provenance",
    # the HF Trainer's end-of-training average loss covers the steps of the last attempt only
    "train/train_loss",
)


def _kept(key: str) -> bool:
    return key not in OTHER and not any(w in key for w in TIMING_WORDS)


def _args(out: Path, *overrides: str) -> list[str]:
    keys = {o.split("=", 1)[0] for o in overrides}
    return [*(o for o in BASE if o.split("=", 1)[0] not in keys), *overrides, f"hydra.run.dir={out}"]


def _cmd(out: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "ablate", *_args(out, *overrides)]


def _run(out: Path, *overrides: str):
    res = subprocess.run(_cmd(out, *overrides), cwd=REPO, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    return res


def _metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in r.items() if _kept(k)} for r in rows]


def _summary(out: Path) -> dict:
    s = json.loads((out / "summary.json").read_text())
    return {k: v for k, v in s.items() if _kept(k) and k != "pairs_cache"}


def _same(a, b) -> bool:
    """Equal, NaN equal to NaN (json gives float('nan') for NaN)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.slow
@pytest.mark.parametrize("algo", sorted(ALGOS))
def test_sigkill_then_rerun_resumes_and_matches_an_uninterrupted_run(tmp_path, algo):
    overrides = ALGOS[algo]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    # the uninterrupted run goes side by side with the one to be killed (one torch thread each): the results may not
    # depend on what else the machine is doing (and the test takes one job's time less)
    whole_proc = popen_cli(*_args(whole, *overrides), log=tmp_path / "whole.log")
    proc = subprocess.Popen(_cmd(killed, *overrides), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not list(killed.glob("checkpoints/checkpoint-*/ablate_state.json")):
        assert proc.poll() is None, "the job ended before its first checkpoint"
        assert time.time() < deadline
        time.sleep(0.02)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (killed / "summary.json").exists()
    for line in (killed / "metrics.jsonl").read_text().splitlines():
        json.loads(line)  # every line written so far is whole

    res = _run(killed, *overrides)
    assert "resuming from" in res.stdout + res.stderr
    assert whole_proc.wait(timeout=600) == 0, (tmp_path / "whole.log").read_text()[-3000:]
    summary = json.loads((killed / "summary.json").read_text())
    assert summary["status"] == "finished" and summary["resumed_from_step"] >= 2
    interval = next(int(o.split("=")[1]) for o in _args(killed, *overrides) if o.startswith("checkpoint.interval="))
    assert summary["resumed_from_step"] == interval  # killed after its first checkpoint
    assert _same(_summary(killed), _summary(whole))
    whole_m, killed_m = _metrics(whole), _metrics(killed)
    assert len(whole_m) == len(killed_m)
    for w, k in zip(whole_m, killed_m):
        assert _same(w, k), {key: (w.get(key), k.get(key)) for key in set(w) | set(k) if w.get(key) != k.get(key)}
    assert not (killed / "checkpoints").exists()  # removed once finished (checkpoint.keep=false)


@pytest.mark.slow
def test_same_seed_same_metrics_other_seed_differs(tmp_path):
    """The three jobs run side by side (one torch thread each): the same seed must give the same metrics whatever
    else the machine is doing."""
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    jobs = [(a, ()), (b, ()), (c, ("seed=1",))]
    procs = [popen_cli(*_args(out, "checkpoint.interval=0", *extra), log=Path(f"{out}.log")) for out, extra in jobs]
    for (out, _), proc in zip(jobs, procs):
        assert proc.wait(timeout=600) == 0, Path(f"{out}.log").read_text()[-3000:]
    assert _same(_metrics(a), _metrics(b))
    assert _same(_summary(a), _summary(b))
    assert not _same(_metrics(a), _metrics(c))
