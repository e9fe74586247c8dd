"""``python -m analysis``: comparison reports from sweeps.

python -m analysis report runs/sweeps/regimes [more folders] --out reports/<name>
python -m analysis report --wandb-offline runs/sweeps/regimes --out reports/<name>
python -m analysis report --wandb <entity/project> --group <group> --out reports/<name>
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="python -m analysis", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("report", help="tables, figures, CSV and LaTeX from sweep folders or W&B")
    r.add_argument("folders", nargs="*", type=Path, help="sweep (or run) folders")
    r.add_argument("--out", type=Path, required=True, help="report folder, e.g. reports/<name>")
    r.add_argument("--title", default=None)
    r.add_argument("--baseline", default="full", help="the regime every other one is compared with")
    r.add_argument("--notes", type=Path, default=None, help="a markdown file with the report's reading of the numbers")
    r.add_argument("--wandb-offline", action="store_true", help="read the W&B offline runs below the folders")
    r.add_argument("--wandb", metavar="ENTITY/PROJECT", default=None, help="read runs from the W&B API (online)")
    r.add_argument("--group", default=None, help="the W&B group (the sweep) with --wandb")
    args = parser.parse_args(argv)

    from analysis import load
    from analysis.report import write_report

    try:
        if args.wandb:
            if not args.group:
                parser.error("--wandb needs --group")
            entity, _, project = args.wandb.rpartition("/")
            data = load.from_wandb(project, args.group, entity or None)
        elif args.wandb_offline:
            data = load.from_wandb_offline(*args.folders)
        else:
            if not args.folders:
                parser.error("give at least one sweep folder")
            data = load.load_runs(*args.folders)
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    notes = args.notes.read_text() if args.notes else None
    if notes is None and (args.out / "notes.md").is_file():
        notes = (args.out / "notes.md").read_text()
    command = "python -m analysis " + " ".join(shlex.quote(a) for a in argv)
    title = args.title or f"Reference regimes: {', '.join(str(f) for f in args.folders) or args.group}"
    report = write_report(data, args.out, command=command, title=title, baseline=args.baseline, notes=notes)
    n_bad = len(data.problems())
    print(f"analysis: wrote {report} ({len(data.runs)} jobs, {n_bad} not finished)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
