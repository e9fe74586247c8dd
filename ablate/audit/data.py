"""The audit's data from a user's file (``--data``): preference pairs, read and checked as ``task=dataset`` reads
them (:mod:`ablate.tasks.dataset`: JSONL, JSON, CSV or Parquet; the columns ``prompt``, ``chosen``, ``rejected``, text
or conversations). Before any model loads, a missing or empty file, a row that is not an object, a missing or
non-text field is one line naming the file, the row and the field."""

from __future__ import annotations

import math
from pathlib import Path

from ablate.errors import AblateError
from ablate.tasks.pairs import Pair

FORMAT = 'one JSON object per line: {"prompt": "...", "chosen": "...", "rejected": "..."}'


class AuditInputError(AblateError):
    """The audit's input (its data, or the model's tokenizer) cannot be used; printed as one line, exit code 2."""


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs of the file, in order (every row a pair). Their gold rewards are unknown: NaN."""
    from ablate.config import DatasetTaskConfig
    from ablate.tasks.data_files import DataError, read_records
    from ablate.tasks.dataset import parse_rows

    path = Path(path)
    if not path.is_file():
        raise AuditInputError(f"--data {path}: no such file ({FORMAT})")
    try:
        rows = parse_rows(read_records(str(path))[0], DatasetTaskConfig(path=str(path)), split_column=False)
    except DataError as e:
        raise AuditInputError(str(e)) from None
    for r in rows:
        if r.chosen is None:
            raise AuditInputError(f"{r.where}: no chosen and rejected response: every row of --data is a pair")
    return [Pair(r.prompt, r.chosen, r.rejected, math.nan, math.nan) for r in rows]


def prompts_of(pairs: list[Pair]) -> list[str]:
    """The pairs' distinct prompts, in order of first appearance."""
    return list(dict.fromkeys(p.prompt for p in pairs))
