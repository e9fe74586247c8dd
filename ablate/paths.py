"""Where configs and caches live, wherever and however ablate is installed."""

from __future__ import annotations

import os
from pathlib import Path

_PKG = Path(__file__).resolve().parent


def config_dir() -> Path:
    """The Hydra config folder: $ABLATE_CONF, else the copy inside a wheel, else the repo's `conf/`."""
    env = os.environ.get("ABLATE_CONF")
    candidates = [Path(env)] if env else []
    candidates += [_PKG / "conf", _PKG.parent / "conf"]
    for c in candidates:
        if (c / "config.yaml").is_file():
            return c
    raise FileNotFoundError(f"ablate: no config folder found (looked in {', '.join(map(str, candidates))})")


def sweeps_dir() -> Path:
    """The sweep presets: $ABLATE_SWEEPS, else the copy inside a wheel, else the repo's `sweeps/`."""
    env = os.environ.get("ABLATE_SWEEPS")
    for c in ([Path(env)] if env else []) + [_PKG / "sweeps", _PKG.parent / "sweeps"]:
        if c.is_dir():
            return c
    return _PKG.parent / "sweeps"


def cache_root() -> Path:
    """Root of every content-addressed cache: $ABLATE_CACHE, else the user's cache dir."""
    env = os.environ.get("ABLATE_CACHE")
    if env:
        return Path(env).expanduser()
    from platformdirs import user_cache_dir

    return Path(user_cache_dir("ablate"))
