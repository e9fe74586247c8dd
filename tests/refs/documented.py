"""The regime tests' check that a regime documents every figure it reports (``EXTRA_DOCS``)."""

from __future__ import annotations

from tests.tracking.test_summary_docs import documented


def undocumented_extras(ref) -> set[str]:
    """The summary keys (``ref_<name>``) of ``ref``'s numeric cost extras that no document names."""
    return {f"ref_{k}" for k, v in ref.cost().extra.items() if isinstance(v, (int, float))} - documented()
