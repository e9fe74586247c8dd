"""Named sweep presets: each ``sweeps/<name>.yaml`` is a Hydra config (package ``_global_``) in the group
``sweep``, holding its grid in ``hydra.sweeper.params`` and, optionally, fixed settings and a sweep folder.

    python -m ablate -m +sweep=regimes                 # one preset
    python -m ablate -m +sweep=[regimes,seeds]         # two combined: their grids multiply
    python -m ablate -m +sweep=regimes model=tiny      # plus any override; command-line sweeps win
"""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from ablate.paths import sweeps_dir

GROUP = "sweep"


def preset_files() -> dict[str, Path]:
    return {p.stem: p for p in sorted(sweeps_dir().glob("*.yaml"))}


def parents(node: DictConfig) -> list[str]:
    """The presets a preset extends: the plain names in its ``defaults`` list (``- drift_calibration``, a preset
    of the same group, which Hydra composes before it; ``override /ref: ema`` entries choose a group instead)."""
    return [str(d) for d in node.get("defaults") or [] if isinstance(d, str) and d != "_self_"]


def load(name: str, _within: tuple[str, ...] = ()) -> DictConfig:
    """A preset's settings and grid as Hydra composes them: the presets it extends (:func:`parents`) first, then its
    own, which win (``_self_`` last); the grid keeps the order of first appearance, as Hydra's merge does. Its
    ``defaults`` are its own only (a parent's ``override /group: x`` entries are Hydra's to apply, not read here)."""
    from ablate.errors import ConfigError

    files = preset_files()
    if name not in files:
        raise ConfigError(f"unknown sweep {name!r} (choose from: {', '.join(files)})")
    if name in _within:
        raise ConfigError(f"sweep {name!r} extends itself: {' -> '.join((*_within, name))}")
    from ablate.lists import register_resolvers

    register_resolvers()  # a grid may read the registries' lists (ablate.lists)
    node = OmegaConf.load(files[name])
    names = parents(node)
    if not names:
        return node
    defaults = list(node.defaults)
    if "_self_" in defaults and defaults.index("_self_") != len(defaults) - 1:
        raise ConfigError(f"sweep {name!r}: put _self_ last in its defaults (its own settings win)")
    merged = OmegaConf.merge(*(load(n, (*_within, name)) for n in names), node)
    assert isinstance(merged, DictConfig)
    return merged


def register_presets() -> None:
    """Store every preset in Hydra's ConfigStore as ``sweep/<name>`` (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for name, path in preset_files().items():
        cs.store(group=GROUP, name=name, node=OmegaConf.load(path), package="_global_")


def grid(names: list[str]) -> dict[str, str]:
    """The presets' ``hydra.sweeper.params`` merged in order (a later preset wins on a shared key)."""
    params: dict[str, str] = {}
    for name in names:
        node = OmegaConf.select(load(name), "hydra.sweeper.params") or {}
        params.update({str(k): str(v) for k, v in node.items()})
    return params


def fixed_overrides(name: str) -> list[str]:
    """A preset's fixed settings (everything but ``hydra`` and ``defaults``) as dotted overrides."""
    node = OmegaConf.to_container(load(name), resolve=False)
    out: list[str] = []

    def walk(prefix: str, value) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            out.append(f"{prefix}={value}")

    for key, value in node.items():
        if key not in ("hydra", "defaults"):
            walk(key, value)
    return out


def selected(args: list[str]) -> list[str]:
    """The preset names a command line selects with ``+sweep=name`` or ``+sweep=[a,b]``."""
    for a in args:
        key, _, value = a.partition("=")
        if key.lstrip("+~") == GROUP and value:
            value = value.strip()
            if value.startswith("[") and value.endswith("]"):
                return [v.strip() for v in value[1:-1].split(",") if v.strip()]
            return [value]
    return []
