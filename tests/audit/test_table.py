"""The audit's table and files (ablate.audit.table): NaN is n/a in the table, null in strict JSON with its reason, an
empty cell in the CSV."""

from __future__ import annotations

import csv
import json
import math

from ablate.audit.measure import FIGURES
from ablate.audit.table import render, report, write


def _row(regime: str, value: float, **over) -> dict:
    return {"regime": regime, **dict.fromkeys(FIGURES, value), "nan_reasons": {}, **over}


def _strict(text: str):
    def refuse(token):
        raise ValueError(f"non-standard JSON token {token}")

    return json.loads(text, parse_constant=refuse)


def test_nan_is_na_in_the_table_null_in_json_and_empty_in_csv(tmp_path):
    why = dict.fromkeys(FIGURES, "ref=none trains without a reference")
    rows = [_row("full", 0.5), _row("none", math.nan, nan_reasons=why)]
    text = report("python -m ablate.audit ref=full,none", {"online_algo": "grpo"}, rows)
    table = render(rows, "grpo").splitlines()
    assert table[0].startswith("| regime") and "grpo grad cos" in table[0]
    assert table[3].startswith("| none") and table[3].count("n/a") == len(FIGURES) - 1  # cache_bytes is not shown
    assert "ref=none trains without a reference" in text
    write(tmp_path, "cmd", {"online_algo": "grpo"}, rows, text)
    data = _strict((tmp_path / "audit.json").read_text())
    assert data["command"] == "cmd" and data["regimes"][1]["margin_err_mean"] is None
    assert data["regimes"][1]["nan_reasons"]["margin_err_mean"] == "ref=none trains without a reference"
    with (tmp_path / "audit.csv").open() as f:
        csv_rows = list(csv.DictReader(f))
    assert csv_rows[0]["setup_s"] == "0.5" and csv_rows[1]["setup_s"] == ""
    assert (tmp_path / "audit.md").read_text() == text
