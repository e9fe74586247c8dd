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


def _render_only_executor():
    """submitit's SlurmExecutor, unchanged except that it exists where ``srun`` does not (its constructor
    refuses otherwise) and cannot submit: rendering is all it is for."""
    from submitit.slurm.slurm import SlurmExecutor

    class RenderOnlySlurmExecutor(SlurmExecutor):
        @classmethod
        def name(cls) -> str:
            return "slurm"  # the prefix of its parameters (slurm_max_num_timeout), as for SlurmExecutor

        @classmethod
        def affinity(cls) -> int:
            return 2  # what SlurmExecutor reports where srun exists

        def _submit_command(self, command: str):
            raise RuntimeError("ablate.sweep.slurm_preview renders job scripts; it submits nothing")

    return RenderOnlySlurmExecutor


def _auto_executor(executor_cls, folder: str, **init_params):
    """``AutoExecutor(cluster="slurm", folder=folder, **init_params)`` around ``executor_cls``: the same
    attributes AutoExecutor's constructor sets (its constructor would build a SlurmExecutor, which needs srun),
    so its own ``update_parameters`` converts the launcher's parameters (timeout_min -> time, mem_gb -> mem...)."""
    from submitit.auto.auto import AutoExecutor, flexible_init
    from submitit.core import plugins
    from submitit.core.core import Executor

    auto = AutoExecutor.__new__(AutoExecutor)
    auto.cluster = LAUNCHER
    auto._executor = flexible_init(executor_cls, folder, **init_params)
    valid = auto._valid_parameters()
    auto._deprecated_args = {
        arg: f"{name}_{arg}"
        for name, ex in plugins.get_executors().items()
        for arg in ex._valid_parameters()
        if arg not in valid
    }
    Executor.__init__(auto, auto._executor.folder, auto._executor.parameters)
    return auto


def executor_for(params: dict):
    """The executor ``SlurmLauncher.launch`` builds from its parameters (``launcher.params``): the folder and
    ``max_num_timeout`` go to the constructor, the shared parameters (hydra_submitit_launcher's
    ``BaseQueueConf``) to ``update_parameters`` as they are, every other one prefixed ``slurm_``."""
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    specific_init_keys = {"max_num_timeout"}
    init_params = {f"{LAUNCHER}_{k}": v for k, v in params.items() if k in specific_init_keys}
    executor = _auto_executor(_render_only_executor(), params["submitit_folder"], **init_params)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    init_keys = specific_init_keys | {"submitit_folder"}
    executor.update_parameters(
        **{k if k in base else f"{LAUNCHER}_{k}": v for k, v in params.items() if k not in init_keys}
    )
    return executor


def script_for(executor, jobs: int) -> str:
    """The sbatch file submitit writes for ``jobs`` submissions at once (``map_array``): several are one array
    submitted by a copy of the executor with ``map_count`` set; one is a plain job."""
    slurm = executor._executor
    if jobs > 1:
        array = type(slurm)(slurm.folder, slurm.max_num_timeout)
        array.update_parameters(**slurm.parameters)
        array.parameters["map_count"] = jobs
        slurm_for_text = array
    else:
        slurm_for_text = slurm
    return slurm_for_text._make_submission_file_text(slurm._submitit_command_str, "preview")


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
            launcher = instantiate(cfg.hydra.launcher)  # the real SlurmLauncher, parameters resolved
            sweep_dir = str(OmegaConf.to_container(cfg.hydra.sweep, resolve=False)["dir"])
            executor = executor_for(launcher.params)
        except (HydraException, OmegaConfBaseException, ValueError) as e:
            raise ConfigError(one_line(e)) from None
    return Preview(
        preset=preset,
        jobs=len(jobs),
        array_parallelism=int(launcher.params["array_parallelism"]),
        sweep_dir=sweep_dir,
        script=script_for(executor, len(jobs)),
    )
