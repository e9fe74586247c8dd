"""``python -m ablate``: the Hydra app.

Before Hydra launches anything, every job the command line describes (each point of a ``-m``
sweep) is composed and validated, and the packages and assets it needs are checked, so bad
input gets one clear line and exit code 2 before any model loads.
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import os
import sys

from ablate.errors import AblateError, ConfigError, MissingAsset, first_line, one_line, parse_error, sweep_hint
from ablate.paths import config_dir
from ablate.versions import required

# package (import name) -> (pip install argument, why it is needed); the versions are ablate.versions'
REQUIRED = {
    **required("torch", "torch", "everything"),
    **required("transformers", "transformers", "models"),
    **required("trl", "trl", "DPO/GRPO trainers"),
    **required("vaderSentiment", "vaderSentiment", "the gold reward"),
    **required("profanity_check", "alt-profanity-check", "the safety judge"),
    **required("gguf", "gguf", "reading SmolLM2's GGUF file"),
}
# imported while composing, before check_packages can look (a missing one is named, not traced)
COMPOSE_TIME = {
    **required("hydra", "hydra-core", "the command line"),
    **required("omegaconf", "hydra-core", "configs"),
    **required("huggingface_hub", "transformers", "models"),
}

_friendly = one_line  # the name ablate.bench imports


def _is_flag(arg: str) -> bool:
    return arg.startswith("-")


def _job_overrides(argv: list[str]) -> list[list[str]]:
    """The override list of every job the command line describes (sweeps expanded), as Hydra's basic
    sweeper builds them: a ``+sweep=`` preset's grid first, the command line after it (it wins on a key)."""
    from ablate import hydra_fence, presets

    args = [a for a in argv if not _is_flag(a)]
    # drop the values of flags that take one (e.g. --config-name x, -cn x, --cfg job)
    for flag in (
        "--config-name",
        "-cn",
        "--config-path",
        "-cp",
        "--cfg",
        "-c",
        "--package",
        "-p",
        "--info",
        "--config-dir",
        "-cd",
        "--experimental-rerun",
    ):
        if flag in argv:
            i = argv.index(flag)
            if i + 1 < len(argv) and argv[i + 1] in args:
                args.remove(argv[i + 1])
    args = [a for a in args if not a.lstrip("+~").startswith("hydra")]
    multirun = "-m" in argv or "--multirun" in argv
    params = [f"{k}={v}" for k, v in presets.grid(presets.selected(args)).items()] if multirun else []
    choices: dict[str, list[str]] = {}
    for ov in hydra_fence.parse(params + args):
        _check_shape(ov, multirun)
        if multirun and ov.is_sweep:  # a sweep kind not expanded here (no values) is left to Hydra as written
            choices[ov.key] = [f"{ov.key}={v}" for v in ov.values] or [ov.line]
        else:
            choices[ov.key] = [ov.line]
    return [list(c) for c in itertools.product(*choices.values())] if choices else [[]]


def config_groups() -> list[str]:
    """The config groups a job picks one option of (``conf/<group>/``)."""
    return sorted(p.name for p in config_dir().iterdir() if p.is_dir() and p.name != "hydra")


def _check_shape(ov, multirun: bool) -> None:
    """One job takes one option per config group and one value per key: several values are a sweep (``-m``).
    A list for a list-valued key (``model.adapter.target_modules=[q_proj,v_proj]``) is left to the schema."""
    key = ov.name
    group = key in config_groups()
    values = ov.line.partition("=")[2]
    if ov.is_sweep and not multirun:
        also = "" if group else f" (for a list-valued key: {key}=[{values}])"
        raise ConfigError(sweep_hint(key, values, group) + also)
    if group and ov.items is not None and len(ov.items) > 1:
        raise ConfigError(sweep_hint(key, ",".join(str(v) for v in ov.items), group))


def _launcher_check(argv: list[str]) -> None:
    """The launcher overrides compose (a misspelt ``hydra.launcher.*`` key, a missing required value): one
    line, before anything runs."""
    from omegaconf import OmegaConf

    from ablate.compose import compose_raw

    hydra_args = [a for a in argv if not _is_flag(a) and a.lstrip("+~").startswith("hydra")]
    if not hydra_args:
        return
    cfg = compose_raw(*hydra_args, hydra=True)
    missing = sorted(OmegaConf.missing_keys(cfg.hydra.launcher))
    if missing:
        launcher = cfg.hydra.runtime.choices.get("hydra/launcher")
        raise ConfigError(
            f"hydra.launcher.{missing[0]} is required with hydra/launcher={launcher}: "
            f"add hydra.launcher.{missing[0]}=..."
        )


