"""``python -m ablate.status runs/<sweep>``: one line per job of a sweep (or per run folder below a path).

Shows each job's overrides, status, steps and key metrics; a job without a summary is listed as ``running``
(a process on this machine holds its folder), ``stopped`` (rerun the sweep to resume it) or ``unfinished`` (cannot
tell), with the steps it has logged (``14/160``) and its last evaluation's figures, never silently dropped. Exit
code 1 when any job failed or diverged.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from ablate.tracking import schema
from ablate.tracking.run_dir import RunFolder, held, load_summary

#: set by the end-of-sweep callback (ablate.sweep.report) or by a single run that did not finish; ``python -m
#: ablate`` exits 1 when non-zero
OUTCOME: dict[str, int] = {"not_finished": 0}


def columns() -> list[tuple[str, str, int, str, float]]:
    """(summary key, header, width, format, scale) of each column, from the metric schema."""
    return [(m.key, c.header, c.width, c.fmt, m.scale) for m, c in schema.status_columns()]


def _cell(width: int, fmt: str, scale: float, value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        text = "nan"
    else:
        text = fmt.format(value / scale if scale != 1 else value)
    return text.rjust(width)


def job_dirs(root: Path) -> list[Path]:
    """Every run folder below ``root`` (a folder holding config.yaml), sorted; earlier attempts moved to
    ``previous/`` and checkpoints are not jobs."""
    skip = {".hydra", "previous", "checkpoints", "wandb"}
    return sorted(p.parent for p in root.rglob("config.yaml") if not skip & set(p.relative_to(root).parts))


def progress(folder: Path, cols) -> tuple[str, str]:
    """A job without a summary: ``running`` (a process here holds its folder), ``stopped`` (none does: rerun the
    sweep to resume it from its last checkpoint) or ``unfinished`` (cannot tell), with the steps it has logged of
    its ``algo.max_steps`` and its last evaluation's figures from ``metrics.jsonl``."""
    import warnings

    from omegaconf import OmegaConf

    state = {True: "running", False: "stopped", None: "unfinished"}[held(folder)]
    with warnings.catch_warnings():  # a running job's last line may be half written: expected here, skipped
        warnings.simplefilter("ignore", RuntimeWarning)
        records = RunFolder(folder).read_metrics()
    last: dict = {}
    for r in records:
        last.update({k: v for k, v in r.items() if not (isinstance(v, float) and math.isnan(v))})
    total = OmegaConf.select(OmegaConf.load(folder / "config.yaml"), "algo.max_steps", default=None)
    trained = max((int(r["step"]) for r in records if any(k.startswith("train/") for k in r)), default=0)
    cells = []
    for key, _, width, fmt, scale in cols:
        if key == "steps":
            cells.append(f"{trained}/{total}".rjust(width) if total else str(trained).rjust(width))
            continue
        name = schema.metric(key).logged
        cells.append(_cell(width, fmt, scale, last.get(name) if name else None))
    return state, " ".join(cells)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablate.status", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="sweep folders or run folders")
    args = parser.parse_args(argv)
    bad = 0
    cols = columns()
    header = f"{'status':<10} " + " ".join(h.rjust(w) for _, h, w, _, _ in cols) + "  job"
    print(header)
    for root in args.paths:
        for d in job_dirs(root):
            summary = d / "summary.json"
            name = str(d.relative_to(root)) if d != root else d.name
            if not summary.is_file():
                state, cells = progress(d, cols)
                print(f"{state:<10} {cells}  {name}")
                continue
            s = load_summary(summary)
            bad += s["status"] != "finished"
            cells = " ".join(_cell(w, f, scale, s.get(k)) for k, _, w, f, scale in cols)
            reason = f"  ({s['reason']})" if s.get("reason") else ""
            print(f"{s['status']:<10} {cells}  {name}{reason}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
