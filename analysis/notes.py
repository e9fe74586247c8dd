"""A report's ``notes.md`` with its numbers read from the report's own tables, so that a sentence cannot disagree
with the table it cites. A placeholder is ``{{table:key:...:field}}``, optionally ``@condition`` (needed where the
table has several) and ``|format`` (a Python format spec; the report's own number format without one):

- ``{{eq:int8:kl_true:span}}``: ``equivalence.csv``, the row of regime ``int8`` and metric ``kl_true``; ``span`` is
  ``diff [lo, hi]`` (95%), ``inner`` ``diff [lo_inner, hi_inner]`` (90%), ``seed=2`` seed 2's own difference; any
  other field is the column (``diff``, ``lo``, ``margin``, ``verdict``, ``p_holm``, ``regime_mean`` ...);
- ``{{cond:algo.beta=0.3:reward_delta:span}}``: ``conditions.csv`` (the baseline across conditions), the same fields;
- ``{{primary:full:reward_delta:span}}``: ``primary.csv``, a regime's own value (``estimate``, ``lo``, ``hi``);
- ``{{summary:full:length:mean}}``: ``summary.csv``, the column ``length_mean`` (``span``: mean [lo, hi]);
- ``{{oo:none:end_gold:span}}``: ``overoptimisation.csv``, regime ``none``'s ``end_gold [end_gold_lo, end_gold_hi]``
  (``value``: the column itself; any other field, the column ``<column>_<field>``);
- ``{{cmp:int8:kl_true:p_holm}}``: ``comparisons.csv``, the seed-level paired t-tests;
- a ``span`` (or ``inner``) whose row has no interval (one seed) is the value alone, as the report's tables print it;
- ``{{count:equivalent}}``: how many verdicts say so (``all``: every verdict; determinism checks are not verdicts,
  ``{{count:determinism check}}`` counts them).

A line that opens with a placeholder whose value reads as a list marker (``1. Its ...``) has the marker escaped
(``1\\. Its ...``): it renders as the text, not as a numbered list.

A placeholder that names no row, or a field the row lacks, or one split across lines, stops the report with one
line.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from analysis.markdown import bracket, num

PLACEHOLDER = re.compile(r"\{\{([^{}]+)\}\}")
TABLES = {
    "eq": "equivalence.csv",
    "cond": "conditions.csv",
    "primary": "primary.csv",
    "summary": "summary.csv",
    "cmp": "comparisons.csv",
    "oo": "overoptimisation.csv",
}
# the columns of a table's row besides condition: which key names which
_KEYS = {"summary": ("regime",)}
_DEFAULT_KEYS = ("regime", "metric")
DETERMINISM = "determinism check"


class NotesError(ValueError):
    """A placeholder the report's tables cannot fill."""


def render(text: str, folder: Path) -> str:
    """``text`` with every placeholder replaced by its value from the tables in ``folder``."""
    tables: dict[str, pd.DataFrame] = {}

    def table(name: str) -> pd.DataFrame:
        if name not in tables:
            path = folder / TABLES[name]
            if not path.is_file():
                raise NotesError(f"notes: {{{{{name}:...}}}} reads {TABLES[name]}, which this report does not have")
            tables[name] = pd.read_csv(path, keep_default_na=False, na_values=[""])
        return tables[name]

    lines = []
    for i, line in enumerate(text.split("\n"), 1):
        filled = PLACEHOLDER.sub(lambda m: value(m.group(1), table), line)
        if "{{" in filled or "}}" in filled:
            raise NotesError(f"notes: line {i}: a placeholder left open (one must not span lines): {line.strip()}")
        if line.startswith("{{"):  # a count that opens a line ("1. Its ...") would start a Markdown list
            filled = _LIST_ITEM.sub(r"\1\\\2", filled)
        lines.append(filled)
    return "\n".join(lines)


_LIST_ITEM = re.compile(r"^(\d{1,9})([.)])(?=\s|$)")


