"""Where each regime is listed is what its own class declares (``rank``, ``variant_of``, ``audited``), read
through one function, :func:`ablate.refs.regime_names`: the bench's defaults, the audit's defaults, the sweep
presets and the figures' order all read it, and nothing else keeps a list of regimes."""

from __future__ import annotations

import pytest

from ablate.errors import ConfigError
from ablate.refs import REGISTRY, regime_names
from ablate.refs.base import PURPOSES, _declared
from ablate.refs.ema import EmaReference

# the committed reports' order (their tables and the colours of their figures regenerate byte for byte from it)
CANONICAL = [
    "full", "offload", "int8", "nf4", "shared", "cached", "placebo", "topk", "served", "distilled", "ema", "snapshot", "none", "trdpo_soft", "trdpo_hard",
]  # fmt: skip


def test_the_declared_ranks_give_the_reports_order():
    assert regime_names() == regime_names("all") == CANONICAL
    assert sorted(CANONICAL) == sorted(REGISTRY)


def test_variants_are_left_out_of_the_sweeps_and_the_audit_measures_the_audited():
    assert regime_names("sweep") == [r for r in CANONICAL if r not in ("trdpo_soft", "trdpo_hard", "placebo")]
    assert regime_names("audit") == ["full", "int8", "nf4", "topk", "distilled"]  # offload is exact: not audited
    assert {r: REGISTRY[r].variant_of for r in ("trdpo_soft", "trdpo_hard")} == {
        "trdpo_soft": "ema",
        "trdpo_hard": "snapshot",
    }


def test_a_listing_attribute_is_not_inherited():
    """snapshot and trdpo_soft subclass ema: each declares its own place; a subclass that declares none is unranked."""

    class Unranked(EmaReference):
        pass

    assert (_declared(Unranked, "rank", None), _declared(Unranked, "audited", False)) == (None, False)
    assert Unranked.rank == EmaReference.rank  # inherited as an attribute, but not read as the subclass's place


def test_an_unknown_purpose_is_one_line():
    with pytest.raises(ConfigError, match=r"unknown purpose 'sweeps'.*choose from: " + ", ".join(PURPOSES)):
        regime_names("sweeps")


def test_every_default_list_reads_the_registry():
    from ablate.audit.cli import split_regimes
    from ablate.bench.config import all_regimes
    from analysis.figure_style import regime_order

    assert list(regime_order()) == all_regimes() == regime_names("all")
    assert split_regimes(["model=tiny"]) == (regime_names("audit"), ["model=tiny"])
