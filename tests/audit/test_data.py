"""The audit's JSONL reader (ablate.audit.data) and its bad-input lines: each is exactly one line on stderr and exit
code 2 from ``python -m ablate.audit``, before any model loads."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from ablate.audit.cli import main
from ablate.audit.data import AuditInputError, prompts_of, read_pairs
from tests.conftest import REPO

GOOD = {"prompt": "Review Lucky Harbor.", "chosen": "A joy.", "rejected": "A mess."}


def _write(tmp_path, lines: list[str]):
    path = tmp_path / "pairs.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def no_model(monkeypatch):
    """Fail the test if anything loads a model."""

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr("ablate.inputs.load_model", refuse)


def test_pairs_come_in_order_with_unknown_rewards_and_blank_lines_skipped(tmp_path):
    other = {**GOOD, "prompt": "Review Iron Summer.", "extra": 1}
    pairs = read_pairs(_write(tmp_path, [json.dumps(GOOD), "", json.dumps(other), json.dumps(GOOD)]))
    assert [p.prompt for p in pairs] == [GOOD["prompt"], other["prompt"], GOOD["prompt"]]
    assert (pairs[0].chosen, pairs[0].rejected) == ("A joy.", "A mess.")
    assert math.isnan(pairs[0].chosen_reward) and math.isnan(pairs[0].rejected_reward)
    assert prompts_of(pairs) == [GOOD["prompt"], other["prompt"]]


BAD = {
    "empty": ([""], "pairs.jsonl: empty, no rows"),
    "bad_json": ([json.dumps(GOOD), '{"prompt": "x", '], "pairs.jsonl:2: not valid JSON"),
    "not_an_object": (["[1, 2]"], "pairs.jsonl:1: an array, not a JSON object"),
    "missing_field": (
        [json.dumps(GOOD), json.dumps({"prompt": "p", "chosen": "c"})],
        "pairs.jsonl:2: field 'rejected' is missing",
    ),
    "non_string": ([json.dumps({**GOOD, "chosen": 3})], "pairs.jsonl:1: field 'chosen' must be text or a list of"),
    "no_responses": ([json.dumps({"prompt": "p"})], "pairs.jsonl:1: no chosen and rejected response"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_data_is_one_line_and_exit_2_before_any_model_loads(tmp_path, capsys, no_model, case):
    lines, expected = BAD[case]
    rc = main(["ref=full,int8", "model=tiny", "--data", str(_write(tmp_path, lines)), "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("ablate.audit: error: ") and expected in err[0], err[0]
    assert not (tmp_path / "o").exists()


@pytest.mark.slow
def test_a_missing_file_is_one_line_from_the_command_line(tmp_path):
    res = subprocess.run(
        [sys.executable, "-m", "ablate.audit", "--data", str(tmp_path / "nope.jsonl"), "model=tiny"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2 and res.stdout == ""
    assert res.stderr.strip().splitlines() == [
        f"ablate.audit: error: --data {tmp_path / 'nope.jsonl'}: no such file "
        '(one JSON object per line: {"prompt": "...", "chosen": "...", "rejected": "..."})'
    ]


def test_the_reader_raises_the_audits_input_error(tmp_path):
    with pytest.raises(AuditInputError, match="empty, no rows"):
        read_pairs(_write(tmp_path, ["", "  "]))