def value(spec: str, table) -> str:
    """One placeholder's text (see the module)."""
    body, _, fmt = spec.partition("|")
    body, _, condition = body.partition("@")
    name, *parts = body.split(":")
    name = name.strip()
    if name == "count":
        return _count(parts, condition, table("eq"), spec)
    if name not in TABLES:
        raise NotesError(f"notes: {{{{{spec}}}}}: no table {name!r} (one of {', '.join([*TABLES, 'count'])})")
    keys = _KEYS.get(name, _DEFAULT_KEYS)
    if name in ("summary", "oo"):
        if len(parts) != 3:
            raise NotesError(
                f"notes: {{{{{spec}}}}}: {name} takes regime:{'metric' if name == 'summary' else 'column'}:field"
            )
        regime, metric, field = parts
        row = _row(table(name), dict(regime=regime), condition, spec)
        mean = metric + "_mean" if name == "summary" else metric
        if field == "span":
            return _span(_f(row, mean, spec), _f(row, metric + "_lo", spec), _f(row, metric + "_hi", spec), fmt)
        return _format(row, metric if (name, field) == ("oo", "value") else f"{metric}_{field}", fmt, spec)
    if len(parts) != len(keys) + 1:
        raise NotesError(f"notes: {{{{{spec}}}}}: {name} takes {':'.join(keys)}:field")
    row = _row(table(name), dict(zip(keys, parts[:-1])), condition, spec)
    field = parts[-1]
    mean = "estimate" if name == "primary" else "diff_mean" if name == "cmp" else "diff"
    lo, hi = ("diff_lo", "diff_hi") if name == "cmp" else ("lo", "hi")
    if field == "span":
        return _span(_f(row, mean, spec), _f(row, lo, spec), _f(row, hi, spec), fmt)
    if field == "inner":
        return _span(_f(row, mean, spec), _f(row, "lo_inner", spec), _f(row, "hi_inner", spec), fmt)
    if field.startswith("seed="):
        seeds = dict(item.split(":") for item in str(row.get("seed_diffs") or "").split(";") if item)
        if field[5:] not in seeds:
            raise NotesError(f"notes: {{{{{spec}}}}}: no seed {field[5:]} in the row (seeds {sorted(seeds)})")
        return _num(float(seeds[field[5:]]), fmt)
    return _format(row, field, fmt, spec)


def _row(frame: pd.DataFrame, keys: dict, condition: str, spec: str) -> pd.Series:
    hit = frame
    for k, v in keys.items():
        hit = hit[hit[k].astype(str) == v.strip()]
    if condition:
        hit = hit[hit["condition"].astype(str) == condition.strip()]
    if len(hit) == 1:
        return hit.iloc[0]
    if not len(hit):
        raise NotesError(f"notes: {{{{{spec}}}}}: no such row")
    raise NotesError(
        f"notes: {{{{{spec}}}}}: {len(hit)} rows, one per condition: name one with @condition "
        f"({', '.join(map(str, hit['condition'].drop_duplicates()))})"
    )


def _count(parts: list, condition: str, eq: pd.DataFrame, spec: str) -> str:
    if len(parts) != 1:
        raise NotesError(f"notes: {{{{{spec}}}}}: count takes one verdict (or all)")
    rows = eq[eq["condition"].astype(str) == condition.strip()] if condition else eq
    verdict = parts[0].strip()
    if verdict == "all":
        return str(int((rows["verdict"] != DETERMINISM).sum()))
    return str(int((rows["verdict"] == verdict).sum()))


def _f(row: pd.Series, field: str, spec: str) -> float:
    if field not in row.index:
        raise NotesError(f"notes: {{{{{spec}}}}}: the row has no {field!r}")
    return float(row[field])


def _format(row: pd.Series, field: str, fmt: str, spec: str) -> str:
    if field not in row.index:
        raise NotesError(f"notes: {{{{{spec}}}}}: the row has no {field!r}")
    v = row[field]
    if isinstance(v, str):
        return v
    return _num(float(v), fmt)


def _num(x: float, fmt: str) -> str:
    if not fmt or not math.isfinite(x):
        return num(x)
    return format(x, fmt)


def _span(centre: float, lo: float, hi: float, fmt: str) -> str:
    """``centre [lo, hi]``; the centre alone where the table has no interval (one seed), as the report's tables."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return _num(centre, fmt)
    return f"{_num(centre, fmt)} {bracket(lo, hi) if not fmt else f'[{_num(lo, fmt)}, {_num(hi, fmt)}]'}"
