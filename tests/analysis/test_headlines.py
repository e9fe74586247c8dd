"""A report's one-sentence headline (analysis/headlines.py): filled from the report's tables, under the report's
title and in the README's marked blocks, which ``python -m analysis headlines --check`` finds out of date."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from analysis.__main__ import main
from analysis.headlines import fill

ROOT = Path(__file__).resolve().parents[2]
BLOCK = "intro\n<!-- headline reports/x -->\n{}<!-- /headline -->\nafter\n"


def _report(root: Path, end_kl: float) -> Path:
    folder = root / "reports" / "x"
    folder.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(dict(condition=["c"], regime=["none"], end_kl=[end_kl], end_kl_lo=[3.0], end_kl_hi=[5.0])).to_csv(
        folder / "overoptimisation.csv", index=False
    )
    (folder / "headline.md").write_text("none ended at {{oo:none:end_kl:span}} nats.\n")
    return folder


def test_the_readme_block_is_refilled_from_the_tables_and_the_check_sees_it_stale(tmp_path, capsys):
    _report(tmp_path, 4.2)
    readme = tmp_path / "README.md"
    readme.write_text(BLOCK.format("old words\n"))
    assert main(["headlines", "--readme", str(readme), "--check"]) == 1
    assert "README.md's headline of reports/x is out of date" in capsys.readouterr().out
    assert readme.read_text() == BLOCK.format("old words\n")  # --check changes nothing
    assert main(["headlines", "--readme", str(readme)]) == 0
    assert readme.read_text() == BLOCK.format("none ended at 4.2 [3, 5] nats.\n")
    assert main(["headlines", "--readme", str(readme), "--check"]) == 0
    _report(tmp_path, 4.4)  # the table moved: the README's sentence is stale
    assert main(["headlines", "--readme", str(readme), "--check"]) == 1


def test_a_block_without_a_template_or_with_a_bad_placeholder_is_one_line(tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text(BLOCK.format(""))
    assert main(["headlines", "--readme", str(readme)]) == 2
    assert capsys.readouterr().err.strip() == (
        "analysis: error: the README's headline block for reports/x has no reports/x/headline.md"
    )
    (_report(tmp_path, 4.2) / "headline.md").write_text("{{oo:nf4:end_kl:span}}")
    assert main(["headlines", "--readme", str(readme)]) == 2
    assert "no such row" in capsys.readouterr().err
    assert fill("no blocks here\n", tmp_path) == ("no blocks here\n", [])


def test_two_blocks_are_filled_each_from_its_own_report_and_an_unclosed_one_is_refused(tmp_path):
    _report(tmp_path, 4.2)
    other = _report(tmp_path / "o", 7.0)
    (tmp_path / "reports" / "y").symlink_to(other)
    two = BLOCK.format("") + "<!--  headline reports/y -->  \nold\n<!--/headline-->\nend\n"
    text, changed = fill(two, tmp_path)
    assert changed == ["reports/x", "reports/y"]
    assert text == BLOCK.format("none ended at 4.2 [3, 5] nats.\n") + (
        "<!--  headline reports/y -->  \nnone ended at 7 [3, 5] nats.\n<!--/headline-->\nend\n"
    )
    unclosed = "<!-- headline reports/x -->\nold\n" + BLOCK.format("")
    with pytest.raises(ValueError, match="block for reports/x has no <!-- /headline --> before the next"):
        fill(unclosed, tmp_path)
    with pytest.raises(ValueError, match="block for reports/x has no <!-- /headline -->"):
        fill("<!-- headline reports/x -->\nnever closed\n", tmp_path)


def test_the_committed_readmes_headlines_are_its_reports():
    assert main(["headlines", "--readme", str(ROOT / "README.md"), "--check"]) == 0


def test_the_committed_report_carries_its_headline_under_its_title():
    text = (ROOT / "reports" / "drift_calibration" / "report.md").read_text()
    readme = (ROOT / "README.md").read_text()
    sentence = readme.split("<!-- headline reports/drift_calibration -->\n")[1].split("<!-- /headline -->")[0]
    assert text.splitlines()[2] == "**In one sentence.** " + sentence.splitlines()[0]
    assert sentence.strip() in text
