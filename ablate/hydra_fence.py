"""Every use of Hydra beyond its documented API (``hydra.main``, ``compose`` and ``initialize_config_dir``,
``ConfigStore``, ``HydraConfig``, ``instantiate``, ``HydraException``), in one module, checked against the installed
Hydra at start-up.

- The override parser (``hydra.core.override_parser``), its overrides handed out as plain :class:`Override`
  values: the command line read as Hydra will read it, before Hydra runs: each job of a sweep (the values a sweep
  override expands to), a list given where a config group takes one option, the fixed part of a sweep's command
  line (:mod:`ablate.cli`), a preset's values as a W&B sweep file's (:mod:`ablate.sweep.wandb_file`).
- ``GlobalHydra``: a compose session clears Hydra's global state before and after (:mod:`ablate.compose`).
- ``RunMode``: whether a job is one of a sweep (HydraConfig's ``mode``).
- The experimental ``Callback``: the line a sweep ends with (:mod:`ablate.sweep.report`), on ``on_multirun_end``.

Hydra is imported only when one of these is used: a missing hydra-core is then one line from the command line
(:data:`ablate.cli.COMPOSE_TIME`), not a traceback at import. :func:`check` runs what this module relies on against
the installed Hydra and fails with one line.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

from ablate.errors import MissingAsset
from ablate.versions import incompatible


@dataclass(frozen=True)
class Override:
    """One command-line override as Hydra reads it, in plain values (Hydra's own ``Override`` stays in here)."""

    line: str  # as written: seed=0,1
    key: str  # the key with its prefix (+sweep, ~logger): a later override of the same key replaces it
    name: str  # the key or config group alone (sweep, logger)
    is_sweep: bool  # several values (a sweep, for -m)
    values: tuple[str, ...]  # a sweep's values, a single override's one value, as Hydra writes them back (~key:
    # 'null', ${x} escaped); () for a sweep Hydra does not list (interval, glob)
    items: tuple | None = None  # the elements of a list given as one value (key=[a,b]), else None


def parse(lines: list[str]) -> list[Override]:
    """Each command-line override as Hydra will parse it (raises HydraException)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import ValueType
    from hydra.errors import HydraException

    out = []
    for ov in OverridesParser.create().parse_overrides(lines):
        sweep = ov.is_sweep_override()
        if sweep:
            try:
                values = tuple(ov.sweep_string_iterator())
            except HydraException:  # a sweep kind Hydra does not list (interval, glob): left to Hydra as written
                values = ()
            items = None
        else:
            values = (ov.get_value_element_as_str(),)
            listed = ov.value_type == ValueType.ELEMENT and isinstance(ov.value(), list)
            items = tuple(ov.value()) if listed else None
        out.append(Override(ov.input_line, ov.get_key_element(), ov.key_or_group, sweep, values, items))
    return out


def clear_global_state() -> None:
    from hydra.core.global_hydra import GlobalHydra

    GlobalHydra.instance().clear()


def in_sweep() -> bool:
    """Whether the running Hydra job is one of a sweep (``-m``); raises outside a Hydra run."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    return HydraConfig.get().mode == RunMode.MULTIRUN


def __getattr__(name: str) -> Any:
    if name == "Callback":  # the base of a Hydra callback, imported when a module subclasses it
        from hydra.experimental.callback import Callback

        return Callback
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ------------------------------------------------------------------------------------------ the contract
def problems() -> list[str]:
    """What the installed Hydra does otherwise than this module relies on, one phrase each (empty: compatible)."""
    found = []
    try:
        sweep, added, deleted, listed = parse(["seed=0,1", "+sweep=regimes", "~logger", "ref=[a,b]"])
        if not sweep.is_sweep or sweep.values != ("0", "1") or sweep.line != "seed=0,1":
            found.append("the override parser no longer expands seed=0,1 to 0 and 1")
        if (added.name, added.key, added.values) != ("sweep", "+sweep", ("regimes",)) or added.is_sweep:
            found.append("the override parser no longer reads +sweep=regimes as key sweep (+sweep), value regimes")
        if deleted.name != "logger":
            found.append("the override parser no longer keys ~logger as logger")
        if listed.items != ("a", "b") or listed.is_sweep:
            found.append("the override parser no longer reads ref=[a,b] as one list")
    except Exception as e:  # noqa: BLE001  (an import, an attribute or the parser itself)
        found.append(f"the override parser fails ({type(e).__name__}: {e})")
    try:
        from hydra.core.global_hydra import GlobalHydra
        from hydra.types import RunMode

        if not callable(getattr(GlobalHydra.instance(), "clear", None)) or not hasattr(RunMode, "MULTIRUN"):
            found.append("GlobalHydra.instance().clear or RunMode.MULTIRUN is missing")
    except ImportError as e:
        found.append(f"GlobalHydra or RunMode is missing ({e})")
    try:
        from hydra.experimental.callback import Callback

        if tuple(inspect.signature(Callback.on_multirun_end).parameters)[:2] != ("self", "config"):
            found.append("Callback.on_multirun_end no longer takes (self, config)")
    except (ImportError, AttributeError) as e:
        found.append(f"hydra.experimental.callback.Callback is missing ({e})")
    return found


def check() -> None:
    """Raise :class:`MissingAsset` (one line) when the installed Hydra does otherwise than this fence relies on."""
    found = problems()
    if found:
        raise MissingAsset(incompatible("hydra-core", found))
