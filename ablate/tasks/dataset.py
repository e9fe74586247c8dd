"""A task read from the user's data (``task=dataset``): preference pairs, or prompts alone, from a JSONL, JSON,
CSV or Parquet file, or a Hugging Face dataset id through ``datasets`` (its local cache when offline).

Read and checked before any model loads. A mistake that makes the data unusable is refused with one line naming
the file, the row and the field (:class:`DataError`); the documented drops are counted in ``data_dropped``:

- refused: a missing file or column (the columns found are named), a row that is not an object, an empty or
  non-text field, a pair with one response missing, a split value other than train/test, no training rows, no
  held-out prompts;
- dropped and counted: a pair whose chosen equals its rejected (no preference to learn), a repeated pair, a held-out
  row whose prompt is also a training prompt (the splits stay disjoint by prompt) and, once the tokenizer is known,
  a pair whose prompt alone fills ``algo.max_length`` (TRL drops those too: :func:`drop_long_prompts`).

A field is plain text or a conversation (a list of ``{role, content}`` messages): a prompt conversation renders with
the policy's chat template (:func:`ablate.tasks.prompts.from_chat`), a response conversation is its last, assistant,
message. A row whose chosen and rejected are both null is a prompt without a pair (PPO/GRPO train on it, the
evaluation samples it). Splits: ``task.test_path``, else the data's ``split`` column (train/test), else a dataset
id's own ``test`` (or ``validation``) split, else one made by a stable hash of each distinct prompt and
``task.split_seed`` (``task.test_fraction`` of them held out). The evaluation samples the first ``eval.n_prompts``
held-out prompts.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ablate.config.task import DatasetTaskConfig
from ablate.tasks import task_registry
from ablate.tasks.data_files import DataError, is_local_file, read_hub, read_records, type_name
from ablate.tasks.pairs import Pair
from ablate.tasks.prompts import from_chat

SPLITS = ("train", "test")


@dataclass
class Row:
    """One row of the data, its fields in the harness's terms (``chosen``/``rejected`` None: a prompt alone)."""

    where: str  # file:row, for errors
    prompt: str
    chosen: str | None
    rejected: str | None
    split: str | None


@dataclass
class TaskData:
    """What a task read from data gives a run: prompts by split, training pairs, perplexity text, and what was
    read and dropped (for ``summary.json`` and the provenance)."""

    path: Path | str  # the data's location (cache entries name it: ``pairs_cache``)
    prompts: dict[str, list[str]]  # "train", "eval", "test"
    pairs: list[Pair] | None  # the training pairs; None: a prompts-only task
    heldout: list[str]
    sha256: str  # of the data's bytes (a file, or a dataset id's cached files)
    fingerprint: str  # of the rows as read (prompt, chosen, rejected, split) and the columns
    split_rule: str
    dropped: dict[str, int] = field(default_factory=dict)

    def sizes(self) -> dict[str, int]:
        sizes = {f"{k}_prompts": len(v) for k, v in self.prompts.items()}
        sizes["train_pairs"] = len(self.pairs or [])
        return sizes

    def summary(self) -> dict[str, Any]:
        """The summary's ``data`` entry."""
        return {
            "path": str(self.path),
            "sha256": self.sha256,
            "fingerprint": self.fingerprint,
            "split": self.split_rule,
            "sizes": self.sizes(),
            "dropped": dict(self.dropped),
        }


# ------------------------------------------------------------------------------------------------- fields
def _messages(where: str, col: str, value: list) -> list[dict]:
    if not value:
        raise DataError(f"{where}: field {col!r} is an empty conversation")
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f"{where}: field {col!r}, message {i}: not a {{role, content}} object with text content")
        if not m["content"].strip():
            raise DataError(f"{where}: field {col!r}, message {i}: empty content")
    return value


def _prompt(where: str, col: str, value) -> str:
    if isinstance(value, str):
        if not value.strip():
            raise DataError(f"{where}: field {col!r} is empty")
        return value
    if isinstance(value, list):
        return from_chat(_messages(where, col, value))
    raise DataError(
        f"{where}: field {col!r} must be text or a list of {{role, content}} messages, got {type_name(value)}"
    )


def _response(where: str, col: str, value) -> str | None:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return None
    if isinstance(value, list):
        last = _messages(where, col, value)[-1]
        if last["role"] != "assistant":
            raise DataError(f"{where}: field {col!r}: a conversation's last message must be the assistant's response")
        return last["content"]
    if not isinstance(value, str):
        raise DataError(
            f"{where}: field {col!r} must be text or a list of {{role, content}} messages, got {type_name(value)}"
        )
    if not value.strip():
        raise DataError(f"{where}: field {col!r} is empty")
    return value