def _sweep_primary_check(argv: list[str]) -> None:
    """A sweep's command line composes on its own: Hydra first composes it without the sweep's lists (the preset's
    grid included) and fails there, in many lines, on a key that only a grid's choice has (``algo.reward_model.*``
    while the grid says ``algo=grpo``). One line instead, naming the choices to repeat on the command line."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate import hydra_fence, presets
    from ablate.compose import compose_raw

    if "-m" not in argv and "--multirun" not in argv:
        return
    args = [a for a in argv if not _is_flag(a) and not a.lstrip("+~").startswith("hydra")]
    fixed = [o.line for o in hydra_fence.parse(args) if not o.is_sweep]
    try:
        compose_raw(*fixed)
    except (HydraException, OmegaConfBaseException, ValueError) as e:
        given = {a.split("=", 1)[0].lstrip("+~") for a in args}
        choices = [f"{k}={v}" for k, v in presets.grid(presets.selected(args)).items()
                   if "." not in k and "," not in v and k not in given]  # fmt: skip
        hint = (
            f" (the sweep's grid chooses {' '.join(choices)} for each job, after the command line is composed: add it there too)"
            if choices
            else ""
        )
        raise ConfigError(f"{one_line(e)}{hint}") from None


def check_packages(cfg) -> None:
    """Raise MissingAsset naming the package and the install command."""
    need = dict(REQUIRED)
    if cfg.logger.name == "wandb":
        need.update(required("wandb", "wandb", "logger=wandb (or use logger=none)"))
    if cfg.model.adapter.enabled:
        need.update(required("peft", "peft", "model.adapter.enabled=true"))
    from ablate.refs import regime_class

    need.update(regime_class(cfg.ref.name).required_packages)
    for mod, (pip_name, why) in need.items():
        if importlib.util.find_spec(mod) is None:
            raise MissingAsset(f"missing package {mod!r} (needed for {why}); install it with: pip install {pip_name}")
    if cfg.model.name in ("smollm2", "tiny"):
        from ablate.models.smollm2 import gguf_path

        gguf_path()


def check_job(overrides: list[str]) -> None:
    """Compose one job and run every check that needs no model: schema, unknown keys, ranges, combinations,
    packages, device, model source."""
    from ablate.compose import compose

    check_config(compose(*overrides))


def check_config(cfg) -> None:
    """Every check a composed job gets before any model loads (the CLI's and the bench's): validation and
    settings resolved in place, packages, device and model source."""
    from ablate.models.loading import check_source
    from ablate.validation import validate

    validate(cfg)
    check_packages(cfg)
    check_source(cfg.model)
    check_task(cfg)


def check_task(cfg) -> None:
    """The task's data and the judges, read and checked before any model loads: ``task=dataset``'s file (every
    row; :mod:`ablate.tasks.dataset`), a model judge's folder (:func:`ablate.tasks.judges.check`)."""
    from ablate.tasks import judges, task_registry

    check = task_registry.task(cfg.task.name).check
    if check is not None:
        check(cfg)
    judges.check(cfg)


