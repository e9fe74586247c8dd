"""The sbatch job script a SLURM sweep would submit, rendered here, without a cluster and without submitting.

``python -m ablate -m +sweep=<preset> hydra/launcher=slurm ...`` hands every job of the sweep to Hydra's
submitit launcher, which submits them as one SLURM job array through submitit. This module builds the same
objects the launcher builds, from the same config, and asks submitit itself for the text it would hand to
``sbatch`` -- so what you read is what would run:

- the launcher config is the project's Hydra config composed with ``hydra/launcher=slurm``, the preset and the
  user's overrides (:func:`ablate.compose.compose_raw`), instantiated into the real ``SlurmLauncher``;
- the jobs are counted as the CLI's preflight counts them (:func:`ablate.cli._job_overrides`);
- the executor is built from the launcher's parameters as ``SlurmLauncher.launch`` builds it
  (``AutoExecutor(cluster="slurm")`` then ``update_parameters``), and the script is submitit's
  ``SlurmExecutor._make_submission_file_text`` for the array it would submit (``map_count`` = the job count,
  ``--array=0-{n-1}%{array_parallelism}``), running submitit's own command
  (``python -u -m submitit.core._submit <folder>``: the job unpickles the launcher and its job's overrides).
  That is submitit's private API: it lives in :mod:`ablate.sweep.submitit_fence`, whose contract is checked
  before anything is rendered.

Paths come out as the real run would write them from the current folder; a ``${now:...}`` in
``hydra.sweep.dir`` resolves to the time of the preview (the real run gets its own).
"""

from __future__ import annotations

from dataclasses import dataclass

from ablate.errors import ConfigError, one_line, parse_error

LAUNCHER = "slurm"  # conf/hydra/launcher/slurm.yaml


@dataclass(frozen=True)
class Preview:
    """One sweep's rendered job script and the numbers the header states."""

    preset: str
    jobs: int
    array_parallelism: int
    sweep_dir: str  # hydra.sweep.dir as written (unresolved), to say when it holds a timestamp
    script: str

    def header(self) -> str:
        how = (
            f"one SLURM job array of {self.jobs} tasks, at most {min(self.jobs, self.array_parallelism)} at a time"
            if self.jobs > 1
            else "one SLURM job"
        )
        when = "; paths hold the time of this preview (the real run gets its own)" if "${now:" in self.sweep_dir else ""
        return f"# ablate: sweep {self.preset}: {self.jobs} jobs, {how}; a preview: nothing was submitted{when}"

    def text(self) -> str:
        return f"{self.header()}\n{self.script}"


def _hydra_args(overrides: list[str]) -> list[str]:
    """The overrides of Hydra's own node (``hydra.launcher.partition=gpu``); the CLI splits them off the same way."""
    from ablate.cli import _is_flag

    return [a for a in overrides if not _is_flag(a) and a.lstrip("+~").startswith("hydra")]


def _check_overrides(overrides: list[str]) -> None:
    for a in overrides:
        key, _, value = a.partition("=")
        if key.lstrip("+~") == "hydra/launcher" and value != LAUNCHER:
            raise ConfigError(f"slurm-preview renders hydra/launcher={LAUNCHER}'s job script: drop {a}")
        if key.lstrip("+~") == "sweep":
            raise ConfigError(f"the preset is slurm-preview's first argument: drop {a}")


def render(preset: str, overrides: list[str] = ()) -> Preview:
    """The job script of ``python -m ablate -m +sweep=<preset> hydra/launcher=slurm <overrides>``. Raises
    ConfigError (one line) for an unknown preset or overrides that do not compose. Submits nothing; writes
    nothing."""
    from hydra.errors import HydraException
    from hydra.utils import instantiate
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ablate import presets
    from ablate.cli import _job_overrides
    from ablate.compose import compose_raw, hydra_session, register_configs
    from ablate.sweep import submitit_fence

    submitit_fence.check()  # an incompatible submitit: one line, before anything composes
    presets.load(preset)  # an unknown name: one line
    overrides = list(overrides)
    _check_overrides(overrides)
    register_configs()
    try:
        jobs = _job_overrides(["-m", f"+sweep={preset}", *overrides])
    except HydraException as e:
        raise ConfigError(parse_error(e)) from None
    hydra_args = [a for a in _hydra_args(overrides) if a.partition("=")[0].lstrip("+~") != "hydra/launcher"]
    with hydra_session():
        try:
            # the first job's config: its hydra node is the sweep's (the jobs differ only in their own keys)
            cfg = compose_raw(*jobs[0], f"hydra/launcher={LAUNCHER}", *hydra_args, hydra=True)
            # the real SlurmLauncher's parameters, resolved
            params = submitit_fence.launcher_params(instantiate(cfg.hydra.launcher))
            sweep_dir = str(OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["dir"])
            executor = submitit_fence.executor_for(params)
        except (HydraException, OmegaConfBaseException, ValueError) as e:
            raise ConfigError(one_line(e)) from None
    return Preview(
        preset=preset,
        jobs=len(jobs),
        array_parallelism=int(params["array_parallelism"]),
        sweep_dir=sweep_dir,
        script=submitit_fence.script_for(executor, len(jobs)),
    )
