"""Judges by group and name, as ``ablate.refs`` registers regimes and ``ablate.algos.registry`` algorithms: the gold
reward (``judge=<name>``) and the safety judge (``safety=<name>``). A judge's module registers its schema (stored as
``schema/<group>/<name>``), how to build it and, for one that loads something, its one-line check before any model
loads; the command line's choices and :func:`ablate.tasks.judges.make_judge` / ``make_safety`` read it. Plug-ins
outside the package register the same way (``ABLATE_PLUGINS``: :mod:`ablate.plugins`).

A builder is called as ``build(cfg, *, device, cache_root)`` for a gold reward and ``build(cfg, *, threshold,
device, cache_root)`` for a safety judge (``task.unsafe_threshold``); it returns an object that scores responses
with their prompts (one float each) and has an ``ID`` for cache keys (:mod:`ablate.tasks.judges`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablate import registries

GROUPS = ("judge", "safety")
BUILTIN = ("ablate.tasks.judges",)  # the modules that register the built-in judges


@dataclass(frozen=True)
class Judge:
    """One registered judge."""

    group: str  # judge | safety
    name: str
    schema: type
    build: Callable[..., Any]
    check: Callable[[Any], None] | None = None  # check(the group's config): ConfigError (one line) before loading


JUDGES: dict[tuple[str, str], Judge] = {}


def register(group: str, name: str, schema: type, build: Callable[..., Any], check=None) -> None:
    """Register a judge of ``group`` (judge | safety) as ``name``; its schema goes to Hydra's ConfigStore."""
    if group not in GROUPS:
        raise ValueError(f"a judge's group is one of {GROUPS}, got {group!r}")
    JUDGES[(group, name)] = Judge(group, name, schema, build, check)
    registries.store_schema(group, name, schema)


def load_all() -> None:
    """Import the modules that register the built-in judges, and the plug-ins."""
    registries.import_modules(BUILTIN)


def judge(group: str, name: str) -> Judge:
    """The registered judge ``name`` of ``group``; ConfigError (one line) for an unknown one."""
    load_all()
    return registries.lookup(JUDGES, (group, name), group, sorted(n for g, n in JUDGES if g == group))
