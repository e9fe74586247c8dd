"""Number and table formatting shared by the report's sections."""

from __future__ import annotations

import math


def num(x: float) -> str:
    """A number as the report prints it (``n/a`` for NaN, None or infinity)."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "n/a"
    if x == 0:
        return "0"
    a = abs(x)
    if a >= 1000:
        return f"{x:,.0f}"
    if a >= 0.01:
        return f"{x:.3g}" if a < 100 else f"{x:.1f}"
    return f"{x:.2e}"


def span(mean: float, lo: float, hi: float, fmt=num) -> str:
    """``mean [lo, hi]``, each written by ``fmt``; the mean alone when the interval is missing or has no width."""
    if mean is None or not math.isfinite(mean):
        return "n/a"
    if math.isfinite(lo) and math.isfinite(hi) and hi - lo > 1e-12 * max(1.0, abs(mean)):
        return f"{fmt(mean)} [{fmt(lo)}, {fmt(hi)}]"
    return fmt(mean)


def md_table(header: list[str], rows: list[list[str]]) -> str:
    """A GitHub-flavoured markdown table."""
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


def bracket(lo: float, hi: float) -> str:
    """``[lo, hi]`` always, even with no width (``n/a`` when missing)."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "n/a"
    return f"[{num(lo)}, {num(hi)}]"
