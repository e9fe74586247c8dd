"""Plug-ins outside the package: a reference regime, an algorithm, a task or a judge as one module and one YAML in a
folder of your own, named by the environment variable ``ABLATE_PLUGINS`` (docs/extending.md).

``ABLATE_PLUGINS`` lists folders or importable module names, separated by ``os.pathsep`` (``:`` on Linux and macOS).
Every module of a folder (``*.py``, but ``_*.py``) is imported, under its file's name; a module name is imported
as it is. A module registers what it defines on import (``ablate.refs.register``, ``ablate.algos.registry.register``).
Every ``<name>.yaml`` beside the modules (in the folder, or in the module's own folder) becomes the option ``name`` of
the group whose schema of that name a module registered: ``ref=<name>``, ``algo=<name>``, ``task=<name>``, ... (:func:`store_options`).

Loading happens wherever the registries are read (importing ``ablate.refs``; ``ablate.algos.registry.load_all``),
so a plug-in shows up everywhere a built-in does: the command line, the sweep presets, the bench, the audit and the
figures. Worker processes inherit the variable and load the same plug-ins.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from pathlib import Path

from ablate.errors import ConfigError, one_line

ENV = "ABLATE_PLUGINS"
GROUPS = ("ref", "algo", "task", "judge", "safety")  # the groups a plug-in YAML can add an option to
_loaded: dict[str, list[Path]] = {}  # entry -> the YAML files beside its modules (an entry is loaded once)


def entries() -> list[str]:
    """The folders and module names ``ABLATE_PLUGINS`` lists, in order."""
    return [e.strip() for e in os.environ.get(ENV, "").split(os.pathsep) if e.strip()]


def load() -> list[Path]:
    """Import every plug-in ``ABLATE_PLUGINS`` names that is not imported yet; returns the YAML files of every
    plug-in loaded so far. A folder or module that cannot be found or imported is one line (ConfigError)."""
    for entry in entries():
        if entry not in _loaded:
            _loaded[entry] = []  # marked first: a plug-in that reads a registry while it loads does not reload it
            _loaded[entry] = _load_entry(entry)
    return [y for yamls in _loaded.values() for y in yamls]


def _load_entry(entry: str) -> list[Path]:
    folder = Path(entry).expanduser()
    if folder.is_dir():
        for path in sorted(folder.glob("*.py")):
            if not path.name.startswith("_"):
                _import_file(path)
        return sorted(folder.glob("*.yaml"))
    if "/" in entry or os.sep in entry or entry.endswith(".py"):
        raise ConfigError(
            f"{ENV}: no such folder {entry!r} (give folders or module names, separated by {os.pathsep!r})"
        )
    try:
        module = importlib.import_module(entry)
    except ModuleNotFoundError as e:
        if e.name and entry.startswith(e.name):
            raise ConfigError(f"{ENV}: no such folder or module {entry!r}") from None
        raise ConfigError(f"{ENV}: plug-in {entry!r} failed to import: {one_line(e)}") from e
    except Exception as e:
        raise ConfigError(f"{ENV}: plug-in {entry!r} failed to import: {type(e).__name__}: {one_line(e)}") from e
    return sorted(Path(module.__file__).parent.glob("*.yaml")) if getattr(module, "__file__", None) else []


def _import_file(path: Path) -> None:
    """Import ``path`` as the module named by its file (kept in ``sys.modules``: pickles of its classes resolve)."""
    name = path.stem
    known = sys.modules.get(name)
    if known is not None:
        if Path(getattr(known, "__file__", "") or "").resolve() == path.resolve():
            return
        raise ConfigError(f"{ENV}: plug-in module {path} is named {name!r}, as an installed module is: rename the file")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise ConfigError(f"{ENV}: plug-in {path} failed to import: {type(e).__name__}: {one_line(e)}") from e


def store_options() -> None:
    """Store each plug-in YAML in Hydra's ConfigStore as the option of its name, in the group (``ref``, ``algo``, ``task``,
    ``judge``, ``safety``) whose schema of that name a plug-in module registered."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    cs = ConfigStore.instance()
    for path in load():
        groups = [g for g in GROUPS if f"{path.stem}.yaml" in cs.list(f"schema/{g}")]
        if not groups:
            raise ConfigError(
                f"{ENV}: {path} names no regime, algorithm, task or judge: register one named {path.stem!r} in a module "
                "beside it"
            )
        cs.store(group=groups[0], name=path.stem, node=OmegaConf.load(path))
