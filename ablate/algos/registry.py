"""Training algorithms by name, as ``ablate.refs`` registers reference regimes: each algorithm module registers
how to build its trainer, and the pipeline looks the algorithm up instead of branching on its name.

A builder is called with keywords only, the same set for every algorithm (:data:`BUILD_KEYWORDS`); it takes
the ones it uses. The trainer it returns exposes ``train``, ``save_model``, ``state.global_step``,
``kl_coef``, ``resume_state()`` and ``restore(saved)``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ablate.errors import ConfigError

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
BUILTIN = ("dpo", "grpo", "ppo")


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm."""

    name: str
    build: Callable[..., Any]  # build(**keywords of BUILD_KEYWORDS) -> trainer
    needs_pairs: bool = False  # trains on the preference pairs


ALGORITHMS: dict[str, Algorithm] = {}


def register(name: str, build: Callable[..., Any], *, needs_pairs: bool = False) -> None:
    """Register ``build`` as algorithm ``name`` (one line at the end of each algorithm module)."""
    ALGORITHMS[name] = Algorithm(name, build, needs_pairs)


def algorithm(name: str) -> Algorithm:
    """The registered algorithm ``name``; ConfigError (one line) for an unknown one."""
    _load_builtin()
    try:
        return ALGORITHMS[name]
    except KeyError:
        raise ConfigError(f"unknown algorithm {name!r} (choose from: {', '.join(sorted(ALGORITHMS))})") from None


def _load_builtin() -> None:
    """Import the built-in algorithm modules; each registers itself on import."""
    for name in BUILTIN:
        if name not in ALGORITHMS:
            importlib.import_module(f"ablate.algos.{name}")
