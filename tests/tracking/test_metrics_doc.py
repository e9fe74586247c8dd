"""docs/metrics.md is generated from the metric schema: the committed page is the generator's output, so a metric
added, renamed or reworded in ``ablate/tracking/schema.py`` (or a regime's ``EXTRA_DOCS``) without
``python -m ablate.metrics_doc --write`` fails here."""

from __future__ import annotations

from ablate import metrics_doc
from ablate.refs import extra_docs
from ablate.tracking import schema
from ablate.tracking.schema import Metric


def test_the_committed_page_is_the_generators_output():
    assert metrics_doc.PAGE.read_text() == metrics_doc.render(), (
        "docs/metrics.md is out of date: python -m ablate.metrics_doc --write"
    )
    assert metrics_doc.main(["--check"]) == 0


def test_every_key_and_regime_figure_is_on_the_page():
    page = metrics_doc.render()
    for key in [*schema.docs(), *extra_docs()]:
        assert f"| `{key}`" in page, key


def test_a_new_metric_makes_the_committed_page_stale(capsys):
    new = Metric("reward_gain", "eval/reward_gain", "VADER compound", "higher", "a metric added to the schema")
    with schema.registered(new):
        assert "| `reward_gain` | `eval/reward_gain` |" in metrics_doc.render()
        assert metrics_doc.main(["--check"]) == 1
    assert "--write" in capsys.readouterr().err
