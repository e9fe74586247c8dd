"""A small real sweep on model=tiny, shared by the analysis tests: 3 regimes x 2 seeds finish, 2 jobs fail."""

import pytest

from tests.conftest import REPO, TINY_FAST, popen_cli, run_cli

FIXTURE = REPO / "tests" / "analysis" / "fixtures" / "wandb_api_runs.json"


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("analysis_sweep")
    garbage = root / "not_a_model"
    garbage.mkdir()
    (garbage / "config.json").write_text("{ broken")
    sweep = root / "sweep"
    fast = [o for o in TINY_FAST if not o.startswith("logger=")]
    # model=hf on a broken folder fails at run time: 2 failed jobs to be listed, never dropped. That sweep runs beside
    # the 6 good jobs, which run 2 at a time (the joblib launcher): the fixture took 74 s one job after another.
    failing = popen_cli(
        "-m",
        *fast,
        "threads=1",
        "model=hf",
        f"model.name_or_path={garbage}",
        "ref=full",
        "seed=0,1",
        f"hydra.sweep.dir={root}/failing",  # moved under the sweep when both are done (its end-of-sweep check sees it)
        log=root / "failing.log",
        cwd=root,
    )
    res = run_cli(
        "-m",
        *fast,
        "threads=1",
        "ref=full,int8,none",
        "seed=0,1",
        "hydra/launcher=parallel",
        "hydra.launcher.n_jobs=2",
        f"hydra.sweep.dir={sweep}",
        cwd=root,
        timeout=900,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert failing.wait(timeout=900) == 1, (root / "failing.log").read_text()[-3000:]
    (root / "failing").rename(sweep / "failing")
    return sweep
