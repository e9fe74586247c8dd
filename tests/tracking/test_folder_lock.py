"""A run folder is held by the process running its job: a second process on it is refused in one line before any
model loads, and a holder killed with SIGKILL leaves no stale lock."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from ablate.errors import AblateError
from ablate.tracking.run_dir import RunFolder
from tests.conftest import TINY_FAST, run_cli

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock is Unix's")


def test_a_second_holder_is_refused_until_the_first_releases(tmp_path):
    first = RunFolder(tmp_path).lock()
    with pytest.raises(AblateError, match=rf"pid {os.getpid()} \(since .*\) is running a job in this folder now"):
        RunFolder(tmp_path).lock()
    first.release()
    RunFolder(tmp_path).lock().release()


def test_a_holder_killed_with_sigkill_leaves_no_stale_lock(tmp_path):
    code = (
        "import sys, time; from ablate.tracking.run_dir import RunFolder; "
        "h = RunFolder(sys.argv[1]).lock(); print('held', flush=True); time.sleep(600)"
    )
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(AblateError, match=f"pid {holder.pid} "):
        RunFolder(tmp_path).lock()
    os.kill(holder.pid, signal.SIGKILL)
    holder.wait()
    RunFolder(tmp_path).lock().release()  # the kernel dropped it with the process


def test_a_job_on_a_folder_another_process_holds_is_one_line_and_touches_nothing(tmp_path):
    held = RunFolder(tmp_path).lock()
    try:
        res = run_cli(*TINY_FAST, f"hydra.run.dir={tmp_path}")
    finally:
        held.release()
    assert res.returncode != 0
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "is running a job in this folder now" in lines[0], res.stderr[-2000:]
    assert not any((tmp_path / f).exists() for f in ("config.yaml", "metrics.jsonl", "summary.json", "error.txt"))
