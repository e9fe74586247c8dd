"""``python -m ablate.bench.profile``: a training step's time by operator category, on model=tiny."""

import subprocess
import sys

import pytest

from ablate.bench.profile import category
from tests.conftest import REPO


@pytest.mark.parametrize(
    "op, cat",
    [
        ("aten::mm", "matmul"),
        ("aten::addmm", "matmul"),
        ("aten::_scaled_dot_product_flash_attention_for_cpu", "attention"),
        ("aten::_log_softmax", "softmax and log-softmax"),
        ("aten::_foreach_mul_", "optimiser"),
        ("aten::copy_", "copies and layout"),
        ("aten::mul", "other arithmetic"),
        ("aten::mmx", "other arithmetic"),  # a name is matched whole unless it is listed as a prefix
    ],
)
def test_categories(op, cat):
    assert category(op) == cat


@pytest.mark.slow
def test_profile_on_tiny(tmp_path):
    out = tmp_path / "profile.md"
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "ablate.bench.profile",
            "model=tiny",
            "algos=grpo",
            "algo.max_steps=2",
            "task.max_new_tokens=8",
            f"out={out}",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    text = out.read_text()
    assert text.startswith("### grpo: 1 profiled steps")
    shares = {
        row.split("|")[1].strip(): float(row.split("|")[2].strip().rstrip("%"))
        for row in text.split("\n\n")[1].splitlines()[2:]
    }
    assert 0 < shares["sampling (generate, whole)"] < 100  # a rollout is a part of the step, not all of it
    assert shares["matmul (own time, every phase)"] > 0
    assert "| operator | category | share |" in text


@pytest.mark.slow
@pytest.mark.parametrize(
    "args, says",
    [(["algos=ppo2"], "algos must be among dpo, grpo"), (["algo.max_steps=1"], "algo.max_steps must be >= 2")],
)
def test_profile_bad_input_is_one_line(args, says):
    res = subprocess.run(
        [sys.executable, "-m", "ablate.bench.profile", "model=tiny", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    ours = [ln for ln in res.stderr.splitlines() if ln.startswith("ablate")]  # a library's import noise aside
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    assert len(ours) == 1 and ours[0].startswith("ablate.bench.profile: error: ") and says in ours[0], res.stderr
