"""``python -m analysis``: comparison reports from sweeps.

python -m analysis report runs/sweeps/regimes [more folders] --out reports/<name>
python -m analysis report --wandb-offline runs/sweeps/regimes --out reports/<name>
python -m analysis report --wandb <entity/project> --group <group> --out reports/<name>
python -m analysis report runs/sweeps/regimes --out reports/<name> --margin reward_delta=0.05 --margin kl_true=10%
python -m analysis calibration runs/sweeps/calibrate_dpo [more folders] --out reports/<name>
python -m analysis archive runs/sweeps/calibrate_dpo [more folders] --out reports/<name>/runs
python -m analysis recheck reports/<name>/runs/<sweep> [more folders] --report reports/<name>
python -m analysis headlines [--check]
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path


def _statistics_options(r: argparse.ArgumentParser) -> None:
    """The report's statistics flags (resolved by :func:`analysis.report_config.build_config`)."""
    from analysis.report_config import DESIGNS, MULTIPLICITY, RELATIVE

    s = r.add_argument_group("statistics (the resolved values are printed in the report)")
    s.add_argument(
        "--primary", default=None, help="the primary metric (default: the runs' plan.primary, else reward_delta)"
    )
    s.add_argument(
        "--reference-condition",
        default=None,
        help="runs varying a setting: the condition the baseline's others are compared with (e.g. algo.beta=0.1; "
        "default: the one with the most baseline seeds)",
    )
    s.add_argument(
        "--margin",
        action="append",
        default=[],
        metavar="METRIC=VALUE",
        help="an equivalence margin, absolute (reward_delta=0.05) or relative to the baseline's mean (kl_true=10%%); "
        "repeatable; defaults: reward_delta=0.05, win_rate=0.05, kl_true=10%%, length=10%%",
    )
    s.add_argument("--alpha", type=float, default=0.05, help="difference: 1-alpha interval; TOST: 1-2 alpha (0.05)")
    s.add_argument(
        "--null-control",
        default=None,
        help="the regime that must come out equivalent (default: the runs' plan.null_control, else cached)",
    )
    s.add_argument("--boot", type=int, default=2000, help="bootstrap resamples (2000)")
    s.add_argument("--boot-seed", type=int, default=0, help="the bootstrap's seed (0)")
    s.add_argument(
        "--design",
        choices=tuple(DESIGNS),
        default="crossed",
        help="seeds x prompts: crossed where the seeds share their prompts (the default: docs/statistics.md), or "
        "nested (hierarchical) everywhere",
    )
    s.add_argument(
        "--multiplicity",
        choices=tuple(MULTIPLICITY),
        default="holm",
        help="the verdicts of difference: Holm-adjusted over the verdict table (the default: docs/statistics.md), "
        "or each on its own interval (none)",
    )
    s.add_argument(
        "--relative",
        choices=tuple(RELATIVE),
        default="log-ratio",
        help="a metric with a relative margin (kl_true, length): per-seed log ratios against ±log(1 + share) (the "
        "default: docs/statistics.md), or the difference against share x the baseline's mean",
    )


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
    r.add_argument(
        "--regimes", default=None, help="only these references, comma-separated (e.g. full,int8,cached); default: all"
    )
    r.add_argument(
        "--seeds", default=None, help="only these seeds, comma-separated (conditions on the same seeds); default: all"
    )
    r.add_argument(
        "--fold",
        default=None,
        help="settings, comma-separated, labelled in the regime instead of the condition where a run's value is not "
        "the common one (algo.beta: a stand-in at a larger beta against full at the usual one)",
    )
    r.add_argument("--bench", type=Path, default=None, help="a `python -m ablate.bench` CSV: the cost section")
    r.add_argument("--wandb-offline", action="store_true", help="read the W&B offline runs below the folders")
    r.add_argument("--wandb", metavar="ENTITY/PROJECT", default=None, help="read runs from the W&B API (online)")
    r.add_argument("--group", default=None, help="the W&B group (the sweep) with --wandb")
    _statistics_options(r)
    c = sub.add_parser("calibration", help="which setting to run the reports at: effect and true KL per setting")
    c.add_argument("folders", nargs="+", type=Path, help="sweep folders of ref=full calibration jobs")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--title", default="Calibration: the setting the regime reports run at")
    c.add_argument(
        "--kl-window",
        type=float,
        nargs=2,
        default=(1.0, 5.0),
        metavar=("LO", "HI"),
        help="true KL per response a chosen setting must reach (nats; default 1 5)",
    )
    c.add_argument("--notes", type=Path, default=None, help="a markdown reading (default: <out>/notes.md)")
    a = sub.add_parser("archive", help="copy what a report is computed from (no checkpoints) to commit it")
    a.add_argument("folders", nargs="+", type=Path, help="sweep folders")
    a.add_argument("--out", type=Path, required=True, help="e.g. reports/<name>/runs")
    k = sub.add_parser("recheck", help="recompute the runs' summaries and a report's differences from the samples")
    k.add_argument("folders", nargs="+", type=Path, help="the sweep folders the report was made from")
    k.add_argument("--report", type=Path, default=None, help="a report folder: check its equivalence.csv too")
    k.add_argument("--baseline", default="full", help="the report's baseline regime (full)")
    k.add_argument("--regimes", default=None, help="the report's --regimes, if it had one")
    k.add_argument("--seeds", default=None, help="the report's --seeds, if it had one")
    k.add_argument("--fold", default=None, help="the report's --fold, if it had one")
    k.add_argument("--rtol", type=float, default=1e-9, help="relative tolerance of the figures (1e-9)")
    k.add_argument("--itol", type=float, default=0.1, help="interval ends, as a fraction of its width (0.1)")
    k.add_argument("--boot", type=int, default=4000, help="the separate bootstrap's resamples (4000)")
    h = sub.add_parser("headlines", help="refill the README's report headlines from each report's headline.md")
    h.add_argument("--readme", type=Path, default=Path("README.md"), help="the README (README.md)")
    h.add_argument("--check", action="store_true", help="change nothing; exit 1 if a headline is out of date")
    _plan_parser(sub)
    args = parser.parse_args(argv)
    if args.cmd == "headlines":
        from analysis import headlines

        return headlines.main(args.readme, args.check)
    if args.cmd == "plan":
        return _plan(args)
    if args.cmd == "recheck":
        return _recheck(args)
    if args.cmd == "archive":
        return _archive(args)
    if args.cmd == "calibration":
        return _calibration(args, argv)

    from analysis import declared
    from analysis.report import write_report
    from analysis.report_config import build_config

    try:
        config = build_config(
            args.margin,
            args.primary or "reward_delta",
            args.alpha,
            args.baseline,
            args.null_control,
            args.boot,
            args.boot_seed,
            args.reference_condition,
            args.design,
            args.multiplicity,
            args.relative,
        )
    except ValueError as e:
        parser.error(str(e))

    try:
        data = _load(args, parser)
        config = declared.apply(config, declared.plan_of(data.runs), args.margin, args.primary, args.null_control)
        if config.reference_condition is not None:  # one line before any table is computed
            from analysis.conditions import reference_condition

            reference_condition(data.runs, config.baseline, config.reference_condition)
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    notes = args.notes.read_text() if args.notes else None
    if notes is None and (args.out / "notes.md").is_file():
        notes = (args.out / "notes.md").read_text()
    command = "python -m analysis " + " ".join(shlex.quote(a) for a in argv)
    title = args.title or f"Reference regimes: {', '.join(str(f) for f in args.folders) or args.group}"
    if args.bench is not None and not args.bench.is_file():
        print(f"analysis: error: no such bench CSV: {args.bench}", file=sys.stderr)
        return 2
    from analysis.notes import NotesError

    try:
        report = write_report(
            data, args.out, command=command, title=title, notes=notes, config=config, bench=args.bench
        )
    except NotesError as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    n_bad = len(data.problems())
    print(f"analysis: wrote {report} ({len(data.runs)} jobs, {n_bad} not finished)")
    return 0


