"""A report's notes with placeholders filled from its tables (analysis/notes.py), and the literal-number check
the recheck runs on them (analysis/notes_check.py), on small real CSV files."""

import pandas as pd
import pytest

from analysis.notes import NotesError, render
from analysis.notes_check import literals, matches, unsupported


@pytest.fixture
def folder(tmp_path):
    eq = pd.DataFrame(
        dict(
            condition=["c1", "c1", "c2", "c1"],
            regime=["int8", "int8", "int8", "topk"],
            metric=["kl_true", "length", "kl_true", "kl_true"],
            diff=[0.0912, -4.8, 0.2, 0.0],
            lo=[-0.08, -8.3, 0.1, 0.0],
            hi=[0.25, -1.3, 0.3, 0.0],
            lo_inner=[-0.05, -7.5, 0.12, 0.0],
            hi_inner=[0.22, -2.1, 0.28, 0.0],
            margin=[0.19, 2.8, 0.19, 0.19],
            verdict=["inconclusive", "different", "different", "determinism check"],
            p_holm=[0.5, 0.04, 0.01, float("nan")],
            seed_diffs=["0:0.1;1:0.0824", "0:-4;1:-5.6", "", ""],
        )
    )
    eq.to_csv(tmp_path / "equivalence.csv", index=False)
    pd.DataFrame(
        dict(condition=["c1"], regime=["full"], length_mean=[28.0], length_lo=[25.0], length_hi=[31.0])
    ).to_csv(tmp_path / "summary.csv", index=False)
    pd.DataFrame(
        dict(condition=["c1"], regime=["none"], end_gold=[-0.12], end_gold_lo=[-0.2], end_gold_hi=[-0.04], n_seeds=[3])
    ).to_csv(tmp_path / "overoptimisation.csv", index=False)
    return tmp_path


def test_placeholders_are_filled_from_the_tables(folder):
    text = (
        "int8 {{eq:int8:kl_true:span@c1}} (90% {{eq:int8:kl_true:inner@c1}}), seed 1 {{eq:int8:kl_true:seed=1@c1}}, "
        "{{eq:int8:length:verdict@c1}}, {{eq:int8:kl_true:diff@c1|+.2f}}; full {{summary:full:length:span}}; "
        "{{count:all}} verdicts, {{count:different}} different, {{count:all@c1}} in c1, "
        "{{count:determinism check}} check; none {{oo:none:end_gold:span}}, {{oo:none:end_gold:value|+.1f}}, "
        "{{oo:none:end_gold:hi}}."
    )
    assert render(text, folder) == (
        "int8 0.0912 [-0.08, 0.25] (90% 0.0912 [-0.05, 0.22]), seed 1 0.0824, different, +0.09; full 28 [25, 31]; "
        "3 verdicts, 2 different, 2 in c1, 1 check; none -0.12 [-0.2, -0.04], -0.1, -0.04."
    )


def test_a_count_that_opens_a_line_does_not_start_a_list(folder):
    """``...collapsed in 0 of\n{{n}}. Then ...`` with n = 1 would render as a numbered list item; it is escaped,
    and only where a placeholder opens the line (a list the notes write themselves stays a list)."""
    text = "seeds: {{oo:none:n_seeds:value|.0f}} of\n{{oo:none:n_seeds:value|.0f}}. Then\n1. a list item"
    (folder / "overoptimisation.csv").write_text("condition,regime,n_seeds\nc1,none,1\n")
    assert render(text, folder) == "seeds: 1 of\n1\\. Then\n1. a list item"


@pytest.mark.parametrize(
    "spec,why",
    [
        ("{{eq:int8:kl_true:span}}", "2 rows, one per condition: name one with @condition (c1, c2)"),
        ("{{eq:nf4:kl_true:span@c1}}", "no such row"),
        ("{{eq:int8:kl_true:nope@c1}}", "the row has no 'nope'"),
        ("{{eq:int8:span}}", "eq takes regime:metric:field"),
        ("{{oo:none:span}}", "oo takes regime:column:field"),
        ("{{oo:none:end_kl:span}}", "the row has no 'end_kl'"),
        ("{{bench:int8:ms}}", "no table 'bench'"),
        ("{{primary:full:reward_delta:span}}", "reads primary.csv, which this report does not have"),
        ("{{eq:int8:kl_true:seed=7@c1}}", "no seed 7 in the row"),
        ("{{eq:int8:kl_true:\nspan@c1}}", "line 1: a placeholder left open (one must not span lines)"),
    ],
)
def test_a_placeholder_the_tables_cannot_fill_is_one_clear_error(folder, spec, why):
    with pytest.raises(NotesError, match="^notes: ") as e:
        render(f"a {spec} b", folder)
    assert why in str(e.value) and "\n" not in str(e.value)


def test_literals_leave_out_placeholders_code_links_and_words():
    text = "SmolLM2-135M moved 0.106 [-0.04, 2.5e-03] by 47% and 1,102 ms; `beta 0.1` {{eq:a:b:diff}} [x](r/0.5.md) k1"
    assert literals(text) == ["0.106", "0.04", "2.5e-03", "47%", "1,102"]


def test_a_literal_matches_a_cell_at_its_own_digits():
    values = pd.Series([0.10554, 4.30265, 0.4721, 1102.4, 0.00248]).to_numpy()
    assert matches("0.106", values) and matches("4.30", values) and matches("47%", values)
    assert matches("1,102", values) and matches("2.5e-03", values)
    assert not matches("0.107", values) and not matches("4.31", values) and not matches("48%", values)


def test_unsupported_lists_the_numbers_no_cell_holds(folder):
    text = "int8's true KL 0.0912 [-0.08, 0.25], seed 1 0.0824, margin 19%; but 0.333 and 12 seeds; 3 of 4."
    assert unsupported(text, folder) == ["0.333", "12"]