def parse_rows(records: list[tuple[str, dict]], cfg, *, split_column: bool) -> list[Row]:
    """The records as rows in the harness's terms, checked field by field (:class:`DataError` on the first
    mistake)."""
    cols = cfg.columns
    found = sorted({k for _, r in records for k in r})
    if cols.prompt not in found:
        raise DataError(
            f"{records[0][0].rsplit(':', 1)[0]}: no column {cols.prompt!r} (task.columns.prompt); columns found: {', '.join(found)}"
        )
    pairs = cols.chosen in found or cols.rejected in found
    if pairs and not (cols.chosen in found and cols.rejected in found):
        missing = cols.rejected if cols.chosen in found else cols.chosen
        raise DataError(
            f"{records[0][0].rsplit(':', 1)[0]}: a column {missing!r} is missing for the pairs (task.columns); columns found: {', '.join(found)}"
        )
    rows = []
    for where, r in records:
        if r.get(cols.prompt) is None:
            raise DataError(f"{where}: missing field {cols.prompt!r}")
        prompt = _prompt(where, cols.prompt, r[cols.prompt])
        chosen = _response(where, cols.chosen, r.get(cols.chosen)) if pairs else None
        rejected = _response(where, cols.rejected, r.get(cols.rejected)) if pairs else None
        if (chosen is None) != (rejected is None):
            gap = cols.chosen if chosen is None else cols.rejected
            raise DataError(
                f"{where}: field {gap!r} is missing (a pair needs both responses; both null: a prompt alone)"
            )
        split = None
        if split_column:
            split = r.get(cols.split)
            if split is None:
                raise DataError(
                    f"{where}: missing field {cols.split!r} (other rows have it: every row needs train or test)"
                )
            if split not in SPLITS:
                raise DataError(f"{where}: field {cols.split!r} must be train or test, got {split!r}")
        rows.append(Row(where, prompt, chosen, rejected, split))
    return rows


# ------------------------------------------------------------------------------------------------- splits
def hashed_split(prompt: str, seed: int, test_fraction: float) -> str:
    """``test`` for a stable share of distinct prompts (their hash with the seed), ``train`` for the rest."""
    h = int.from_bytes(hashlib.sha256(f"{seed}\0{prompt}".encode()).digest()[:8], "big")
    return "test" if h / 2**64 < test_fraction else "train"


def _split(cfg) -> tuple[dict[str, list[Row]], str, str]:
    """The rows of each split, the rule that split them and the data's digest."""
    split_col = cfg.columns.split
    if is_local_file(cfg.path):
        records, digest = read_records(cfg.path)
        by_split = {None: records}
        if cfg.test_path:
            test, test_digest = read_records(cfg.test_path)
            digest = hashlib.sha256((digest + test_digest).encode()).hexdigest()
            return (
                {
                    "train": parse_rows(records, cfg, split_column=False),
                    "test": parse_rows(test, cfg, split_column=False),
                },
                f"files: {cfg.path} / {cfg.test_path}",
                digest,
            )
    else:
        by_split, digest = read_hub(cfg.path)
    if None in by_split:
        records = by_split[None]
        own = any(split_col in r for _, r in records)
        rows = parse_rows(records, cfg, split_column=own)
        if own:
            return {s: [r for r in rows if r.split == s] for s in SPLITS}, f"the data's {split_col!r} column", digest
        rule = f"hash of each prompt, task.split_seed={cfg.split_seed}, task.test_fraction={cfg.test_fraction}"
        return (
            {s: [r for r in rows if hashed_split(r.prompt, cfg.split_seed, cfg.test_fraction) == s] for s in SPLITS},
            rule,
            digest,
        )
    test_name = next((n for n in ("test", "validation") if n in by_split), None)
    if "train" not in by_split or test_name is None:
        raise DataError(
            f"task.path={cfg.path}: a dataset id needs a train and a test (or validation) split; it has {', '.join(by_split)}"
        )
    out = {
        "train": parse_rows(by_split["train"], cfg, split_column=False),
        "test": parse_rows(by_split[test_name], cfg, split_column=False),
    }
    return out, f"the dataset's train / {test_name} splits", digest


# --------------------------------------------------------------------------------------------------- task
def _distinct(items) -> list:
    return list(dict.fromkeys(items))


