"""``python -m ablate.export --out pairs.jsonl [overrides]``: a built-in task's data in the format
``task=dataset`` reads (:mod:`ablate.tasks.dataset`), so that the general path can be checked against the built-in
one: every training prompt in order, with its preference pair (or both responses null where the SFT samples tied),
then the evaluation's and the test prompts as the held-out split. The pairs are the run's own (cached; sampled and
judged on a miss). Prints the ``python -m ablate`` command that trains on the file as the built-in task trains.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shlex
import sys
from pathlib import Path

from ablate.errors import AblateError, ConfigError

# the built-in task's settings that the file itself replaces (its prompts and their split)
_FILE_HOLDS = ("task.n_train", "task.n_test", "task.split_seed")


def rows(prompts: dict[str, list[str]], pairs) -> list[dict]:
    """The file's rows: the training prompts in order with their pair or nulls, then the held-out prompts."""
    by_prompt = {p.prompt: p for p in pairs}
    out = []
    for prompt in prompts["train"]:
        pair = by_prompt.get(prompt)
        out.append(
            {
                "prompt": prompt,
                "chosen": pair.chosen if pair else None,
                "rejected": pair.rejected if pair else None,
                "split": "train",
            }
        )
    out += [{"prompt": p, "chosen": None, "rejected": None, "split": "test"} for p in prompts["eval"] + prompts["test"]]
    return out


def write_jsonl(path: Path, records: list[dict]) -> None:
    """Written whole or not at all (a temporary file moved into place)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    os.replace(tmp, path)


def reproduce_command(out: Path, cfg, overrides: list[str]) -> str:
    """``python -m ablate`` on the file, with the generation settings of the built-in task (the dataset task's
    defaults differ: free-form responses) and the export's other overrides."""
    keep = [o for o in overrides if o.partition("=")[0].lstrip("+~") not in _FILE_HOLDS and not o.startswith("task=")]
    settings = [f"task.max_sentences={'null' if cfg.task.max_sentences is None else cfg.task.max_sentences}"]
    return shlex.join(["python", "-m", "ablate", "task=dataset", f"task.path={out}", *settings, *keep])


def export(out: Path, overrides: list[str]) -> str:
    from ablate.cli import check_config
    from ablate.compose import compose
    from ablate.inputs import RunInputs
    from ablate.tasks import task_registry

    cfg = compose(*overrides, "logger=none")
    if task_registry.task(cfg.task.name).is_data:
        raise ConfigError(
            f"export writes a generated task's data (task=sentiment); task={cfg.task.name} already is a file"
        )
    check_config(cfg)
    inputs = RunInputs.build(cfg)
    pairs, _, _ = inputs.pairs(cfg)
    records = rows(inputs.prompts, pairs)
    write_jsonl(out, records)
    n_pairs = sum(r["chosen"] is not None for r in records)
    print(f"ablate.export: wrote {out}: {len(records)} rows, {n_pairs} pairs", file=sys.stderr)
    return reproduce_command(out, cfg, overrides)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m ablate.export",
        description="Write a built-in task's pairs and prompts as a task=dataset file.",
    )
    p.add_argument("--out", required=True, help="the JSONL file to write")
    p.add_argument("overrides", nargs="*", help="python -m ablate overrides (model=..., task.n_train=..., seed=...)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[%(asctime)s %(name)s] %(message)s", datefmt="%H:%M:%S")
    try:
        command = export(Path(args.out), args.overrides)
    except AblateError as err:
        print(f"ablate.export: error: {err}", file=sys.stderr)
        return 2
    print(command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
