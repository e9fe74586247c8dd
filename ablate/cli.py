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

from ablate.errors import AblateError, ConfigError, MissingAsset
from ablate.paths import config_dir

CONFIG_NAME = "config"

# package (import name) -> (pip name, why it is needed)
REQUIRED = {
    "torch": ("torch==2.13.0", "everything"),
    "transformers": ("transformers==5.24.0", "models"),
    "trl": ("trl==1.16.0", "DPO/GRPO trainers"),
    "vaderSentiment": ("vaderSentiment==3.3.2", "the gold reward"),
    "profanity_check": ("alt-profanity-check==1.9.1", "the safety judge"),
    "gguf": ("gguf", "reading SmolLM2's GGUF file"),
}


def _is_flag(arg: str) -> bool:
    return arg.startswith("-")


def _job_overrides(argv: list[str]) -> list[list[str]]:
    """The override list of every job the command line describes (sweeps expanded), as Hydra's basic
    sweeper builds them: a ``+sweep=`` preset's grid first, the command line after it (it wins on a key)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from ablate.sweep import presets

    args = [a for a in argv if not _is_flag(a)]
    # drop the values of flags that take one (e.g. --config-name x, -cn x, --cfg job)
    for flag in ("--config-name", "-cn", "--config-path", "-cp", "--cfg", "-c", "--package", "-p",
                 "--info", "--config-dir", "-cd", "--experimental-rerun"):
        if flag in argv:
            i = argv.index(flag)
            if i + 1 < len(argv) and argv[i + 1] in args:
                args.remove(argv[i + 1])
    args = [a for a in args if not a.lstrip("+~").startswith("hydra")]
    multirun = "-m" in argv or "--multirun" in argv
    params = [f"{k}={v}" for k, v in presets.grid(presets.selected(args)).items()] if multirun else []
    choices: dict[str, list[str]] = {}
    for ov in OverridesParser.create().parse_overrides(params + args):
        key = ov.get_key_element()
        if multirun and ov.is_sweep_override():
            try:
                values = list(ov.sweep_string_iterator())
            except Exception:  # a sweep kind we cannot expand here: left to Hydra as written
                values = []
            choices[key] = [f"{key}={v}" for v in values] or [ov.input_line]
        else:
            choices[key] = [ov.input_line]
    return [list(c) for c in itertools.product(*choices.values())] if choices else [[]]


def _launcher_check(argv: list[str]) -> None:
    """The launcher overrides compose (a misspelt ``hydra.launcher.*`` key, a missing required value): one
    line, before anything runs."""
    from hydra import compose
    from omegaconf import OmegaConf

    hydra_args = [a for a in argv if not _is_flag(a) and a.lstrip("+~").startswith("hydra")]
    if not hydra_args:
        return
    cfg = compose(config_name=CONFIG_NAME, overrides=hydra_args, return_hydra_config=True)
    missing = sorted(OmegaConf.missing_keys(cfg.hydra.launcher))
    if missing:
        launcher = cfg.hydra.runtime.choices.get("hydra/launcher")
        raise ConfigError(f"hydra.launcher.{missing[0]} is required with hydra/launcher={launcher}: "
                          f"add hydra.launcher.{missing[0]}=...")


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    msg = lines[0] if lines else type(e).__name__
    full_key = next((ln for ln in lines if ln.startswith("full_key:")), None)
    if full_key and full_key.split(":", 1)[1].strip() not in msg:
        msg = f"{full_key.split(':', 1)[1].strip()}: {msg}"
    return msg


def _friendly(e: BaseException) -> str:
    """One line from a Hydra/OmegaConf composition error."""
    import re

    text = str(e)
    cause = e.__cause__ or e.__context__
    if cause is not None:
        text += "\n" + str(cause)
    m = re.search(r"Could not find '([^/']+)/([^']+)'", text)
    if m:
        group, value = m.groups()
        options = sorted(p.stem for p in (config_dir() / group).glob("*.yaml"))
        return f"unknown {group} {value!r} (choose from: {', '.join(options)})"
    m = re.search(r"Could not override '([^']+)'", text)
    if m and "No match in the defaults list" in text:
        return f"unknown config group {m.group(1)!r}; groups are: model, task, algo, ref, logger"
    m = re.search(r"Key '([^']+)' (?:is )?not in", text)
    if m:
        key = re.search(r"full_key: (\S+)", text) or re.search(r"Could not override '([^']+)'", text)
        return (f"unknown key {key.group(1) if key else m.group(1)!r}; check the spelling, or list the keys with "
                f"`python -m ablate --cfg job`")
    m = re.search(r"Value '([^']*)' (?:of type '\w+' )?could not be converted to (\w+)", text)
    if m:
        key = re.search(r"full_key: (\S+)", text) or re.search(r"override (\S+?)=", text)
        return f"{key.group(1) if key else 'a value'}: {m.group(1)!r} is not a valid {m.group(2)}"
    m = re.search(r"Invalid value '([^']*)', expected one of \[([^\]]*)\]", text)
    if m:
        key = re.search(r"full_key: (\S+)", text) or re.search(r"override (\S+?)=", text)
        return f"{key.group(1) if key else 'a value'}: {m.group(1)!r} is not one of {m.group(2)}"
    if "missing mandatory value" in text.lower():
        key = re.search(r"full_key: (\S+)", text)
        return f"{key.group(1) if key else 'a required value'} is required: set it on the command line ({key.group(1) if key else 'key'}=...)"
    return _first_line(e)


def check_packages(cfg) -> None:
    """Raise MissingAsset naming the package and the install command."""
    need = dict(REQUIRED)
    if cfg.logger.name == "wandb":
        need["wandb"] = ("wandb==0.31.0", "logger=wandb (or use logger=none)")
    if cfg.model.adapter.enabled:
        need["peft"] = ("peft==0.21.2", "model.adapter.enabled=true")
    from ablate.refs import regime_class

    need.update(getattr(regime_class(cfg.ref.name), "required_packages", {}))
    for mod, (pip_name, why) in need.items():
        if importlib.util.find_spec(mod) is None:
            raise MissingAsset(f"missing package {mod!r} (needed for {why}); install it with: pip install {pip_name}")
    if cfg.model.name in ("smollm2", "tiny"):
        from ablate.models.smollm2 import gguf_path

        gguf_path()


def preflight(argv: list[str]) -> int:
    """Compose and validate every job; returns the number of jobs. Raises AblateError (one line)."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    from ablate.config import register_configs, validate

    register_configs()
    try:
        jobs = _job_overrides(argv)
    except HydraException as e:
        raise ConfigError(f"cannot parse the command line: {_first_line(e)}") from None
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="ablate"):
        try:
            _launcher_check(argv)
        except (HydraException, OmegaConfBaseException, ValueError) as e:
            raise ConfigError(_friendly(e)) from None
        for overrides in jobs:
            where = f" (job: {' '.join(overrides)})" if len(jobs) > 1 else ""
            try:
                raw = compose(config_name=CONFIG_NAME, overrides=overrides)
                raw.out_dir = "."  # the hydra:runtime interpolation does not resolve outside a run
                cfg = OmegaConf.to_object(raw)
                validate(cfg)
                check_packages(cfg)
            except AblateError as e:
                raise type(e)(f"{e}{where}") from None
            except (HydraException, OmegaConfBaseException, ValueError) as e:
                raise ConfigError(f"{_friendly(e)}{where}") from None
    GlobalHydra.instance().clear()
    return len(jobs)


