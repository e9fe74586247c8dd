"""The folder layout stays readable: no module of ablate/ or analysis/ grows past 400 lines."""

from __future__ import annotations

from tests.conftest import REPO

LIMIT = 400


def test_no_module_is_longer_than_the_limit():
    long = {
        str(p.relative_to(REPO)): n
        for top in ("ablate", "analysis")
        for p in (REPO / top).rglob("*.py")
        if (n := len(p.read_text().splitlines())) > LIMIT
    }
    assert not long, f"split these modules (over {LIMIT} lines): {long}"
