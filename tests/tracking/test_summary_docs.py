"""Every key a summary.json holds is documented: the metric schema's and the job's own in ``SUMMARY_DOCS``, a
regime's own figures (``ref_<name>``) on its class (``ablate.refs.extra_docs``), step-0 copies by rule. No model
runs here: the committed reports' runs cover every regime but trdpo_hard under DPO and GRPO (the regime tests in
tests/refs check each regime's own figures on a live object)."""

from __future__ import annotations

import json

from ablate.refs import extra_docs
from ablate.tracking import schema
from ablate.tracking.run_dir import SUMMARY_DOCS
from tests.conftest import REPO


def documented() -> set[str]:
    return set(SUMMARY_DOCS) | set(extra_docs()) | {f"{k}_step0" for k in schema.step0_keys()}


def undocumented(summary: dict) -> set[str]:
    return set(summary) - documented() | {f"nan_reasons.{k}" for k in summary.get("nan_reasons", {})} - {
        f"nan_reasons.{k}" for k in documented()
    }


def test_every_key_of_the_committed_runs_summaries_is_documented():
    paths = sorted(REPO.glob("reports/*/runs/*/*/summary.json"))
    assert len(paths) >= 50
    found = {p.parent.name: undocumented(json.loads(p.read_text())) for p in paths}
    assert not {k: v for k, v in found.items() if v}
    assert undocumented({"status": "finished", "ref_made_up": 1.0, "nan_reasons": {"made_up": "?"}}) == {
        "ref_made_up",
        "nan_reasons.made_up",
    }


def test_a_key_means_one_thing_wherever_it_is_documented():
    regimes = extra_docs()
    assert not set(regimes) & set(SUMMARY_DOCS)  # a regime's figure never shadows a metric or a job key
    assert all(len(v) > 10 for v in {**SUMMARY_DOCS, **regimes}.values())  # a sentence, not a placeholder