def _hydra_main() -> None:
    import hydra
    from omegaconf import DictConfig

    @hydra.main(version_base="1.3", config_path=str(config_dir()), config_name=CONFIG_NAME)
    def _app(cfg: DictConfig) -> dict:
        """One job. In a sweep a failing job is recorded (summary.json, W&B run marked failed) and the
        sweep goes on; a single run shows the traceback."""
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        from ablate.run import run_job
        from ablate.runtime import tune_allocator

        tune_allocator()  # also in launcher worker processes
        sweeping = HydraConfig.get().mode == RunMode.MULTIRUN
        try:
            summary = run_job(cfg)
        except Exception as e:
            if not sweeping:
                raise
            print(f"ablate: failed: {cfg.out_dir}: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            return {"status": "failed"}
        print(f"ablate: {summary['status']}: {cfg.out_dir}/summary.json", flush=True)
        if not sweeping and summary["status"] != "finished":
            from ablate.sweep.report import OUTCOME

            OUTCOME["not_finished"] = 1
        return summary

    _app()


def main() -> None:
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    for noisy in ("bitsandbytes", "httpx", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    from ablate.runtime import tune_allocator

    tune_allocator()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    argv = sys.argv[1:]
    informational = any(a in argv for a in ("--help", "-h", "--hydra-help", "--info", "--cfg", "-c", "--version"))
    if not informational:
        try:
            preflight(argv)
        except AblateError as e:
            print(f"ablate: error: {e}", file=sys.stderr)
            sys.exit(2)
    from ablate.config import register_configs

    register_configs()
    _hydra_main()
    from ablate.sweep.report import OUTCOME

    if OUTCOME["not_finished"]:  # a sweep's jobs that did not finish, or a single run that diverged
        sys.exit(1)


if __name__ == "__main__":
    main()
