"""The audit's side-by-side table (regimes as rows) and its files: ``audit.md`` (the command, the settings, the
table and why each n/a is n/a), ``audit.json`` (strict JSON: null for NaN, with ``nan_reasons``) and
``audit.csv`` (an empty cell for NaN)."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from ablate.audit.measure import FIGURES
from ablate.tracking.run_dir import strict_dumps


def _num(fmt: str):
    return lambda v: fmt.format(v)


# (row key, column header, formatter of a finite value)
COLUMNS = (
    ("margin_err_mean", "margin err mean", _num("{:+.3g}")),
    ("margin_err_sd", "margin err sd", _num("{:.3g}")),
    ("margin_err_max", "margin err max", _num("{:.3g}")),
    ("dpo_loss", "DPO loss step 0", _num("{:.4f}")),
    ("dpo_grad_cos", "DPO grad cos", _num("{:.6g}")),
    ("kl_penalty_err_mean", "penalty err mean", _num("{:+.3g}")),
    ("kl_penalty_err_sd", "penalty err sd", _num("{:.3g}")),
    ("online_grad_cos", "{online} grad cos", _num("{:.6g}")),
    ("stand_in_kl", "KL(SFT||ref) nats", _num("{:.3g}")),
    ("bytes_held", "MB held", lambda v: f"{v / 1e6:.1f}"),
    ("setup_s", "setup s", _num("{:.1f}")),
    ("logprobs_s", "s per batch", _num("{:.3f}")),
)


def cell(value, fmt) -> str:
    """A table cell: the formatted number, or ``n/a`` for NaN (``inf`` as such)."""
    if isinstance(value, float) and math.isnan(value):
        return "n/a"
    if isinstance(value, float) and math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return fmt(value)


def render(rows: list[dict], online: str) -> str:
    """The rows as an aligned markdown table, regimes as rows."""
    header = ["regime", *(h.format(online=online) for _, h, _ in COLUMNS)]
    body = [[r["regime"], *(cell(r[k], f) for k, _, f in COLUMNS)] for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells):
        out = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(out) + " |"

    rule = "|" + "|".join("-" * (w + 1) + (":" if i else "-") for i, w in enumerate(widths)) + "|"
    return "\n".join([line(header), rule, *map(line, body)])


def reasons(rows: list[dict]) -> list[str]:
    """One line per distinct reason a cell is n/a, naming the regimes and figures it applies to."""
    grouped: dict[str, dict[str, list[str]]] = {}
    for r in rows:
        for key, why in r["nan_reasons"].items():
            grouped.setdefault(why, {}).setdefault(r["regime"], []).append(key)
    lines = []
    for why, where in grouped.items():
        regimes = "; ".join(f"{reg}: {', '.join(keys)}" for reg, keys in where.items())
        lines.append(f"- n/a ({regimes}): {why}")
    return lines


def notes(rows: list[dict]) -> list[str]:
    """One line per figure that is a number but not over all the data (``notes``: a stand-in KL over the responses
    the regime could score)."""
    return [f"- note ({r['regime']}: {key}): {text}" for r in rows for key, text in r.get("notes", {}).items()]


def report(command: str, settings: dict, rows: list[dict]) -> str:
    """The printed (and ``audit.md``) report: the command, the settings, the table, the n/a reasons and notes."""
    head = [f"`{command}`", ""] + [f"- {k}: {v}" for k, v in settings.items()]
    table = render(rows, settings.get("online_algo", "online"))
    return "\n".join([*head, "", table, "", *reasons(rows), *notes(rows)]) + "\n"


def write(out: Path, command: str, settings: dict, rows: list[dict], text: str) -> list[Path]:
    """Write ``audit.md``, ``audit.json`` and ``audit.csv`` into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    md, js, cs = out / "audit.md", out / "audit.json", out / "audit.csv"
    md.write_text(text)
    js.write_text(strict_dumps({"command": command, "settings": settings, "regimes": rows}, indent=2) + "\n")
    with cs.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["regime", *FIGURES])
        for r in rows:
            w.writerow([r["regime"], *("" if _missing(r[k]) else r[k] for k in FIGURES)])
    return [md, js, cs]


def _missing(value) -> bool:
    return isinstance(value, float) and not math.isfinite(value)
