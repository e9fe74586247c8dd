"""``python -m ablate.sweep slurm-preview``: the sbatch script a SLURM sweep would submit, rendered by submitit
from the project's composed launcher config, without a cluster; and, with stand-in ``sbatch``/``srun``
programs on PATH, byte for byte the script the real ``python -m ablate -m ... hydra/launcher=slurm`` hands
to sbatch."""

import os
import shlex
import subprocess
import sys
import time

import pytest

from ablate import presets
from ablate.errors import ConfigError
from ablate.refs import regime_names
from ablate.sweep.__main__ import main
from ablate.sweep.slurm_preview import render
from tests.conftest import REPO

pytest.importorskip("submitit")

SETUP = "hydra.launcher.setup=[source /x/.venv/bin/activate]"


def _sbatch(script: str) -> dict[str, str]:
    """The ``#SBATCH --key=value`` lines of a script, as a dict."""
    out = {}
    for line in script.splitlines():
        if line.startswith("#SBATCH --"):
            key, _, value = line[len("#SBATCH --") :].partition("=")
            out[key] = value
    return out


def test_seeds_is_a_three_job_sweep():
    assert presets.grid(["seeds"]) == {"seed": "0,1,2"}


def test_three_jobs_are_one_array_with_the_launcher_resources(tmp_path):
    sweep = tmp_path / "sweep"
    p = render("seeds", ["hydra.launcher.partition=gpu", SETUP, f"hydra.sweep.dir={sweep}"])
    assert p.jobs == 3
    lines = p.script.splitlines()
    assert lines[0] == "#!/bin/bash"
    flags = _sbatch(p.script)
    assert flags["array"] == "0-2%3"  # 3 tasks; array_parallelism 32 caps nothing here
    # conf/hydra/launcher/slurm.yaml's resources, converted by submitit (timeout_min -> time, mem_gb -> mem)
    assert flags["cpus-per-task"] == "8"
    assert flags["gpus-per-node"] == "1"
    assert flags["mem"] == "64GB"
    assert flags["time"] == "720"
    assert flags["partition"] == "gpu"
    assert flags["job-name"] == "ablate"
    assert "gres" not in flags and "account" not in flags  # null in the preset: no flag
    folder = sweep / ".submitit"
    assert flags["output"] == f"{folder}/%A_%a/%A_%a_0_log.out"  # array tasks: %A_%a, not %j
    assert flags["error"] == f"{folder}/%A_%a/%A_%a_0_log.err"
    # the setup lines, then the command submitit runs: its own entry point on the pickled launcher call
    command = (
        f"srun --unbuffered --output {folder}/%A_%a/%A_%a_%t_log.out --error {folder}/%A_%a/%A_%a_%t_log.err "
        f"{shlex.quote(sys.executable)} -u -m submitit.core._submit {folder}/%j"
    )
    assert lines.count("source /x/.venv/bin/activate") == 1
    assert lines.index("# setup") < lines.index("source /x/.venv/bin/activate") < lines.index("# command")
    assert lines[lines.index("# command") + 1 :] == ["export SUBMITIT_EXECUTOR=slurm", command]
    assert not sweep.exists()  # nothing written, nothing submitted


def test_overrides_change_the_flags(tmp_path):
    p = render(
        "seeds",
        [
            f"hydra.sweep.dir={tmp_path}",
            "hydra.launcher.array_parallelism=2",
            "hydra.launcher.timeout_min=90",
            "hydra.launcher.mem_gb=32",
            "hydra.launcher.cpus_per_task=4",
            "hydra.launcher.gpus_per_node=null",
            "hydra.launcher.gres=gpu:a100:2",
            "hydra.launcher.account=lab",
        ],
    )
    flags = _sbatch(p.script)
    assert flags["array"] == "0-2%2"  # at most array_parallelism tasks at a time
    assert (flags["time"], flags["mem"], flags["cpus-per-task"]) == ("90", "32GB", "4")
    assert flags["gres"] == "gpu:a100:2" and "gpus-per-node" not in flags
    assert flags["account"] == "lab"
    assert "partition" not in flags  # none given: the cluster's default partition
    lines = p.script.splitlines()  # setup: [] in the preset, an empty section
    assert [ln for ln in lines[lines.index("# setup") + 1 : lines.index("# command")] if ln] == []


