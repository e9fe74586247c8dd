"""Training algorithms by name, as ``ablate.refs`` registers reference regimes: each algorithm module registers
how to build its trainer and its config schema (``schema/algo/<name>`` in Hydra's ConfigStore), and the pipeline
looks the algorithm up instead of branching on its name.

An algorithm is one module and one YAML: ``ablate/algos/<name>.py`` ending in :func:`register`, and
``conf/algo/<name>.yaml`` (whose file names the module: every ``conf/algo/<name>.yaml`` with a module
``ablate.algos.<name>`` is imported by :func:`load_all`), or the same pair in a plug-in folder
(:mod:`ablate.plugins`). :func:`algorithm_names` is the one list of them (the ``algos`` sweep preset reads it).

A builder is called with keywords only, the same set for every algorithm (:data:`BUILD_KEYWORDS`); it takes
the ones it uses. The trainer it returns exposes ``train``, ``save_model``, ``state.global_step``,
``kl_coef``, ``resume_state()`` and ``restore(saved)``.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any

from ablate import registries

#: What every builder is given: cfg, policy, tokenizer, pairs, prompts (the train split), reward, proxy
#: (a learned reward or None), reference, callbacks, out_dir, device.
BUILD_KEYWORDS = (
    "cfg",
    "policy",
    "tokenizer",
    "pairs",
    "prompts",
    "reward",
    "proxy",
    "reference",
    "callbacks",
    "out_dir",
    "device",
)


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm."""

    name: str
    build: Callable[..., Any]  # build(**keywords of BUILD_KEYWORDS) -> trainer
    schema: type  # its config schema (the ``algo`` group's), stored as ``schema/algo/<name>``
    needs_pairs: bool = False  # trains on the preference pairs
    rank: int | None = None  # place in lists (the ``algos`` sweep preset); None: after the ranked ones, by name


ALGORITHMS: dict[str, Algorithm] = {}


def register(
    name: str, build: Callable[..., Any], *, schema: type, needs_pairs: bool = False, rank: int | None = None
) -> None:
    """Register ``build`` as algorithm ``name`` and store its config ``schema`` (whose ``name`` default is ``name``)
    as ``schema/algo/<name>`` (one line at the end of each algorithm module)."""
    declared = next((f.default for f in fields(schema) if f.name == "name"), MISSING)
    if declared != name:
        raise TypeError(f"{schema.__name__} must give the algorithm's name {name!r} as the default of its `name` field")
    ALGORITHMS[name] = Algorithm(name, build, schema, needs_pairs, rank)
    registries.store_schema("algo", name, schema)


def algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; ConfigError (one line) for an unknown one."""
    load_all()
    return registries.lookup(ALGORITHMS, name, "algorithm", algorithm_names())


def algorithm_names() -> list[str]:
    """Every algorithm, plug-ins included, by ``rank`` then (the unranked ones) by name."""
    load_all()
    return sorted(ALGORITHMS, key=lambda n: (ALGORITHMS[n].rank is None, ALGORITHMS[n].rank or 0, n))


def load_all() -> None:
    """Import every algorithm module; each registers itself on import: ``ablate.algos.<name>`` for each
    ``conf/algo/<name>.yaml`` that has one (a YAML may also preset another algorithm's settings), then the plug-ins."""
    from ablate.paths import config_dir

    modules = (f"{__package__}.{path.stem}" for path in sorted((config_dir() / "algo").glob("*.yaml")))
    registries.import_modules(m for m in modules if importlib.util.find_spec(m) is not None)
