"""A job's peak memory is its own: not the size of the process that started it."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from ablate.tracking.memory import peak_rss_bytes
from tests.conftest import REPO


def test_a_child_process_does_not_report_its_parents_size():
    ballast = np.ones(400 * 2**20 // 8)  # 400 MiB resident in this process when the child is started
    child = subprocess.run(
        [sys.executable, "-c", "from ablate.tracking.memory import peak_rss_bytes; print(peak_rss_bytes())"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    assert float(child.stdout) < peak_rss_bytes() - 300 * 2**20
    assert ballast.sum() > 0
