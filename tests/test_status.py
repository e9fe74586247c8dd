"""The sweep status command lists every job, unfinished and failed ones included."""

import json

from ablate.status import main
from ablate.tracking.run_dir import SUMMARY_KEYS


def _job(root, name, status=None):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text("seed: 0\n")
    if status:
        s = {k: float("nan") for k in SUMMARY_KEYS}
        s.update(status=status, steps=3, ref_bytes=2**20, kl_true=0.5)
        if status == "failed":
            s["reason"] = "RuntimeError: boom"
        (d / "summary.json").write_text(json.dumps(s))


def test_status_lists_every_job_and_fails_on_failures(tmp_path, capsys):
    _job(tmp_path, "ref=full", "finished")
    _job(tmp_path, "ref=int8", "failed")
    _job(tmp_path, "ref=nf4")
    code = main([str(tmp_path)])
    out = capsys.readouterr().out.splitlines()
    assert code == 1
    assert len(out) == 4  # header + 3 jobs
    assert any(line.startswith("finished") and "ref=full" in line and "0.5" in line for line in out)
    assert any(line.startswith("failed") and "boom" in line for line in out)
    assert any(line.startswith("unfinished") and "ref=nf4" in line for line in out)


def test_status_exit_0_when_all_finished(tmp_path, capsys):
    _job(tmp_path, "a", "finished")
    assert main([str(tmp_path)]) == 0
