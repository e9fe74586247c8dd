"""Every use of submitit (and of hydra-submitit-launcher's config) beyond a launcher's public API, in one module,
checked against the installed submitit before a job script is rendered.

:mod:`ablate.sweep.slurm_preview` renders the sbatch script a SLURM sweep would submit, without a cluster. submitit
writes that script only from inside an executor that refuses to exist where ``srun`` does not, so the preview
builds what the launcher builds by hand, from submitit's own parts:

- a ``SlurmExecutor`` subclass that exists without ``srun`` and cannot submit (``affinity``, ``_submit_command``);
- an ``AutoExecutor`` around it, with the attributes its constructor sets (``_executor``, ``_deprecated_args`` from
  ``_valid_parameters`` and ``plugins.get_executors``), so that its ``update_parameters`` converts the launcher's
  parameters (``timeout_min`` -> ``time``, ``mem_gb`` -> ``mem``) as it does for the real run;
- the script itself: ``_make_submission_file_text`` of the executor, with ``_submitit_command_str`` (the command
  the job runs) and ``map_count`` (the array size of ``map_array``);
- hydra-submitit-launcher's ``BaseQueueConf``: which of the launcher's parameters are shared by every executor
  (passed as they are) and which are SLURM's own (prefixed ``slurm_``), as ``SlurmLauncher.launch`` splits them;
  and the parameters themselves, as the launcher keeps them (``params``, set by its constructor).

submitit is imported only when one of these is used. :func:`check` renders a small array with the installed
submitit and fails with one line when it renders otherwise than this module relies on.
"""

from __future__ import annotations

from typing import Any

from ablate.errors import MissingAsset, first_line
from ablate.versions import incompatible

CLUSTER = "slurm"


def _render_only_executor():
    """submitit's SlurmExecutor, unchanged except that it exists where ``srun`` does not (its constructor
    refuses otherwise) and cannot submit: rendering is all it is for."""
    from submitit.slurm.slurm import SlurmExecutor

    class RenderOnlySlurmExecutor(SlurmExecutor):
        @classmethod
        def name(cls) -> str:
            return CLUSTER  # the prefix of its parameters (slurm_max_num_timeout), as for SlurmExecutor

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
    auto.cluster = CLUSTER
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


def launcher_params(launcher) -> dict[str, Any]:
    """The parameters an instantiated ``SlurmLauncher`` builds its executor from (its config, resolved)."""
    return launcher.params


def executor_for(params: dict[str, Any]):
    """The executor ``SlurmLauncher.launch`` builds from its parameters (``launcher.params``): the folder and
    ``max_num_timeout`` go to the constructor, the shared parameters (hydra_submitit_launcher's
    ``BaseQueueConf``) to ``update_parameters`` as they are, every other one prefixed ``slurm_``."""
    from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
    from omegaconf import OmegaConf

    specific_init_keys = {"max_num_timeout"}
    init_params = {f"{CLUSTER}_{k}": v for k, v in params.items() if k in specific_init_keys}
    executor = _auto_executor(_render_only_executor(), params["submitit_folder"], **init_params)
    base = set(OmegaConf.structured(BaseQueueConf).keys())
    init_keys = specific_init_keys | {"submitit_folder"}
    executor.update_parameters(
        **{k if k in base else f"{CLUSTER}_{k}": v for k, v in params.items() if k not in init_keys}
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


# ------------------------------------------------------------------------------------------ the contract
#: launcher parameters as hydra-submitit-launcher hands them over, and what submitit must render from them
_PROBE = {
    "submitit_folder": "/nonexistent/ablate-fence/.submitit/%j",
    "timeout_min": 90,
    "mem_gb": 8,
    "cpus_per_task": 2,
    "partition": "gpu",
    "array_parallelism": 2,
    "max_num_timeout": 1,
}
_EXPECTED = {
    "time": "90",
    "mem": "8GB",
    "cpus-per-task": "2",
    "partition": "gpu",
    "array": "0-2%2",  # at most 2 of the 3 jobs at a time
}


LAUNCHER_PLUGIN = "hydra-submitit-launcher"


def problems() -> list[str]:
    """What the installed submitit (and hydra-submitit-launcher) do otherwise than this module relies on, one phrase
    each (empty: compatible)."""
    return [phrase for found in _problems_by_library().values() for phrase in found]


def _problems_by_library() -> dict[str, list[str]]:
    launcher = []
    try:  # the launcher plugin's own parts: its config's shared keys, the parameters it keeps
        from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf  # noqa: F401
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

        if launcher_params(SlurmLauncher(partition="gpu")) != {"partition": "gpu"}:
            launcher.append("SlurmLauncher no longer keeps its parameters as params")
    except Exception as e:  # noqa: BLE001
        launcher.append(f"SlurmLauncher or BaseQueueConf is missing ({type(e).__name__}: {first_line(e)})")
    if launcher:
        return {LAUNCHER_PLUGIN: launcher}
    try:
        executor = executor_for(_PROBE)
        if executor._executor.max_num_timeout != _PROBE["max_num_timeout"]:
            return {"submitit": ["max_num_timeout no longer reaches the SLURM executor's constructor"]}
        script = script_for(executor, 3)
        single = script_for(executor, 1)
    except Exception as e:  # noqa: BLE001  (an import, an attribute, a parameter submitit no longer takes)
        return {"submitit": [f"rendering a job script fails ({type(e).__name__}: {first_line(e)})"]}
    found = []
    flags = dict(
        line[len("#SBATCH --") :].partition("=")[::2] for line in script.splitlines() if line.startswith("#SBATCH --")
    )
    wrong = {k: flags.get(k) for k, v in _EXPECTED.items() if flags.get(k) != v}
    if wrong:
        found.append(f"the launcher's parameters render as {wrong} (expected {_EXPECTED})")
    if "submitit.core._submit" not in script:
        found.append("the job script no longer runs submitit.core._submit")
    if "#SBATCH --array" in single:
        found.append("a single job renders as an array")
    return {"submitit": found} if found else {}


def check() -> None:
    """Raise :class:`MissingAsset` (one line) when the installed submitit or hydra-submitit-launcher does otherwise
    than this fence relies on, naming the one to install."""
    lines = [incompatible(library, found) for library, found in _problems_by_library().items()]
    if lines:
        raise MissingAsset("; ".join(lines))
