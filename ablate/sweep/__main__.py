"""``python -m ablate.sweep``: list the sweep presets, or write their W&B sweep files.

python -m ablate.sweep list
python -m ablate.sweep wandb regimes [seeds] [--write]
python -m ablate.sweep slurm-preview regimes [overrides...]   # the sbatch script a SLURM sweep would submit
"""

from __future__ import annotations

import argparse
import sys

from ablate import presets
from ablate.paths import sweeps_dir
from ablate.sweep.wandb_file import render


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ablate.sweep", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="presets, their grid and job count")
    w = sub.add_parser("wandb", help="the W&B sweep file of one or more presets")
    w.add_argument("names", nargs="+")
    w.add_argument("--write", action="store_true", help="write sweeps/wandb/<names>.yaml instead of printing")
    s = sub.add_parser(
        "slurm-preview",
        help="the sbatch job script of python -m ablate -m +sweep=<preset> hydra/launcher=slurm <overrides> "
        "(rendered by submitit; nothing is submitted)",
    )
    s.add_argument("preset", help="a preset of `python -m ablate.sweep list`")
    s.add_argument("overrides", nargs="*", help="as for python -m ablate, e.g. hydra.launcher.partition=gpu")
    args = parser.parse_args(argv)
    if args.cmd == "slurm-preview":
        from ablate.sweep.slurm_preview import render as render_slurm

        print(render_slurm(args.preset, args.overrides).text(), end="")
        return 0
    if args.cmd == "list":
        from ablate.cli import _job_overrides

        for name in presets.preset_files():
            n = len(_job_overrides(["-m", f"+sweep={name}"]))
            grid = " ".join(f"{k}={v}" for k, v in presets.grid([name]).items())
            print(f"{name:<12} {n:>4} jobs  {grid}")
        return 0
    for name in args.names:
        presets.load(name)  # unknown name: one clear error
    text = render(args.names)
    if not args.write:
        print(text, end="")
        return 0
    out = sweeps_dir() / "wandb" / f"{'+'.join(args.names)}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    print(out)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception as e:  # ConfigError from an unknown preset: one line
        from ablate.errors import AblateError

        if not isinstance(e, AblateError):
            raise
        print(f"ablate: error: {e}", file=sys.stderr)
        sys.exit(2)