def test_job_overrides_count_and_a_single_job_is_no_array(tmp_path):
    assert render("seeds", [f"hydra.sweep.dir={tmp_path}", "model=tiny", "ref=full,none"]).jobs == 6
    one = render("seeds", [f"hydra.sweep.dir={tmp_path}", "seed=0"])
    assert one.jobs == 1
    assert "array" not in _sbatch(one.script)
    assert f"{tmp_path}/.submitit/%j/%j_0_log.out" == _sbatch(one.script)["output"]


def test_a_preset_sweep_folder_is_used(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    p = render("regimes", [])
    n = len(regime_names("sweep"))
    assert p.jobs == n
    assert _sbatch(p.script)["array"] == f"0-{n - 1}%{n}"
    assert p.script.rstrip().endswith(f"-m submitit.core._submit {tmp_path}/runs/sweeps/regimes/.submitit/%j")
    assert "time of this preview" not in p.header()  # a fixed folder: the real run's paths are these
    assert "time of this preview" in render("seeds", []).header()  # runs/sweep_${now:...}


def test_cli_prints_one_comment_line_then_the_script(tmp_path, capsys):
    assert main(["slurm-preview", "seeds", "hydra.launcher.partition=gpu", SETUP, f"hydra.sweep.dir={tmp_path}"]) == 0
    out = capsys.readouterr().out
    header, script = out.split("\n", 1)
    assert header.startswith("# ") and "3 jobs" in header and "nothing was submitted" in header
    assert script.startswith("#!/bin/bash\n")
    assert "#SBATCH --array=0-2%3" in script.splitlines()
    assert "#SBATCH --partition=gpu" in script.splitlines()


def test_unknown_preset_and_bad_overrides_are_one_line(tmp_path):
    names = ", ".join(presets.preset_files())
    with pytest.raises(ConfigError, match=r"^unknown sweep 'nope' \(choose from: .*seeds"):
        main(["slurm-preview", "nope"])
    with pytest.raises(ConfigError, match="partiton"):
        render("seeds", ["hydra.launcher.partiton=gpu"])
    with pytest.raises(ConfigError, match="hydra/launcher=parallel"):
        render("seeds", ["hydra/launcher=parallel"])
    with pytest.raises(ConfigError, match="unknown ref 'int3'"):
        render("seeds", ["ref=int3"])
    res = subprocess.run(
        [sys.executable, "-m", "ablate.sweep", "slurm-preview", "nope"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.strip().splitlines() == [f"ablate: error: unknown sweep 'nope' (choose from: {names})"]


@pytest.mark.slow
def test_the_preview_is_what_the_launcher_submits(tmp_path):
    """The real sweep command, with stand-ins for SLURM's programs: ``sbatch`` keeps the script it is given (whole: copied, then renamed) and
    answers with a job id (the launcher then waits on the job: stopped once the script is there)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    submitted = tmp_path / "submitted.sh"
    for name, body in {
        "sbatch": f'cp "$1" {shlex.quote(str(submitted))}.tmp && mv {shlex.quote(str(submitted))}.tmp '
        f'{shlex.quote(str(submitted))}\necho "Submitted batch job 4242"',
        "srun": "exit 0",
        "sacct": "exit 1",
    }.items():
        (bin_dir / name).write_text(f"#!/bin/bash\n{body}\n")
        (bin_dir / name).chmod(0o755)
    args = ["model=tiny", "hydra.launcher.partition=gpu", SETUP, f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "ablate", "-m", "+sweep=seeds", "hydra/launcher=slurm", *args],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not submitted.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert submitted.exists(), err[-3000:]
    preview = render("seeds", args)
    assert preview.script == submitted.read_text()
