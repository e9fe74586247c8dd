"""Tasks by name, as ``ablate.refs`` registers regimes and :mod:`ablate.tasks.judge_registry` judges: where a run's
prompts (and, for a task made of data, its preference pairs) come from. A task's module registers its schema (stored
as ``schema/task/<name>``), how to read its inputs and, for one that reads something, its one-line check before any
model loads; the command line's choices, :class:`ablate.inputs.RunInputs` and the CLI's preflight read it. Plug-ins
outside the package register the same way (``ABLATE_PLUGINS``: :mod:`ablate.plugins`).

``load(cfg, tokenizer)`` returns :class:`TaskInputs`: the prompts by split (``train``, ``eval``, ``test``), the text
the policy's perplexity is measured on, and, for a task read from data, its :class:`ablate.tasks.dataset.TaskData`
(whose pairs DPO trains on; without them DPO samples and judges its pairs from the train prompts).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablate import registries

BUILTIN = ("ablate.tasks.prompts", "ablate.tasks.dataset")  # the modules that register the built-in tasks


@dataclass
class TaskInputs:
    """What a task gives a run before any model loads."""

    prompts: dict[str, list[str]]  # "train", "eval", "test"
    heldout: list[str]  # the text the policy's perplexity is measured on
    data: Any = None  # a task read from data: its TaskData (pairs, sizes, provenance); None for a generated task


@dataclass(frozen=True)
class Task:
    """One registered task."""

    name: str
    schema: type
    load: Callable[[Any, Any], TaskInputs]  # load(cfg, tokenizer)
    check: Callable[[Any], None] | None = None  # check(cfg): ConfigError (one line) before any model loads
    is_data: bool = False  # the task is a user's file already (python -m ablate.export refuses it)


TASKS: dict[str, Task] = {}


def register(name: str, schema: type, load: Callable[[Any, Any], TaskInputs], check=None, is_data: bool = False):
    """Register the task ``name``; its schema goes to Hydra's ConfigStore as ``schema/task/<name>``."""
    TASKS[name] = Task(name, schema, load, check, is_data)
    registries.store_schema("task", name, schema)


def load_all() -> None:
    """Import the modules that register the built-in tasks, and the plug-ins."""
    registries.import_modules(BUILTIN)


def task(name: str) -> Task:
    """The registered task ``name``; ConfigError (one line) for an unknown one."""
    load_all()
    return registries.lookup(TASKS, name, "task", sorted(TASKS))
