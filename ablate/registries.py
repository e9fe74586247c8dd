"""What every registry of ablate shares (regimes, algorithms, tasks, judges): each entry's config schema stored in
Hydra's ConfigStore as ``schema/<group>/<name>``, the built-in modules imported with the plug-ins (each registers
itself on import), and a lookup whose failure is one line that names the choices."""

from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

from ablate.errors import ConfigError

V = TypeVar("V")


def store_schema(group: str, name: str, schema: type) -> None:
    """``schema`` as the config node of option ``name`` of ``group`` (``schema/<group>/<name>``)."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(group=f"schema/{group}", name=name, node=schema)


def import_modules(modules: Iterable[str]) -> None:
    """Import ``modules`` (a registry's built-ins), then the plug-ins (:mod:`ablate.plugins`)."""
    from ablate import plugins

    for module in modules:
        importlib.import_module(module)
    plugins.load()


def lookup(table: Mapping[Any, V], key: Any, what: str, choices: Iterable[str]) -> V:
    """``table[key]``; for a key it lacks, ConfigError: ``unknown <what> '<key>' (choose from: ...)``."""
    try:
        return table[key]
    except KeyError:
        name = key[-1] if isinstance(key, tuple) else key
        raise ConfigError(f"unknown {what} {name!r} (choose from: {', '.join(choices)})") from None
