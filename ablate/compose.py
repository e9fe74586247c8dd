"""The Hydra side of the configuration: the schemas of :mod:`ablate.config` stored in Hydra's ConfigStore, and
composing a config the way ``python -m ablate`` does outside a Hydra run (the CLI's preflight, the bench and
the tests all compose here).

:func:`compose_raw` is what Hydra hands a job (untyped, ``+key`` additions included); :func:`compose` turns it
into the typed objects of :mod:`ablate.config`, refusing keys no schema defines and setting ``out_dir``, whose
default ``${hydra:runtime.output_dir}`` resolves only inside a Hydra run.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import fields, is_dataclass
from typing import Any

from ablate import config as C
from ablate.errors import CFG_HINT, ConfigError
from ablate.paths import config_dir

CONFIG_NAME = "config"
_session = {"open": False}  # whether a hydra_session is open in this process (nested ones reuse it)

# each group's option schemas, stored as schema/<group>/<the schema's name default>; reference regimes, algorithms,
# tasks and judges store their own (their registries' register) and one schema serves every logger option
OPTION_SCHEMAS = {
    "model": (C.SmolLM2ModelConfig, C.TinyModelConfig, C.HFModelConfig),
}


def default_name(schema: type) -> str:
    """The option name a schema declares: its ``name`` field's default."""
    return next(f.default for f in fields(schema) if f.name == "name")


def register_configs() -> None:
    """Store every schema in Hydra's ConfigStore (idempotent), the plug-ins' options (``ABLATE_PLUGINS``), the
    sweep presets and the resolvers."""
    from hydra.core.config_store import ConfigStore

    import ablate.refs  # noqa: F401  (each regime module registers schema/ref/<name>)
    from ablate import plugins
    from ablate.algos.registry import load_all
    from ablate.lists import register_resolvers
    from ablate.presets import register_presets
    from ablate.tasks.judge_registry import load_all as load_judges
    from ablate.tasks.task_registry import load_all as load_tasks
    from ablate.workers import register_resolver

    load_all()  # each algorithm module registers schema/algo/<name>
    load_judges()  # each judge module registers schema/judge/<name> or schema/safety/<name>
    load_tasks()  # each task module registers schema/task/<name>
    plugins.store_options()

    cs = ConfigStore.instance()
    cs.store(name="schema", node=C.Config)
    for group, schemas in OPTION_SCHEMAS.items():
        for schema in schemas:
            cs.store(group=f"schema/{group}", name=default_name(schema), node=schema)
    cs.store(group="schema/logger", name="logger", node=C.LoggerConfig)
    register_presets()
    register_resolver()
    register_resolvers()


@contextmanager
def hydra_session() -> Iterator[None]:
    """Hydra initialised on ``conf/``, every schema registered, for the duration; Hydra's global state is
    cleared before and after. Inside an open session, compose calls reuse it (one initialisation for many)."""
    from hydra import initialize_config_dir

    from ablate.hydra_fence import clear_global_state

    if _session["open"]:
        yield
        return
    register_configs()
    clear_global_state()
    _session["open"] = True
    try:
        with initialize_config_dir(config_dir=str(config_dir()), version_base="1.3", job_name="ablate"):
            yield
    finally:
        _session["open"] = False
        clear_global_state()


def compose_raw(*overrides: str, config_name: str = CONFIG_NAME, hydra: bool = False):
    """The composed config before it is typed (a DictConfig, interpolations unresolved); with ``hydra`` also
    Hydra's own node (launcher, sweep folders)."""
    from hydra import compose as hydra_compose

    with hydra_session():
        return hydra_compose(config_name=config_name, overrides=list(overrides), return_hydra_config=hydra)


def compose(*overrides: str, out_dir: str | os.PathLike = ".", config_name: str = CONFIG_NAME) -> Any:
    """The typed config objects for ``python -m ablate <overrides>``: every schema's ``__post_init__`` checks
    ran, a key no schema defines is refused (ConfigError), ``out_dir`` is set (when the config has one).
    Checks that span groups are :func:`ablate.validation.validate`'s."""
    from omegaconf import OmegaConf

    raw = compose_raw(*overrides, config_name=config_name)
    refuse_unknown_keys(raw)
    if "out_dir" in raw:
        raw.out_dir = str(out_dir)
    return OmegaConf.to_object(raw)


def unknown_keys(node, prefix: str = "") -> dict[str, list[str]]:
    """The dotted keys of a composed config that its schema does not define (Hydra's ``+key=value`` and a
    ``_global_`` preset add such keys unchecked), each with the keys its schema does define there. Reads the
    nodes without resolving interpolations."""
    from omegaconf import DictConfig, OmegaConf

    schema = OmegaConf.get_type(node)
    known = [f.name for f in fields(schema)] if is_dataclass(schema) else None
    found: dict[str, list[str]] = {}
    for key in node.keys():
        if known is not None and key not in known:
            found[f"{prefix}{key}"] = known
            continue
        if OmegaConf.is_missing(node, key) or OmegaConf.is_interpolation(node, key):
            continue  # nothing of its own to check (an interpolation's target is checked where it lives)
        child = node[key]
        if isinstance(child, DictConfig):
            found.update(unknown_keys(child, f"{prefix}{key}."))
    return found


def refuse_unknown_keys(raw) -> None:
    """Raise ConfigError for the first key of a composed config that no schema defines (``+algo.betta=0.3``
    composes without complaint: Hydra's ``+`` adds keys unchecked), with the closest key the schema has."""
    unknown = unknown_keys(raw)
    if not unknown:
        return
    key, known = next(iter(unknown.items()))
    parent, _, leaf = key.rpartition(".")
    close = difflib.get_close_matches(leaf, known, n=1)
    hint = f" (did you mean {parent + '.' if parent else ''}{close[0]}?)" if close else ""
    raise ConfigError(f"unknown key {key!r}{hint}; keys the schema lacks are refused, with or without '+': {CFG_HINT}")
