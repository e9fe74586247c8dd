"""Reference regimes: every algorithm asks a :class:`Reference` for reference log-probs.

A regime is one module here that defines its config schema and a ``Reference`` subclass,
decorated with :func:`register`, plus one ``conf/ref/<name>.yaml``. Importing this package
imports every module in it, so every regime is registered. Where a regime is listed (tables, figures, sweep
presets, the bench's and the audit's defaults) is what its class declares (``rank``, ``variant_of``,
``audited``), read through :func:`regime_names`. Regimes outside the package (one module and one YAML in a
folder of your own) are imported from the folders ``ABLATE_PLUGINS`` names (:mod:`ablate.plugins`).
"""

from __future__ import annotations

import importlib
import pkgutil

from ablate.refs.base import REGISTRY, RefCost, Reference, TokenBatch, regime_class, regime_names, register

for _m in pkgutil.iter_modules(__path__):
    if _m.name != "base" and not _m.name.startswith("_"):
        importlib.import_module(f"{__name__}.{_m.name}")

__all__ = ["REGISTRY", "Reference", "RefCost", "TokenBatch", "extra_docs", "register", "regime_class", "regime_names"]


def extra_docs() -> dict[str, str]:
    """Summary key (``ref_<name>``) -> meaning, for every registered regime's own figures (``EXTRA_DOCS``)."""
    return {f"ref_{k}": v for cls in REGISTRY.values() for k, v in cls.EXTRA_DOCS.items()}


def _load_plugins() -> None:
    """The plug-in regimes (``ABLATE_PLUGINS``, :mod:`ablate.plugins`), after the built-in ones."""
    from ablate import plugins

    plugins.load()


_load_plugins()