def _load(args, parser):
    """The runs the report reads (W&B, W&B offline or sweep folders): ``analysis.load.Runs``; a ValueError naming
    what the source holds when none of its jobs finished (nothing to tabulate)."""
    from analysis import load

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
        data = load.load_runs(
            *args.folders, regimes=_listed(args.regimes), seeds=_seeds(args.seeds), fold=_listed(args.fold) or ()
        )
    if data.finished().empty:
        counts = ", ".join(f"{n} {status}" for status, n in data.runs["status"].value_counts().items())
        raise ValueError(
            f"no finished jobs below {', '.join(map(str, args.folders)) or args.group} yet ({counts}): a report needs "
            "at least one summary.json with status finished"
        )
    return data


def _listed(text: str | None) -> list[str] | None:
    """A comma-separated option's items (None: the option was not given)."""
    return [x.strip() for x in text.split(",") if x.strip()] if text else None


def _seeds(text: str | None) -> list[int] | None:
    """``--seeds 0,1,2`` as integers; anything else is one clear line."""
    try:
        return None if text is None else [int(x) for x in _listed(text) or []]
    except ValueError:
        raise ValueError(f"--seeds takes integers separated by commas, got {text!r}") from None


def _archive(args) -> int:
    from analysis.archive import archive

    try:
        done = archive(args.folders, args.out)
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    left = f"; left out (no summary.json): {', '.join(done.skipped)}" if done.skipped else ""
    print(f"analysis: archived {done.jobs} jobs ({done.bytes / 1e6:.1f} MB) to {args.out}{left}")
    return 0


