"""``python -m analysis calibration`` and ``archive`` on synthetic run folders: the rule that picks a setting, the
report regenerating byte for byte from archived runs, and one-line errors. No model runs."""

from __future__ import annotations

import shutil

import pandas as pd
import pytest

from ablate.tracking.run_dir import SUMMARY_KEYS, RunFolder
from analysis.__main__ import main

# (lr, steps, reward_delta, its interval, true KL): what each calibration job "measured"
GRID = [
    (5e-6, 20, 0.02, (-0.03, 0.07), 0.4),  # no clear effect
    (1e-5, 20, 0.14, (0.08, 0.20), 1.5),  # qualifies, cheapest
    (5e-6, 40, 0.14, (0.08, 0.20), 1.2),  # qualifies, twice the steps
    (1e-5, 40, 0.21, (0.14, 0.28), 6.0),  # KL out of the window
]


def _sweep(root, finished=GRID, unfinished=1):
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text(
        "hydra:\n  overrides:\n    hydra: [hydra.sweep.dir=/elsewhere/calib, hydra.mode=MULTIRUN]\n"
        "    task: [+sweep=calibrate_dpo, logger=none]\n"
    )
    jobs = [(*job, 64)[:6] for job in finished] + [(2e-5, 80, None, None, None, 64)] * unfinished
    for lr, steps, rd, ci, kl, n_train in jobs:
        folder = RunFolder(root / f"algo.learning_rate={lr},algo.max_steps={steps},task.n_train={n_train}")
        cfg = {"ref": {"name": "full"}, "model": {"name": "smollm2"}, "seed": 0, "threads": None}
        cfg |= {"algo": {"name": "dpo", "learning_rate": lr, "max_steps": steps, "batch_size": 4, "beta": 0.1}}
        cfg |= {"task": {"n_train": n_train}, "eval": {"n_prompts": 128, "samples_per_prompt": 2}}
        folder.write_config(cfg)
        if rd is None:
            continue
        s = {k: 0.5 for k in SUMMARY_KEYS}
        s.update(status="finished", reason="", steps=steps, regime="full", algo="dpo", model="smollm2", seed=0)
        s.update(reward_delta=rd, reward_delta_lo=ci[0], reward_delta_hi=ci[1], kl_true=kl, wall_s=60.0 * steps)
        folder.write_summary(s)
        folder.log_metrics(steps, {"kl/true": kl})
        (folder.path / "checkpoints").mkdir()
        (folder.path / "checkpoints" / "weights.bin").write_bytes(b"x" * 1000)
    return root


def _files(out):
    return {p: (out / p).read_bytes() for p in ("report.md", "calibration.csv", "table.tex", "figures/calibration.png")}


def test_the_rule_picks_the_cheapest_qualifying_setting(tmp_path):
    sweep = _sweep(tmp_path / "calibrate_dpo")
    out = tmp_path / "report"
    assert main(["calibration", str(sweep), "--out", str(out)]) == 0
    f = pd.read_csv(out / "calibration.csv")
    assert len(f) == 4  # the unfinished job is listed in the report, not in the table
    by = {(r.learning_rate, r.max_steps): r for r in f.itertuples()}
    assert not by[(5e-6, 20)].improves and not by[(5e-6, 20)].qualifies
    assert by[(1e-5, 40)].improves and not by[(1e-5, 40)].in_window
    assert by[(1e-5, 20)].qualifies and by[(5e-6, 40)].qualifies
    assert f["chosen"].tolist().count(True) == 1 and by[(1e-5, 20)].chosen
    text = (out / "report.md").read_text()
    assert "Chosen for dpo: **lr 1e-05, 20 steps, 64 pairs**." in text
    assert "## Runs not finished" in text and "algo.learning_rate=2e-05,algo.max_steps=80,task.n_train=64" in text
    # the sweep's command without the machine's absolute folder (the preset's own default then applies)
    assert "python -m ablate -m +sweep=calibrate_dpo logger=none\n" in text and "/elsewhere" not in text
    assert "Generated" not in text  # nothing that depends on when it was made

    # a wider window lets the 40-step, KL 6 run qualify, but the 20-step one is still cheaper
    out2 = tmp_path / "wide"
    assert main(["calibration", str(sweep), "--out", str(out2), "--kl-window", "0.1", "10"]) == 0
    g = pd.read_csv(out2 / "calibration.csv")
    assert g["qualifies"].sum() == 3 and g.loc[g["chosen"], "max_steps"].tolist() == [20]


def test_archived_runs_regenerate_the_report_byte_for_byte(tmp_path):
    sweep = _sweep(tmp_path / "calibrate_dpo")
    runs = tmp_path / "reports" / "calib" / "runs"
    assert main(["archive", str(sweep), "--out", str(runs)]) == 0
    copied = sorted(p.relative_to(runs).as_posix() for p in runs.rglob("*") if p.is_file())
    assert "calibrate_dpo/multirun.yaml" in copied and not any("checkpoints" in p for p in copied)
    assert len([p for p in copied if p.endswith("summary.json")]) == 4  # the unfinished job is left out
    out = tmp_path / "reports" / "calib"
    args = ["calibration", str(runs / "calibrate_dpo"), "--out", str(out)]
    assert main(args) == 0
    first = _files(out)
    # the Reproduce block says how the archived copy was made from the preset's own sweep folder
    assert f"python -m analysis archive runs/sweeps/calibrate_dpo --out {runs}\n" in first["report.md"].decode()
    shutil.rmtree(out / "figures")
    (out / "report.md").unlink()
    assert main(args) == 0
    assert _files(out) == first
    # archiving again replaces the copy whole (no stale jobs)
    shutil.rmtree(sweep / "algo.learning_rate=1e-05,algo.max_steps=40,task.n_train=64")
    assert main(["archive", str(sweep), "--out", str(runs)]) == 0
    assert len(list(runs.rglob("summary.json"))) == 3


def test_at_equal_steps_fewer_pairs_then_the_clearest_improvement_win(tmp_path):
    """At equal steps the setting with fewer pairs wins (each job audits its reference on every pair), even with a
    smaller effect; at equal steps and pairs, the one whose reward_delta interval is furthest above 0."""
    grid = [(1e-5, 20, 0.14, (0.08, 0.20), 1.5, 32), (1e-5, 20, 0.18, (0.12, 0.24), 1.6, 128), *GRID[1:2]]
    grid.append((2e-5, 20, 0.16, (0.10, 0.22), 2.0, 32))
    out = tmp_path / "report"
    assert main(["calibration", str(_sweep(tmp_path / "pairs", grid, unfinished=0)), "--out", str(out)]) == 0
    f = pd.read_csv(out / "calibration.csv")
    assert f["qualifies"].all() and f.loc[f["chosen"], ["n_train", "learning_rate"]].values.tolist() == [[32, 2e-5]]


@pytest.mark.parametrize(
    "args, message",
    [
        (["calibration", "{tmp}/nope", "--out", "{tmp}/r"], "analysis: error: no such folder: {tmp}/nope"),
        (["archive", "{tmp}/nope", "--out", "{tmp}/r"], "analysis: error: no such folder: {tmp}/nope"),
        (["calibration", "{tmp}", "--out", "{tmp}/r", "--kl-window", "5", "1"], "analysis: error: --kl-window"),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, args, message):
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(message.format(tmp=tmp_path)) and "\n" not in err