def load_task(cfg, n_eval: int) -> TaskData:
    """The task's data for ``cfg`` (a ``DatasetTaskConfig``), the evaluation taking the first ``n_eval``
    held-out prompts; :class:`DataError` (one line) when it cannot be used."""
    splits, rule, digest = _split(cfg)
    dropped: Counter = Counter()
    train = splits["train"][: cfg.n_train] if cfg.n_train else splits["train"]
    if not train:
        raise DataError(f"task.path={cfg.path}: no training rows (split: {rule})")
    train_prompts = _distinct(r.prompt for r in train)
    seen = set(train_prompts)
    test = []
    for r in splits["test"]:
        if r.prompt in seen:
            dropped["test_prompt_in_train"] += 1
        else:
            test.append(r)
    held_out = _distinct(r.prompt for r in test)
    if not held_out:
        raise DataError(
            f"task.path={cfg.path}: no held-out prompts for the evaluation (split: {rule}); add a test split or raise task.test_fraction"
        )
    pairs: list[Pair] | None = None
    if any(r.chosen is not None for r in train):
        pairs, keys = [], set()
        for r in train:
            if r.chosen is None:
                continue
            if r.chosen == r.rejected:
                dropped["chosen_equals_rejected"] += 1
                continue
            key = (r.prompt, r.chosen, r.rejected)
            if key in keys:
                dropped["duplicate_pair"] += 1
                continue
            keys.add(key)
            pairs.append(Pair(r.prompt, r.chosen, r.rejected, math.nan, math.nan))
        if not pairs:
            raise DataError(f"task.path={cfg.path}: every training pair was dropped ({dict(dropped)})")
    rest = held_out[n_eval:]
    prompts = {
        "train": train_prompts,
        "eval": held_out[:n_eval],
        "test": rest[: cfg.n_test] if cfg.n_test is not None else rest,
    }
    content = [[r.prompt, r.chosen, r.rejected, s] for s in SPLITS for r in splits[s]]
    fingerprint = hashlib.sha256(json.dumps([content, asdict(cfg.columns)], ensure_ascii=False).encode()).hexdigest()
    return TaskData(
        path=cfg.path,
        prompts=prompts,
        pairs=pairs,
        heldout=heldout(cfg, test),
        sha256=digest,
        fingerprint=fingerprint,
        split_rule=rule,
        dropped=dict(dropped),
    )


def heldout(cfg, test: list[Row]) -> list[str]:
    """The text the policy's perplexity is measured on (``task.heldout``)."""
    if cfg.heldout == "builtin":
        from ablate.tasks.heldout import heldout_texts

        return heldout_texts()
    if cfg.heldout == "chosen":
        texts = [r.chosen for r in test if r.chosen is not None]
        if not texts:
            raise DataError("task.heldout=chosen needs held-out pairs: the held-out split has prompts only")
        return texts
    p = Path(cfg.heldout).expanduser()
    if not p.is_file():
        raise DataError(f"task.heldout={cfg.heldout}: neither builtin, chosen nor a text file")
    texts = [line.strip() for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]
    if not texts:
        raise DataError(f"task.heldout={cfg.heldout}: empty file")
    return texts


def drop_long_prompts(data: TaskData, tokenizer, max_length: int | None) -> None:
    """Drop (and count) the training pairs whose prompt alone fills ``max_length`` tokens: truncated from the end
    they would keep no response token (DPO's tokenisation drops them too: :func:`ablate.tasks.pair_tokens.tokenize_pairs`)."""
    if not data.pairs or max_length is None:
        return
    from ablate.tasks.pair_tokens import tokenize_pair

    keep = [p for p in data.pairs if len(tokenize_pair(tokenizer, p).prompt_ids) < max_length]
    if len(keep) < len(data.pairs):
        data.dropped["prompt_fills_max_length"] = len(data.pairs) - len(keep)
        if not keep:
            raise DataError(
                f"task.path={data.path}: every pair's prompt alone fills algo.max_length={max_length} tokens"
            )
        data.pairs = keep


# ---------------------------------------------------------------------------------------------- the task
_TASK_DATA: dict[str, TaskData] = {}  # one read per process: preflight's check and the job read the same data


def task_data(cfg) -> TaskData:
    """``task=dataset``'s data (:func:`load_task`) for the run config ``cfg``, read once per process for the same
    settings and the same file state."""
    import copy

    task = cfg.task
    stamp = []
    for p in (task.path, task.test_path):
        path = Path(p).expanduser() if p else None
        stamp.append([p, path.stat().st_size, path.stat().st_mtime_ns] if path and path.is_file() else p)
    key = json.dumps([asdict(task), cfg.eval.n_prompts, stamp], default=str)
    if key not in _TASK_DATA:
        _TASK_DATA[key] = load_task(task, cfg.eval.n_prompts)
    return copy.deepcopy(_TASK_DATA[key])


def _inputs(cfg, tokenizer) -> task_registry.TaskInputs:
    data = task_data(cfg)
    drop_long_prompts(data, tokenizer, getattr(cfg.algo, "max_length", None))
    return task_registry.TaskInputs(data.prompts, data.heldout, data)


task_registry.register("dataset", DatasetTaskConfig, _inputs, check=task_data, is_data=True)
