"""The loader: every job a row (failed and unfinished included), the same frame from the run folders and
from W&B's offline run files, conditions and regime labels from the configs."""

import json

import pytest

from analysis.load import from_recorded, from_wandb_offline, label_conditions, load_runs
from tests.analysis.conftest import FIXTURE


def test_recorded_api_runs_keep_failed_and_unfinished():
    data = from_recorded(FIXTURE)
    status = dict(zip(data.runs["job"], data.runs["status"]))
    assert status["ref=int8,seed=3"] == "failed"
    assert status["ref=full,seed=4"] == "unfinished"  # no ablate summary: never reached its end
    assert "out of memory" in data.runs.set_index("job").loc["ref=int8,seed=3", "reason"]
    assert len(data.problems()) == 2
    assert set(data.curves["step"]) == {0, 2, 4}


@pytest.mark.slow
def test_folders_and_wandb_offline_give_the_same_numbers(tiny_sweep):
    folders = load_runs(tiny_sweep).runs.set_index("job")
    wandb = from_wandb_offline(tiny_sweep).runs.set_index("job")
    assert len(folders) == len(wandb) == 8
    assert (folders["status"] == "failed").sum() == 2 == (wandb["status"] == "failed").sum()
    done = folders[folders["status"] == "finished"].index  # job = the overrides, in both
    assert len(done) == 6
    for col in ("kl_true", "kl_approx", "win_rate", "reward_gold", "ref_bytes"):
        assert folders.loc[done, col].astype(float).tolist() == pytest.approx(
            wandb.loc[done, col].astype(float).tolist(), nan_ok=True
        )


@pytest.mark.slow
def test_sweep_command_and_failed_jobs_from_the_folder(tiny_sweep):
    data = load_runs(tiny_sweep)
    (sweep,) = data.sweeps
    assert sweep["command"].startswith("python -m ablate -m ") and "ref=full,int8" in sweep["command"]
    failed = data.runs[data.runs["status"] == "failed"]
    assert len(failed) == 2 and all(failed["reason"].str.len() > 0)
    assert set(data.curves.columns) >= {"job", "step", "kl/true", "train/loss", "regime", "condition"}


def test_conditions_and_regime_labels():
    import pandas as pd

    runs = pd.DataFrame(
        {
            "regime": ["ema", "ema", "full", "shared"],
            "cfg.ref.alpha": [0.1, 0.5, None, None],
            "cfg.algo.beta": [0.1, 0.1, 0.1, 0.1],
            "cfg.model.adapter.enabled": [False, False, False, True],
            "cfg.seed": [0, 0, 0, 0],
        }
    )
    label_conditions(runs)
    assert list(runs["regime"]) == ["ema(alpha=0.1)", "ema(alpha=0.5)", "full", "shared"]
    assert set(runs["condition"]) == {"all runs"}  # the adapter goes with ref=shared: not a condition


def test_seeds_with_and_without_a_step_0_evaluation_pool():
    """eval.at_start adds an evaluation and changes nothing else (tests/test_run.py), so a report's later seeds can
    evaluate step 0 and still pool with its earlier ones; eval.interval, which draws the curves, is a condition."""
    import pandas as pd

    runs = pd.DataFrame(
        {
            "regime": ["full", "full", "full"],
            "cfg.eval.at_start": [False, True, True],
            "cfg.eval.interval": [0, 0, 20],
            "cfg.seed": [0, 4, 5],
        }
    )
    label_conditions(runs)
    assert list(runs["condition"]) == ["eval.interval=0", "eval.interval=0", "eval.interval=20"]


def test_a_committed_run_from_before_the_judge_and_safety_options_pools_with_a_later_one(tmp_path):
    """Seed 0 of reports/dpo_regimes ran before `judge=` and `safety=` existed (its config has neither key); seed 4
    ran after (judge.name=vader, safety.name=profanity: what seed 0 ran with). They are one condition, not two."""
    import shutil

    from tests.conftest import REPO

    runs = REPO / "reports" / "dpo_regimes" / "runs"
    old, new = (
        runs / "report_dpo" / "logger=none,ref=full,seed=0",
        runs / "report_dpo_s4" / "logger=none,ref=full,seed=4",
    )
    assert "judge:" not in (old / "config.yaml").read_text() and "judge:" in (new / "config.yaml").read_text()
    for job in (old, new):
        shutil.copytree(job, tmp_path / "sweep" / job.name)
    frame = load_runs(tmp_path / "sweep").runs
    assert list(frame["condition"]) == ["all runs", "all runs"]
    assert set(frame["cfg.judge.name"]) == {"vader"} and set(frame["cfg.safety.name"]) == {"profanity"}


def _strict_and_old_sweeps(root):
    """One job written as a run writes it now (strict JSON: null + reason) and the same job as older runs wrote
    it (NaN tokens): kl/approx is NaN at every step and ref_hit_rate (a regime's own figure) is NaN."""
    import json

    from ablate.tracking.run_dir import SUMMARY_KEYS, RunFolder

    nan = float("nan")
    summary = {k: 0.5 for k in SUMMARY_KEYS}
    summary.update(status="finished", steps=2, kl_approx=nan, ref_hit_rate=nan, regime="none", seed=0)
    summary["nan_reasons"] = {"kl_approx": "no reference", "ref_hit_rate": "no cache"}
    history = [{"step": s, "kl/approx": nan, "kl/true": 0.1 * s, "train/loss": 1.0 - 0.1 * s} for s in (0, 1, 2)]
    sweeps = []
    for name in ("new", "old"):
        folder = RunFolder(root / name / "job")
        folder.write_config({"ref": {"name": "none"}, "algo": {"name": "dpo"}, "model": {"name": "tiny"}, "seed": 0})
        if name == "new":
            folder.write_summary(summary)
            for h in history:
                folder.log_metrics(h["step"], {k: v for k, v in h.items() if k != "step"})
        else:
            folder.summary_path.write_text(json.dumps(summary, indent=2))
            folder.metrics_path.write_text("".join(json.dumps({**h, "time": 0.0}) + "\n" for h in history))
        sweeps.append(root / name)
    return sweeps


def test_strict_and_old_nan_token_folders_load_to_the_same_frames(tmp_path):
    import math

    import pandas as pd

    new, old = (load_runs(f) for f in _strict_and_old_sweeps(tmp_path))
    drop = ["path", "time"]
    a, b = (r.runs.drop(columns=["path"]) for r in (new, old))
    pd.testing.assert_frame_equal(a, b)
    assert a["ref_hit_rate"].dtype == float and math.isnan(a["ref_hit_rate"].iloc[0])
    c, d = (r.curves.drop(columns=[k for k in drop if k in r.curves]) for r in (new, old))
    pd.testing.assert_frame_equal(c, d)
    assert c["kl/approx"].dtype == float and c["kl/approx"].isna().all()


@pytest.mark.slow
def test_every_key_of_a_run_s_summary_is_documented(tiny_sweep):
    from tests.tracking.test_summary_docs import undocumented

    summaries = [json.loads(p.read_text()) for p in sorted(tiny_sweep.rglob("summary.json"))]
    assert len(summaries) >= 6 and {"full", "int8", "none"} <= {s["regime"] for s in summaries}
    assert [undocumented(s) for s in summaries if undocumented(s)] == []