def _plan_parser(sub) -> None:
    n = sub.add_parser("plan", help="seeds each verdict needs for its power, from a pilot sweep's seed-to-seed spread")
    n.add_argument("folders", nargs="+", type=Path, help="the pilot's sweep (or report runs) folders")
    n.add_argument("--baseline", default="full", help="the regime every other one is compared with (full)")
    n.add_argument("--regimes", default=None, help="only these references, comma-separated")
    n.add_argument("--seeds", default=None, help="only these seeds, comma-separated")
    n.add_argument("--fold", default=None, help="as for report")
    n.add_argument("--power", type=float, default=0.8, help="the power to plan for (0.8)")
    n.add_argument("--alpha", type=float, default=0.05, help="TOST's level (0.05)")
    n.add_argument(
        "--margin", action="append", default=[], metavar="METRIC=VALUE", help="as for report (defaults the same)"
    )
    n.add_argument("--csv", type=Path, default=None, help="also write the plan to this CSV file")
    n.add_argument(
        "--fraction",
        type=float,
        default=None,
        help="also derive margins to declare before the runs: this share of the baseline's effect over the SFT "
        "model (e.g. 0.25, from a calibration's runs)",
    )


def _plan(args) -> int:
    from analysis import declared, load, plan
    from analysis.report_config import build_config
    from analysis.samples import prompt_frame

    try:
        if not 0 < args.power < 1:
            raise ValueError(f"--power must be in (0, 1), not {args.power}")
        if args.fraction is not None and not 0 < args.fraction < 1:
            raise ValueError(f"--fraction must be in (0, 1), not {args.fraction}")
        cfg = build_config(args.margin, alpha=args.alpha, baseline=args.baseline)
        runs = load.load_runs(
            *args.folders, regimes=_listed(args.regimes), seeds=_seeds(args.seeds), fold=_listed(args.fold) or ()
        ).runs
        cfg = declared.apply(cfg, declared.plan_of(runs), args.margin, None)
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    table = plan.plan(runs, prompt_frame(runs), cfg, args.power)
    if args.csv is not None:
        table.to_csv(args.csv, index=False)
    print("\n".join(plan.describe(table, args.power)))
    if args.fraction is not None:
        print(
            "\n" + "\n".join(plan.describe_margins(plan.margins_from_effect(runs, cfg, args.fraction), args.fraction))
        )
    return 0


def _recheck(args) -> int:
    from analysis.recheck import describe, recheck

    if args.report is not None and not any((args.report / f).is_file() for f in ("report.md", "equivalence.csv")):
        print(f"analysis: error: no report (report.md or equivalence.csv) in {args.report}", file=sys.stderr)
        return 2
    try:
        found = recheck(
            args.folders,
            args.report,
            args.baseline,
            _listed(args.regimes),
            seeds=_seeds(args.seeds),
            fold=_listed(args.fold),
            rtol=args.rtol,
            itol=args.itol,
            n_boot=args.boot,
        )
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    print("\n".join(describe(found, args.report)))
    return 1 if found.errors else 0


def _calibration(args, argv: list[str]) -> int:
    from analysis import load
    from analysis.calibration import write_calibration

    lo, hi = args.kl_window
    if not 0 <= lo < hi:
        print(f"analysis: error: --kl-window needs 0 <= LO < HI, got {lo} {hi}", file=sys.stderr)
        return 2
    try:
        data = load.load_runs(*args.folders)
        notes_file = args.notes or args.out / "notes.md"
        notes = notes_file.read_text() if notes_file.is_file() else None
        command = "python -m analysis " + " ".join(shlex.quote(a) for a in argv)
        report = write_calibration(data, args.out, command, args.title, notes, (lo, hi))
    except (FileNotFoundError, ValueError) as e:
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    print(f"analysis: wrote {report} ({len(data.runs)} jobs, {len(data.problems())} not finished)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