def preflight(argv: list[str]) -> int:
    """Compose and validate every job; returns the number of jobs. Raises AblateError (one line). Leaves
    Hydra's global state as it found it: cleared."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from ablate.compose import hydra_session, register_configs

    register_configs()
    try:
        jobs = _job_overrides(argv)
    except HydraException as e:
        raise ConfigError(parse_error(e)) from None
    with hydra_session():
        try:
            _launcher_check(argv)
            _sweep_primary_check(argv)
        except (HydraException, OmegaConfBaseException, ValueError) as e:
            raise ConfigError(one_line(e)) from None
        for overrides in jobs:
            where = f" (job: {' '.join(overrides)})" if len(jobs) > 1 else ""
            try:
                check_job(overrides)
            except AblateError as e:
                raise type(e)(f"{e}{where}") from None
            except (HydraException, OmegaConfBaseException, ValueError) as e:
                raise ConfigError(f"{one_line(e)}{where}") from None
    from ablate import hydra_fence
    from ablate.algos import trl_fence

    hydra_fence.check()  # an incompatible Hydra or TRL fails here, in one line, not mid-run
    trl_fence.check()
    return len(jobs)


def missing_package(e: ModuleNotFoundError) -> MissingAsset | None:
    """The one-line error for a package that an import needed while composing (None: not a known package)."""
    name = (e.name or "").split(".")[0]
    known = {**REQUIRED, **COMPOSE_TIME}
    if name not in known:
        return None
    pip_name, why = known[name]
    return MissingAsset(f"missing package {name!r} (needed for {why}); install it with: pip install {pip_name}")


def process_overrides(argv: list[str]) -> list[str]:
    """Hydra overrides that make the processes of a job launched on several (``accelerate launch``, ``torchrun``)
    one run: rank 0's run folder for all of them (unless ``hydra.run.dir`` is given: its timestamp could differ
    between processes), and no Hydra files, log file or progress bars from the others (rank 0 writes and logs)."""
    from ablate import distributed

    if "-m" in argv or "--multirun" in argv:
        raise ConfigError(
            f"a sweep (-m) cannot run inside a job launched on {distributed.world_size()} processes: launch each job "
            "with accelerate launch, or sweep with a hydra/launcher (e.g. hydra/launcher=slurm)"
        )
    out = []
    if not any(a.startswith("hydra.run.dir=") for a in argv):
        from ablate.compose import compose_raw

        run_dir = str(compose_raw(hydra=True).hydra.run.dir) if distributed.is_main() else None
        out.append(f"hydra.run.dir={distributed.broadcast(run_dir)}")
    if not distributed.is_main():
        os.environ["TQDM_DISABLE"] = "1"
        out += ["hydra.output_subdir=null", "hydra/job_logging=stdout"]
    return out


def _error_exit(message: str) -> None:
    print(f"ablate: error: {message}", file=sys.stderr)
    sys.exit(2)


def _hydra_main() -> None:
    import hydra
    from omegaconf import DictConfig

    from ablate.compose import CONFIG_NAME

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name=CONFIG_NAME)
    def _app(cfg: DictConfig) -> dict:
        """One job. In a sweep a failing job is recorded (summary.json, W&B run marked failed) and the
        sweep goes on; a single run shows the traceback."""
        from ablate import distributed
        from ablate.hydra_fence import in_sweep
        from ablate.run import run_job
        from ablate.runtime import tune_allocator

        tune_allocator()  # also in launcher worker processes
        sweeping = in_sweep()
        processes = distributed.world_size()
        if not distributed.is_main():
            logging.getLogger().setLevel(logging.WARNING)  # rank 0 says what each evaluation found, once
        try:
            summary = run_job(cfg)
        except Exception as e:
            if isinstance(e, AblateError) and not sweeping and processes == 1:
                _error_exit(f"{e} ({cfg.out_dir})")  # found once models loaded (the wrong reference): one line
            if processes > 1:  # one line per process; the launcher stops the others and reports its own
                where = f"process {distributed.rank()} of {processes}"
                if "Connection reset by peer" in str(e) or "Connection closed by peer" in str(e):
                    e = RuntimeError("another process of this job stopped (its connection closed)")
                print(
                    f"ablate: failed ({where}): {cfg.out_dir}: {type(e).__name__}: {first_line(e)}; rerun the same "
                    "command to resume from its last checkpoint",
                    file=sys.stderr,
                    flush=True,
                )
                sys.exit(1)
            if not sweeping:
                raise
            print(f"ablate: failed: {cfg.out_dir}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return {"status": "failed"}
        if distributed.is_main():
            print(f"ablate: {summary['status']}: {cfg.out_dir}/summary.json", flush=True)
        if not sweeping and summary["status"] != "finished":
            from ablate.status import OUTCOME

            OUTCOME["not_finished"] = 1
        return summary

    _app()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    for noisy in ("bitsandbytes", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    argv = sys.argv[1:]
    informational = any(a in argv for a in ("--help", "-h", "--hydra-help", "--info", "--cfg", "-c", "--version"))
    if any(a in argv for a in ("-m", "--multirun")) and any(a in argv for a in ("--cfg", "-c", "--info")):
        _error_exit(  # Hydra refuses the pair with a traceback
            "--cfg and --info show one job: drop -m and name the job (python -m ablate +sweep=<preset> ref=int8 "
            "--cfg job); `python -m ablate.sweep list` shows each preset's grid"
        )
    if not informational:
        try:
            preflight(argv)
        except AblateError as e:
            _error_exit(str(e))
        except ModuleNotFoundError as e:
            missing = missing_package(e)
            if missing is None:  # not a package a user installs: a bug, shown as one
                raise
            _error_exit(str(missing))
    from ablate.runtime import tune_allocator

    tune_allocator()
    from ablate.compose import register_configs

    register_configs()
    from ablate import distributed

    if distributed.world_size() > 1:
        try:
            sys.argv += process_overrides(argv)
        except AblateError as e:
            _error_exit(str(e))
    _hydra_main()
    distributed.close()
    from ablate.status import OUTCOME

    if OUTCOME["not_finished"]:  # a sweep's jobs that did not finish, or a single run that diverged
        sys.exit(1)


if __name__ == "__main__":
    main()
