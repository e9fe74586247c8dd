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


def test_a_job_without_a_summary_shows_its_steps_its_last_evaluation_and_whether_it_runs(tmp_path, capsys):
    """A held folder lock (a real flock, as a running job holds it) reads ``running``; released, ``stopped``; with
    the steps logged of algo.max_steps and the last evaluation's figures from metrics.jsonl."""
    from ablate.tracking.run_dir import RunFolder

    folder = RunFolder(tmp_path / "ref=full")
    folder.write_config({"algo": {"max_steps": 160}, "seed": 0})
    folder.log_metrics(0, {"eval/win_rate": 0.5, "kl/true": 0.0})
    for step in range(1, 15):
        folder.log_metrics(step, {"train/loss": 0.1})
    folder.log_metrics(10, {"eval/win_rate": 0.625, "kl/true": 8.25})
    with open(folder.metrics_path, "a") as fh:
        fh.write('{"step": 15, "train/lo')  # a killed writer's partial line
    lock = folder.lock()
    assert main([str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.split()[:4] == ["running", "14/160", "0.625", "nan"] and "8.25" in line and line.endswith("ref=full")
    lock.release()
    main([str(tmp_path)])
    assert capsys.readouterr().out.splitlines()[1].split()[:2] == ["stopped", "14/160"]
