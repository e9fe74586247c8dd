"""The recheck of a report's ``notes.md``: every number typed in its prose (outside the ``{{...}}`` placeholders the
report fills from its tables, and outside `code`) must be some cell of the report's tables or of its runs, as
printed: rounded to the digits the prose gives, sign and percent allowed. A number that matches nothing is a claim
no table supports; the fix is a placeholder, or a table that holds it. Independent of :mod:`analysis.notes`."""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np
import pandas as pd

_PLACEHOLDER = re.compile(r"\{\{[^{}]*\}\}")
_CODE = re.compile(r"`[^`]*`")
_LINK = re.compile(r"\]\([^)]*\)")
# a number standing alone: not part of a word (SmolLM2, k1, 135M), a version, or a path
_NUMBER = re.compile(r"(?<![\w.])[-+−]?(\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?)(%?)(?![\w.]*[A-Za-z_/])")
# numbers that carry no claim: small counts ("two jobs", "4 seeds", "step 0")
SMALL = 10


def literals(text: str) -> list[str]:
    """The numbers typed in ``text`` (placeholders, code spans and link targets left out), as written."""
    bare = _LINK.sub("]", _CODE.sub(" ", _PLACEHOLDER.sub(" ", text)))
    return [m.group(1) + m.group(2) for m in _NUMBER.finditer(bare)]


def cells(folder: Path, runs: pd.DataFrame | None = None) -> np.ndarray:
    """Every finite number of the report's CSVs (and each seed's difference in ``seed_diffs``), and of the runs'
    configs and summaries, as absolute values."""
    values: list[float] = []
    frames = [pd.read_csv(p) for p in sorted(folder.glob("*.csv"))]
    if runs is not None:
        frames.append(runs)
    for frame in frames:
        for c in frame.columns:
            col = frame[c]
            if c == "seed_diffs":
                values += [float(v) for cell in col.dropna() for v in re.findall(r":([^;]+)", str(cell))]
            num = pd.to_numeric(col, errors="coerce").to_numpy(dtype=float)
            values += list(num[np.isfinite(num)])
    return np.unique(np.abs(np.asarray(values, dtype=float)))


def matches(literal: str, values: np.ndarray) -> bool:
    """Whether a literal (``0.106``, ``47%``, ``1,102``, ``4.35e-03``) is one of ``values`` rounded to its digits."""
    pct = literal.endswith("%")
    text = literal.rstrip("%").replace(",", "")
    x = abs(float(text))
    mantissa = text.lower().split("e")[0]
    decimals = len(mantissa.split(".")[1]) if "." in mantissa else 0
    exponent = int(text.lower().split("e")[1]) if "e" in text.lower() else 0
    half = 0.5 * 10.0 ** (exponent - decimals) * (1 + 1e-9)
    if not decimals and not exponent and x >= 10:  # "1102", "20": an integer, or a value printed to 3 figures
        half = max(half, 0.5 * 10.0 ** (math.floor(math.log10(x)) - 2))
    for v in (values * 100 if pct else values, values):
        if np.any(np.abs(v - x) <= half):
            return True
    return False


def unsupported(text: str, folder: Path, runs: pd.DataFrame | None = None) -> list[str]:
    """The literals of ``text`` (beyond :data:`SMALL`) that match no cell."""
    values = cells(folder, runs)
    out = []
    for lit in literals(text):
        x = abs(float(lit.rstrip("%").replace(",", "")))
        if x <= SMALL and "." not in lit and "e" not in lit.lower():
            continue
        if not matches(lit, values):
            out.append(lit)
    return out
