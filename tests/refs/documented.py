"""The regime tests' check that a regime documents every figure it reports (``EXTRA_DOCS``)."""

from __future__ import annotations

from ablate.refs import extra_docs
from ablate.tracking.run_dir import SUMMARY_DOCS


def undocumented_extras(ref) -> set[str]:
    """The summary keys (``ref_<name>``) of ``ref``'s numeric cost extras that no document names."""
    keys = {f"ref_{k}" for k, v in ref.cost().extra.items() if isinstance(v, (int, float))}
    return keys - set(extra_docs()) - set(SUMMARY_DOCS)
