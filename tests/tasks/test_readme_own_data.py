"""The README's "Your own model and data" commands run as written, in a folder holding a small ``pairs.jsonl``
this test makes, on the tiny model with a reward model the test builds (the test adds those overrides and short
run settings to the two commands that take overrides; the commands themselves are read from the README)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from tests.conftest import REPO

TINY = [
    "model=tiny",
    "algo.max_steps=2",
    "eval.interval=0",
    "eval.n_prompts=4",
    "eval.samples_per_prompt=2",
    "task.max_new_tokens=12",
    "algo.batch_size=2",
    "logger=none",
]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = re.search(r"<!-- own-data:[^\n]*-->\n```bash\n(.*?)```", text, re.S)
    assert block, "the README's own-data block is missing"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_the_readme_block_is_three_commands_on_pairs_jsonl():
    commands = readme_commands()
    assert [c.split()[:3] for c in commands] == [
        ["python", "-m", "ablate.audit"],
        ["python", "-m", "ablate"],
        ["python", "-m", "analysis"],
    ]
    assert all("task.path=pairs.jsonl" in c for c in commands[:2])


@pytest.mark.slow
def test_the_readme_commands_run_as_written(tmp_path):
    from tests.judges import save_classifier

    rows = [
        {"prompt": f"Write one sentence about film {i}.", "chosen": f"Film {i} was a joy.",
         "rejected": f"Film {i} was a chore."}
        for i in range(40)
    ]  # fmt: skip
    (tmp_path / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    judge = ["judge=reward_model", f"judge.path={save_classifier(tmp_path / 'rm')}"]
    for command in readme_commands():
        args = shlex.split(command)
        assert args[0] == "python"
        extra = [*TINY, *judge] if args[2] in ("ablate", "ablate.audit") else []
        if args[2] == "ablate.audit":
            extra += ["--n-prompts", "2"]
        done = subprocess.run(
            [sys.executable, *args[1:], *extra], cwd=tmp_path, capture_output=True, text=True, timeout=900
        )
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    assert (tmp_path / "audit" / "audit.md").is_file()
    assert len(list((tmp_path / "sweep").rglob("summary.json"))) == 4  # a path in an override nests its folder
    report = (tmp_path / "report" / "report.md").read_text()
    assert "- data and judges: task dataset pairs.jsonl (sha256 " in report  # the report names the data and judge
    assert f"judge reward_model {tmp_path / 'rm'}" in report
    recheck = subprocess.run(
        [sys.executable, "-m", "analysis", "recheck", "sweep", "--report", "report"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert recheck.returncode == 0 and "all agree" in recheck.stdout + recheck.stderr, recheck.stderr[-2000:]
