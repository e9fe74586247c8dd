"""``ref=served`` through the CLI: a GRPO run whose reference is llama.cpp's server (started by the run on loopback)
finishes, records the server's cost and leaves no server behind; a server killed in the middle of a run fails it in
one line (exit 2, a failed summary), and rerunning the same command resumes from the last checkpoint and finishes.

llama-cpp-python's echo path sorts the vocabulary in Python for every token: the runs are as short as the path
allows (two-row GRPO groups of 8 new tokens, no fidelity audit, one evaluation of two prompts at the end)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from tests.conftest import popen_cli, run_cli

pytest.importorskip("llama_cpp")
psutil = pytest.importorskip("psutil")

SERVED_GRPO = [
    "model=tiny",
    "algo=grpo",
    "algo.num_generations=2",
    "algo.batch_size=2",
    "task.n_train=4",
    "task.samples_per_prompt=2",
    "task.max_new_tokens=8",
    "eval.at_start=false",
    "eval.interval=0",
    "eval.fidelity=false",
    "eval.n_prompts=2",
    "eval.samples_per_prompt=1",
    "logger=none",
    "threads=1",
    "ref=served",
    "ref.threads=1",
]


def summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def servers(port: int | None = None) -> list:
    """The llama.cpp server processes running now (on ``port``, if given)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        if "ablate.serving.llama_server" in cmd and (port is None or f"--port {port} " in " ".join(cmd) + " "):
            found.append(p)
    return found


def assert_served(s: dict) -> None:
    """The summary of a finished run that got its reference from a server ablate started itself."""
    assert s["status"] == "finished", s.get("reason")
    assert s["ref_bytes"] == 0 and s["ref_server_rss_bytes"] > 0 and s["ref_requests"] > 0
    reference = s["provenance"]["reference"]
    assert reference["url"] is None and reference["engine"].startswith("llama-cpp-python")
    assert servers(reference["port"]) == []  # stopped with the run


@pytest.mark.slow  # a llama.cpp server, whose echo sorts the vocabulary in Python for every token
def test_a_served_grpo_run_finishes(tmp_path):
    out = tmp_path / "run"
    res = run_cli(*SERVED_GRPO, "algo.max_steps=2", f"hydra.run.dir={out}", cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    s = summary(out)
    assert_served(s)
    assert s["steps"] == 2
    # 4 sampled rows, each tokenized by the server and, unless it tokenizes the row otherwise (then skipped: for
    # GRPO ref.mismatch=auto is skip), echoed for its log-probs
    assert s["ref_requests"] == 2 * 4 - s["ref_mismatch_rows"]
    # the audit's stand-in divergence needs every sampled response scored: the random model's are split in ways
    # their text never tokenizes to, so it is NaN with that reason (test_served.py measures the distribution itself)
    assert "tokenizes 1 sampled responses otherwise" in s["nan_reasons"]["kl_approx"]
    evals = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"kl/true"' in x]
    assert evals[-1]["kl/approx"] is None and evals[-1]["nan_reasons"]["kl/approx"] == s["nan_reasons"]["kl_approx"]


@pytest.mark.slow  # a llama.cpp server, and two runs (the second resumed)
def test_a_killed_server_mid_run_is_one_line_and_a_rerun_resumes(tmp_path):
    out = tmp_path / "run"
    job = [
        *SERVED_GRPO, "algo.max_steps=4", "checkpoint.interval=1", "ref.retries=1", "ref.timeout_s=60",
        f"hydra.run.dir={out}",
    ]  # fmt: skip
    log = tmp_path / "killed.log"  # a killed server refuses at once: ref.timeout_s is for a busy machine's answers
    proc = popen_cli(*job, log=log, cwd=tmp_path)
    deadline = time.time() + 300
    try:
        while True:
            server = [p for p in psutil.Process(proc.pid).children(recursive=True) if p in servers()]
            if server and any(out.glob("checkpoints/checkpoint-*/ablate_state.json")):
                break
            assert proc.poll() is None, f"the run ended before its first checkpoint: {log.read_text()[-3000:]}"
            assert time.time() < deadline, "no checkpoint within 300 s"
            time.sleep(0.05)
        (server,) = server
        server.kill()
        assert proc.wait(timeout=120) == 2, log.read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
    text = log.read_text()
    errors = [line for line in text.splitlines() if line.startswith("ablate: error:")]
    assert len(errors) == 1 and "server http://127.0.0.1:" in errors[0] and "cannot connect" in errors[0], text[-3000:]
    assert "Traceback" not in text
    failed = summary(out)
    assert failed["status"] == "failed" and "ServerError" in failed["reason"]

    res = run_cli(*job, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "resuming from" in res.stdout + res.stderr
    s = summary(out)
    assert_served(s)
    assert s["steps"] == 4 and s["resumed_from_step"] >= 1
    # the server's counters cover the whole job, as an uninterrupted run's: 8 rows, the first attempt's from its
    # checkpoint (what it did after the checkpoint is redone)
    assert s["ref_requests"] == 2 * 8 - s["ref_mismatch_rows"]
