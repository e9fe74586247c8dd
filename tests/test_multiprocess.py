"""One job on two processes (``accelerate launch --multi_gpu --num_processes 2``: torchrun over gloo on this CPU
machine) behaves like one run: one run folder written by rank 0 alone, the evaluation sharded and gathered, the
same metrics as a single process on the same global batch, and a killed process resumed by rerunning the command.
PPO and sweeps are refused in one line before any model loads."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, TINY_FAST, free_port, run_cli

# fp32: the two runs differ only in how the global batch is split (padding, summation order): rounding
JOB = [*TINY_FAST, "model.precision=fp32", "eval.n_prompts=5", "threads=1"]
RTOL = 1e-4


def launch_cmd(*args: str) -> list[str]:
    """``accelerate launch`` on two CPU processes (``--cpu`` would run one: Accelerate's multi-CPU path is MPI)."""
    return [
        *(sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2"),
        *("--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"),
        *("--main_process_port", str(free_port()), "-m", "ablate", *args),
    ]


def launch(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(launch_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=timeout)


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_refusals_before_any_model_loads(monkeypatch):
    from ablate.cli import preflight, process_overrides
    from ablate.errors import ConfigError

    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(ConfigError, match="algo=ppo runs in one process"):
        preflight(["model=tiny", "algo=ppo"])
    with pytest.raises(ConfigError, match="global batch: it must split evenly over the 2 processes"):
        preflight(["model=tiny", "algo.batch_size=3"])
    with pytest.raises(ConfigError, match="fewer than the 2 processes"):
        preflight(["model=tiny", "eval.n_prompts=1"])
    with pytest.raises(ConfigError, match="a sweep \\(-m\\) cannot run inside a job launched on 2 processes"):
        process_overrides(["-m", "seed=0,1"])


@pytest.fixture(scope="module")
def dpo_runs(tmp_path_factory):
    """The same DPO job (ref=ema, which updates twice) on one process and on two."""
    tmp = tmp_path_factory.mktemp("mp")
    one, two = tmp / "one", tmp / "two"
    job = [*JOB, "ref=ema"]
    r1 = run_cli(*job, f"hydra.run.dir={one}")
    assert r1.returncode == 0, r1.stderr[-3000:]
    r2 = launch(*job, f"hydra.run.dir={two}")
    assert r2.returncode == 0, r2.stderr[-3000:]
    return one, two, r2


@pytest.mark.slow
def test_two_processes_write_one_run(dpo_runs):
    one, two, r2 = dpo_runs
    s = summary(two)
    assert s["status"] == "finished" and s["provenance"]["world_size"] == 2
    assert summary(one)["provenance"]["world_size"] == 1
    assert sorted(p.name for p in two.iterdir()) == sorted(p.name for p in one.iterdir())
    assert r2.stdout.count("ablate: finished:") == 1
    n_evals = len(
        {
            json.loads(line)["step"]
            for line in (two / "metrics.jsonl").read_text().splitlines()
            if "eval/win_rate" in line
        }
    )
    assert r2.stdout.count("ablate.callbacks][INFO] - eval@") == n_evals == 3  # said once, not once per process


@pytest.mark.slow
def test_two_processes_match_one(dpo_runs):
    one, two, _ = dpo_runs
    s1, s2 = summary(one), summary(two)
    rows1, rows2 = ((f / "samples.jsonl").read_text().splitlines() for f in (one, two))
    texts = lambda rows: [(json.loads(r)["prompt"], json.loads(r)["policy_response"]) for r in rows]  # noqa: E731
    assert texts(rows2) == texts(rows1)  # every prompt sampled once, in order: the same coupled responses
    keys = ["win_rate", "reward_delta", "reward_gold", "kl_true", "kl_approx", "kl_abs_err", "ppl", "length",
            "margin_err_sd", "grad_cos", "ref_updates"]  # fmt: skip
    for k in keys:
        a, b = s1[k], s2[k]
        assert (a is None and b is None) or math.isclose(a, b, rel_tol=RTOL, abs_tol=1e-7), (k, a, b)
    assert s1["ref_updates"] >= 1  # the EMA reference moved, identically on both processes


def _rank_pid(launcher_pid: int, rank: int) -> int | None:
    """The pid of the worker with ``RANK=rank`` among the launcher's descendants (from /proc)."""
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            env = (d / "environ").read_bytes().split(b"\0")
            stat = (d / "stat").read_text()
        except OSError:
            continue
        if f"RANK={rank}".encode() in env and b"LOCAL_RANK" in b"".join(env) and "python" in stat:
            ppid_chain, pid = [], int(d.name)
            while pid > 1:
                try:
                    pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
                except OSError:
                    break
                ppid_chain.append(pid)
            if launcher_pid in ppid_chain:
                return int(d.name)
    return None


@pytest.mark.slow
def test_killed_process_fails_the_job_and_rerun_resumes(tmp_path):
    out = tmp_path / "run"
    grpo = [a for a in JOB if not a.startswith("algo.")] + ["algo=grpo", "algo.batch_size=4", "algo.num_generations=2"]
    job = [*grpo, "algo.max_steps=6", "eval.interval=0", "checkpoint.interval=1", f"hydra.run.dir={out}"]
    proc = subprocess.Popen(launch_cmd(*job), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    marker = out / "checkpoints"
    deadline = time.time() + 240
    while not any(marker.glob("checkpoint-*/ablate_state.json")):
        if proc.poll() is not None or time.time() > deadline:
            proc.kill()
            pytest.fail(f"no checkpoint before the job ended: {proc.communicate()[1][-3000:]}")
        time.sleep(0.2)
    pid = _rank_pid(proc.pid, 1)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode != 0
    assert not (out / "summary.json").exists() or summary(out)["status"] == "failed", err[-2000:]

    again = launch(*job)
    assert again.returncode == 0, again.stderr[-3000:]
    s = summary(out)
    assert s["status"] == "finished" and s["steps"] == 6 and s["resumed_from_step"] >= 1
    assert s["provenance"]["world_size"] == 2
