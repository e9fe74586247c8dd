"""The audit's data from a user's JSONL file: one preference pair per line, ``{"prompt": ..., "chosen": ...,
"rejected": ...}`` (string fields; other fields are ignored). Read and checked before any model loads: a
missing or empty file, a line that is not a JSON object, a missing or non-string field is one line naming
the file, the line number and the field."""

from __future__ import annotations

import json
import math
from pathlib import Path

from ablate.errors import AblateError
from ablate.tasks.pairs import Pair

FIELDS = ("prompt", "chosen", "rejected")
FORMAT = 'one JSON object per line: {"prompt": "...", "chosen": "...", "rejected": "..."}'


class AuditInputError(AblateError):
    """The audit's input (its data, or the model's tokenizer) cannot be used; printed as one line, exit code 2."""


def read_pairs(path: str | Path) -> list[Pair]:
    """The pairs of a JSONL file, in order (blank lines skipped). Their gold rewards are unknown: NaN."""
    path = Path(path)
    if not path.is_file():
        raise AuditInputError(f"--data {path}: no such file ({FORMAT})")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise AuditInputError(f"{path}: not UTF-8 text (byte {e.start}); expected {FORMAT}") from None
    pairs = [_pair(path, n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    if not pairs:
        raise AuditInputError(f"{path}: empty file, no pairs; expected {FORMAT}")
    return pairs


def _pair(path: Path, n: int, line: str) -> Pair:
    """Line ``n`` as a pair, or the one-line error saying what is wrong with it."""
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise AuditInputError(f"{path}:{n}: not valid JSON ({e.msg} at column {e.colno}); expected {FORMAT}") from None
    if not isinstance(obj, dict):
        raise AuditInputError(f"{path}:{n}: a JSON {type(obj).__name__}, not an object; expected {FORMAT}")
    for f in FIELDS:
        if f not in obj:
            raise AuditInputError(f"{path}:{n}: missing field {f!r} (every line needs {', '.join(FIELDS)})")
        if not isinstance(obj[f], str):
            raise AuditInputError(f"{path}:{n}: field {f!r} must be a string, got {_json_type(obj[f])}")
    return Pair(obj["prompt"], obj["chosen"], obj["rejected"], math.nan, math.nan)


def _json_type(value) -> str:
    """The JSON name of a parsed value's type."""
    names = {dict: "an object", list: "an array", bool: "a boolean", int: "a number", float: "a number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def prompts_of(pairs: list[Pair]) -> list[str]:
    """The pairs' distinct prompts, in order of first appearance."""
    return list(dict.fromkeys(p.prompt for p in pairs))
