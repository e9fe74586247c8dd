"""The metric schema is the one source: the evaluator, the summary, ``ablate.status``, the report and
docs/metrics.md agree with it, and a metric added to it reaches all of them."""

from __future__ import annotations

import math
import re

import torch

from ablate.tracking import schema
from ablate.tracking.schema import Column, Metric
from tests.conftest import REPO
from tests.eval.test_evaluator import evaluator  # noqa: F401  (the tiny evaluator fixture)

# a derived metric (from two the evaluator emits), and one whose input is NaN on a run trained on gold
GAIN = Metric(
    "reward_gain",
    "eval/reward_gain",
    "VADER compound",
    "higher",
    "gold reward of the policy's responses minus the SFT model's",
    step0=True,
    status=Column("gain", 7, "{:.3f}"),
    inputs=("eval/reward_gold", "eval/reward_gold_sft"),
    derive=lambda policy, sft: policy - sft,
)
PROXY_GAP = Metric(
    "reward_proxy_gap",
    "eval/reward_proxy_gap",
    "VADER compound",
    None,
    "gold minus proxy reward of the policy's responses",
    inputs=("eval/reward_gold", "eval/reward_proxy"),
    derive=lambda gold, proxy: gold - proxy,
)


def test_the_schema_reproduces_the_summary_layout():
    from ablate.run import STEP0_KEYS, SUMMARY_FROM_METRICS
    from ablate.tracking.run_dir import SUMMARY_DOCS, SUMMARY_KEYS
    from analysis.report import FIDELITY

    assert STEP0_KEYS == (
        "reward_delta",
        "kl_true",
        "kl_approx",
        "kl_abs_err",
        "logp_mae",
        "logp_rmse",
        "logp_max_err",
        "margin_err_mean",
        "margin_err_sd",
        "margin_err_max",
        "dpo_loss",
        "kl_penalty_err_mean",
        "kl_penalty_err_sd",
        "grad_cos",
        "truncation_rate",
    )
    assert list(SUMMARY_FROM_METRICS)[:3] == ["win_rate", "win_rate_lo", "win_rate_hi"]
    assert all(v.startswith(("eval/", "kl/")) for v in SUMMARY_FROM_METRICS.values())
    assert set(SUMMARY_KEYS) <= set(SUMMARY_DOCS) and schema.FINAL == ("finished", "diverged")
    for m in schema.METRICS:
        assert m.meaning and (m.key or m.logged) and m.direction in ("higher", "lower", None), m
    assert [h for _, h, _ in FIDELITY][:2] == ["stand-in error, step 0", "stand-in error, end"]


def _summary_rows() -> str:
    """The rows of the ``summary.json`` table in the committed docs/metrics.md (generated from the schema)."""
    text = (REPO / "docs" / "metrics.md").read_text()
    table = text.split("## `summary.json`", 1)[1].split("\n## ", 1)[0]
    rows = [ln for ln in table.splitlines() if ln.startswith("| `")]
    assert rows, "docs/metrics.md has no summary.json table"
    return "\n".join(rows)


def test_the_metrics_page_names_every_summary_key_and_no_other():
    named = {t for t in re.findall(r"`([^`]+)`", _summary_rows()) if re.fullmatch(r"[a-z][a-z0-9_]*", t)}
    keys = {m.key for m in schema.summary_metrics()}
    assert keys <= named, f"summary keys docs/metrics.md does not name: {sorted(keys - named)}"
    annotations = {"nan_reasons", "reason", *schema.STATUSES}  # the summary's words that are not metrics
    logged = {m.logged for m in schema.METRICS if m.logged}
    unknown = named - keys - annotations - logged - {f"{k}_step0" for k in schema.step0_keys()}
    assert not unknown, f"docs/metrics.md names summary keys the schema lacks: {sorted(unknown)}"
    assert {f"{k}_step0" for k in schema.step0_keys()} <= named


def test_a_derived_metric_is_nan_with_its_inputs_reason():
    m = {"eval/reward_gold": 0.5, "eval/reward_proxy": math.nan, "eval/reward_gold_sft": 0.25}
    with schema.registered(GAIN, PROXY_GAP):
        out = schema.complete(m)
        reasons = schema.derived_reasons({"reward_proxy": "trained on gold"})
    assert out["eval/reward_gain"] == 0.25 and math.isnan(out["eval/reward_proxy_gap"])
    assert reasons["reward_proxy_gap"] == "trained on gold"
    assert "eval/reward_gain" not in schema.complete(m)  # gone with the block


def _write_run(folder, res, reference) -> dict:
    """A run folder holding one evaluation, as ``run_job`` writes it: config and summary."""
    from ablate.run import JobState, build_summary, cost_metrics
    from ablate.tracking.run_dir import to_python

    state = JobState(steps=1, first_eval=res, last_eval=res)
    folder.write_config({"ref": {"name": "full"}, "algo": {"name": "dpo"}, "model": {"name": "tiny"}, "seed": 0})
    extra = {"regime": "full", "algo": "dpo", "model": "tiny", "seed": 0}
    summary = build_summary(state, cost_metrics(reference, 1), 1.0, extra)
    folder.write_summary({k: to_python(v) for k, v in summary.items()})
    return folder.read_summary()  # strict JSON: NaN comes back from null


def test_the_evaluator_emits_the_schema_and_a_new_entry_reaches_summary_status_report(
    evaluator,  # noqa: F811
    tiny_source,
    ref_ctx,
    tmp_path,
    capsys,
):
    """One tiny evaluation: it emits exactly the schema's evaluation metrics; a derived metric registered in the
    schema then lands in summary.json (through ``build_summary``, as a run writes it), in ``ablate.status``'s
    table and in the report's summary.csv."""
    import pandas as pd

    from ablate.models.loading import load_model
    from ablate.refs.full import FullRefConfig, FullReference
    from ablate.status import main as status
    from ablate.tracking.run_dir import RunFolder
    from analysis.load import load_runs
    from analysis.report import write_report

    reference = FullReference(FullRefConfig(), ref_ctx)
    res = evaluator.evaluate(load_model(tiny_source, torch.device("cpu")), reference, 0)
    declared = {m.logged for m in schema.METRICS if m.derive is None and m.logged}
    assert set(res.metrics) == {n for n in declared if n.startswith(schema.EVAL_SECTIONS)}
    assert set(res.nan_reasons) <= {m.key for m in schema.summary_metrics()}

    sweep = tmp_path / "sweep"
    with schema.registered(GAIN, PROXY_GAP):
        s = _write_run(RunFolder(sweep / "job"), res, reference)
        capsys.readouterr()
        assert status([str(sweep)]) == 0
        write_report(load_runs(sweep), tmp_path / "report", "test", "tiny")
    assert s["reward_gain"] == res.metrics["eval/reward_gold"] - res.metrics["eval/reward_gold_sft"]
    assert s["reward_gain_step0"] == s["reward_gain"]
    assert math.isnan(s["reward_proxy_gap"]) and "gold reward" in s["nan_reasons"]["reward_proxy_gap"]
    header, line = capsys.readouterr().out.splitlines()[:2]
    assert "gain" in header.split() and f"{s['reward_gain']:.3f}" in line.split()
    csv = pd.read_csv(tmp_path / "report" / "summary.csv")
    assert csv["reward_gain_mean"].iloc[0] == s["reward_gain"]
    assert csv["reward_gain_step0_mean"].iloc[0] == s["reward_gain"]
