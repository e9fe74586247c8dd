"""Runs into one tidy pandas frame, from sweep folders or from W&B (the API online, offline run files
without the network). Every source gives the same two frames:

- ``runs``: one row per job: ``source``, ``job`` (its overrides), ``path``, ``status`` (``finished``,
  ``failed``, ``diverged``, or ``unfinished`` when a job has no summary yet), ``reason``, ``regime``,
  ``algo``, ``model``, ``seed``, every scalar of ``summary.json``, and the resolved config flattened as
  ``cfg.<group>.<key>`` columns;
- ``curves``: one row per (job, step) with every metric logged at that step (``eval/*``, ``kl/*``,
  ``cost/*``, ``train/*``).

Nothing is dropped: a failed or unfinished job is a row with its status; the statistics decide what to use.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from ablate.tracking import schema

IDENTITY = ("regime", "algo", "model", "seed")


@dataclass
class RunRecord:
    """One job as any source describes it."""

    job: str
    source: str  # the folder or W&B path it came from
    config: dict[str, Any]  # flattened, dotted keys
    summary: dict[str, Any] | None  # None: no summary yet (unfinished)
    history: list[dict[str, Any]] = field(default_factory=list)  # each with a "step"


@dataclass
class Runs:
    runs: pd.DataFrame
    curves: pd.DataFrame
    sweeps: list[dict[str, Any]] = field(default_factory=list)  # per sweep folder: path, command, overrides

    def finished(self) -> pd.DataFrame:
        return self.runs[self.runs["status"] == "finished"]

    def problems(self) -> pd.DataFrame:
        """Jobs that did not finish: failed, diverged, unfinished."""
        return self.runs[self.runs["status"] != "finished"]


def _flatten(d: dict[str, Any], prefix: str = "", sep: str = ".") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{sep}{k}" if prefix else str(k)
        if isinstance(v, dict) and v:
            out.update(_flatten(v, key, sep))
        else:
            out[key] = v
    return out


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (bool, int, float, str))


def build(records: Iterable[RunRecord], sweeps: list[dict[str, Any]] | None = None, fold: Iterable[str] = ()) -> Runs:
    """The runs' table and their curves; ``fold``: settings labelled in the regime instead of the condition
    (:func:`label_conditions`)."""
    rows, curve_rows = [], []
    for r in records:
        s = r.summary or {}
        cfg = r.config
        row: dict[str, Any] = {
            "job": r.job,
            "path": r.source,
            "status": s.get("status", "unfinished"),
            "reason": s.get("reason", ""),
        }
        if r.summary is None:
            row["reason"] = "no summary.json: still running, or killed before it finished"
        row["regime"] = s.get("regime", cfg.get("ref.name"))
        row["algo"] = s.get("algo", cfg.get("algo.name"))
        row["model"] = s.get("model", cfg.get("model.name"))
        row["seed"] = s.get("seed", cfg.get("seed"))
        for k, v in s.items():
            if k not in row and _scalar(v):
                row[k] = v
        prov = s.get("provenance") or {}
        row["git_commit"] = prov.get("git_commit", "not recorded")
        row["nan_reasons"] = json.dumps(s.get("nan_reasons", {}))
        row.update({f"cfg.{k}": v for k, v in cfg.items() if _scalar(v)})
        rows.append(row)
        for h in r.history:
            curve_rows.append(
                {
                    "job": r.job,
                    "path": r.source,
                    "regime": row["regime"],
                    "algo": row["algo"],
                    "seed": row["seed"],
                    **{k: v for k, v in h.items() if _scalar(v)},
                }
            )
    runs = pd.DataFrame(rows)
    curves = pd.DataFrame(curve_rows)
    if not curves.empty:  # one row per (job, step): train logs and evaluations at the same step merge
        curves = curves.groupby(["path", "step"], as_index=False, sort=True).first()
    for col in schema.report_columns():  # the schema's numeric summary keys
        if col in runs:
            runs[col] = pd.to_numeric(runs[col], errors="coerce")
    label_conditions(runs, fold)
    if not curves.empty:
        curves = curves.drop(columns=["regime"]).merge(runs[["path", "regime", "condition"]], on="path", how="left")
    return Runs(runs=runs, curves=curves, sweeps=sweeps or [])


# config keys that never make two runs different experiments
NOT_A_CONDITION = (
    "cfg.ref.",
    "cfg.seed",
    "cfg.out_dir",
    "cfg.logger.",
    "cfg.threads",
    "cfg.checkpoint.",
    "cfg.save_policy",
    "cfg.model.device",
    "cfg.plan.",
    "cfg.eval.at_start",  # it adds a step-0 evaluation only (tests/test_run.py: training and the end are the same)
)


def _varying(frame: pd.DataFrame, cols: list[str]) -> list[str]:
    return [c for c in cols if frame[c].map(str).nunique(dropna=False) > 1]


def _determined(frame: pd.DataFrame, by: list[str], col: str) -> bool:
    key = frame[by].map(str).agg("|".join, axis=1) if by else pd.Series("", index=frame.index)
    return bool((frame[col].map(str).groupby(key).nunique(dropna=False) <= 1).all())


def _minimal(frame: pd.DataFrame, cols: list[str]) -> list[str]:
    """The varying keys that say something new: a key fixed by the regime (``ref=shared`` turns the adapter
    on) or by keys already kept (``model.precision`` by ``model.name``) is left out of the label."""
    first = ("cfg.algo.name", "cfg.model.name")
    kept: list[str] = []
    for c in sorted(cols, key=lambda c: (c not in first, first.index(c) if c in first else 0, c)):
        if not _determined(frame, kept + ["ref_name"], c):
            kept.append(c)
    return kept


def base_regime(label: str) -> str:
    """The reference's name in a regime label :func:`label_conditions` made (``ema(alpha=0.1)`` -> ``ema``)."""
    return str(label).split("(")[0]


# a number; its minus sign only at the start or after "=", "," or a space (in "SmolLM2-135M" the hyphen is text)
_NUMBER = re.compile(r"((?:(?<=[=,\s])-|^-)?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)")


def natural_key(label: str) -> tuple:
    """A condition label's sort key with its numbers compared as numbers (``algo.beta=0.03`` < ``algo.beta=0.1``
    < ``algo.beta=0.3``; ``steps=9`` < ``steps=10``), the rest as text."""
    parts = _NUMBER.split(str(label))
    return tuple((0, float(p), "") if i % 2 else (1, 0.0, p) for i, p in enumerate(parts))


#: a setting a run may carry without using it, and the summary key that is 0 where it went unused (while the
#: setting is not): GRPO and PPO with ref=none train with no KL term (kl_coef_final 0) whatever their algo.beta says
UNUSED_WHEN_ZERO = {"cfg.algo.beta": "kl_coef_final"}
#: the algorithm's beta, as the runs' table names it
BETA = "cfg.algo.beta"


def uses_setting(runs: pd.DataFrame, setting: str) -> pd.Series:
    """Per run, whether it used ``setting`` (:data:`UNUSED_WHEN_ZERO`; every run uses any other setting). A run
    whose summary lacks the key (unfinished) follows the finished runs of its regime and algorithm."""
    key = UNUSED_WHEN_ZERO.get(setting)
    if key is None or key not in runs:
        return pd.Series(True, index=runs.index)
    found = pd.to_numeric(runs[key], errors="coerce")
    unused = found.eq(0) & pd.to_numeric(runs[setting], errors="coerce").ne(0)
    known = found.notna()
    kind = runs["ref_name"].astype(str) + "|" + runs["algo"].astype(str)
    like_finished = kind.map(unused[known].groupby(kind[known]).all()).astype("boolean").fillna(False).astype(bool)
    return ~(unused | (~known & like_finished))


def label_conditions(runs: pd.DataFrame, fold: Iterable[str] = ()) -> None:
    """``condition``: the settings, other than the reference and the seed, that vary across the runs
    (regimes are compared with the baseline within one condition); ``regime`` becomes the reference's
    name plus its own settings where those vary (``ema(alpha=0.1, tau=5)``), ``ref_name`` keeps the name.
    A setting in ``fold`` (``algo.beta``) is no condition: a run whose value differs from the one most runs have
    carries it in its regime (``ema(algo.beta=0.4)``), so that it is compared with the baseline at the common value
    (a stand-in at a larger beta against ``full`` at the usual one); a run that did not use it (``none``'s beta under
    GRPO: :data:`UNUSED_WHEN_ZERO`) keeps its plain name; ``unfolded`` is the label without its folded beta, its
    other settings kept (``ema(alpha=0.1)`` for ``ema(alpha=0.1, algo.beta=0.4)``: one stand-in across betas). A
    ValueError for a setting no run has."""
    if runs.empty:
        runs["condition"] = []
        runs["unfolded"] = []
        return
    runs["ref_name"] = runs["regime"]
    folded = [f"cfg.{k}" for k in fold]
    for c in folded:
        if c not in runs:
            raise ValueError(f"--fold {c[4:]}: no run has the setting {c[4:]}")
    cfg = [c for c in runs if c.startswith("cfg.")]
    cond = _minimal(runs, _varying(runs, [c for c in cfg if not c.startswith(NOT_A_CONDITION) and c not in folded]))
    runs["condition"] = (
        [
            ", ".join(f"{c[4:]}={r[c]}" for c in cond if not is_missing(r[c])) or "all runs"
            for _, r in runs[cond].iterrows()
        ]
        if cond
        else "all runs"
    )
    labels = runs["regime"].astype(str).copy()
    without_beta = labels.copy()
    used = {c: uses_setting(runs, c) for c in folded}
    common = {c: runs.loc[used[c], c].map(str).mode().iloc[0] if used[c].any() else "" for c in folded}
    for name, g in runs.groupby("ref_name"):
        params = _varying(g, [c for c in cfg if c.startswith("cfg.ref.") and c != "cfg.ref.name"])
        for i, r in g.iterrows():
            own = [f"{c[8:]}={r[c]}" for c in params]
            moved = {c: f"{c[4:]}={r[c]}" for c in folded if used[c][i] and str(r[c]) != common[c]}
            items = own + list(moved.values())
            if items:
                labels[i] = f"{name}(" + ", ".join(items) + ")"
            kept = own + [v for c, v in moved.items() if c != BETA]
            if kept:
                without_beta[i] = f"{name}(" + ", ".join(kept) + ")"
    runs["regime"] = labels
    runs["unfolded"] = without_beta


# ---------------------------------------------------------------------------------------------- folders
def sweep_info(folder: Path) -> dict[str, Any]:
    """The command that made a sweep folder, from Hydra's ``multirun.yaml``."""
    info: dict[str, Any] = {"path": str(folder), "command": None}
    f = folder / "multirun.yaml"
    if f.is_file():
        y = yaml.safe_load(f.read_text())
        ov = (y.get("hydra") or {}).get("overrides") or {}
        task = list(ov.get("task") or [])
        hyd = [o for o in ov.get("hydra") or [] if not o.startswith("hydra.mode=")]
        # the sweep folder as the reader named it, not as an absolute path of the machine that ran it; a folder
        # that is elsewhere now (an archived copy) is left to the preset's own default
        hyd = [
            f"hydra.sweep.dir={folder}" if o.startswith("hydra.sweep.dir=") else o
            for o in hyd
            if not o.startswith("hydra.sweep.dir=") or Path(o.split("=", 1)[1]).resolve() == folder.resolve()
        ]
        info.update(task_overrides=task, hydra_overrides=hyd)
        info["command"] = " ".join(["python -m ablate -m", *task, *hyd])
    return info


# config keys added after runs were committed, each with the value every run from before ran with: such a run's
# config.yaml lacks the key and is read as if it had it, so that it pools with a later run of the same setting
PREDATING_KEYS = {
    "judge.name": "vader",  # the gold reward was VADER's before `judge=` existed
    "safety.name": "profanity",  # the safety judge was alt-profanity-check's before `safety=` existed
}


def load_folder_record(job_dir: Path, root: Path) -> RunRecord:
    from ablate.tracking.run_dir import RunFolder

    folder = RunFolder(job_dir)
    cfg = {**PREDATING_KEYS, **_flatten(yaml.safe_load(folder.config_path.read_text()) or {})}
    try:
        summary = folder.read_summary()
    except json.JSONDecodeError:
        summary = {"status": "failed", "reason": "summary.json is unreadable"}
    history = folder.read_metrics()
    name = str(job_dir.relative_to(root)) if job_dir != root else job_dir.name
    return RunRecord(job=name, source=str(job_dir), config=cfg, summary=summary, history=history)


def load_runs(
    *folders: str | Path,
    regimes: Iterable[str] | None = None,
    seeds: Iterable[int] | None = None,
    fold: Iterable[str] = (),
) -> Runs:
    """Every job below the given sweep (or run) folders; with ``regimes``, only the jobs of those references (by
    name: ``ema`` keeps every ``ema(...)`` variant); with ``seeds``, only the jobs of those seeds (conditions
    compared on the same seeds when one sweep ran more of them); ``fold``: :func:`label_conditions`."""
    from ablate.status import job_dirs

    records, sweeps = [], []
    for f in map(Path, folders):
        if not f.exists():
            raise FileNotFoundError(f"no such folder: {f}")
        sweeps.append(sweep_info(f))
        records += [load_folder_record(d, f) for d in job_dirs(f)]
    if not records:
        raise ValueError(f"no run folders (with config.yaml) below {', '.join(map(str, folders))}")
    for what, config_key, wanted in (("regime", "ref.name", regimes), ("seed", "seed", seeds)):
        if wanted is not None:
            records = _only(records, what, config_key, set(wanted), folders)
    return build(records, sweeps, fold)


def _only(records: list[RunRecord], what: str, config_key: str, wanted: set, folders) -> list[RunRecord]:
    """The records whose ``what`` (the summary's key, else the config's ``config_key``) is among ``wanted``; one
    wanted value no record has is an error."""
    value = lambda r: (r.summary or {}).get(what, r.config.get(config_key))  # noqa: E731
    missing = sorted(wanted - {value(r) for r in records})
    if missing:
        raise ValueError(f"no runs of {what} {', '.join(map(str, missing))} below {', '.join(map(str, folders))}")
    return [r for r in records if value(r) in wanted]


# -------------------------------------------------------------------------------------------------- W&B
def _from_wandb_fields(name: str, source: str, config: dict, summary: dict, history: list[dict]) -> RunRecord:
    """A run as W&B stores it (config flattened with '/', history with '_step') as a RunRecord."""
    cfg = {k.replace("/", "."): v for k, v in config.items() if not k.startswith("_")}
    summ = {k: v for k, v in summary.items() if not k.startswith("_")} if summary else None
    if summ is not None and "status" not in summ:
        summ = None  # no ablate summary: the run never reached its end
    hist = []
    for h in history:
        step = h.get("_step", h.get("step"))
        if step is None:
            continue
        hist.append({"step": int(step), **{k: v for k, v in h.items() if not k.startswith("_")}})
    return RunRecord(job=name, source=source, config=cfg, summary=summ, history=hist)


def _nan(v):
    return float("nan") if v == "NaN" else v


def from_wandb_offline(*folders: str | Path) -> Runs:
    """Every W&B offline run below the folders, read from its transaction log (no network)."""
    from ablate.tracking.wandb_offline import offline_runs, read_offline_run

    records = []
    for f in folders:
        for p in offline_runs(f):
            r = read_offline_run(p)
            summary = {k: _nan(v) for k, v in r.summary.items()}
            records.append(_from_wandb_fields(r.name, str(p), r.config, summary, r.history))
    if not records:
        raise ValueError(f"no W&B offline runs below {', '.join(map(str, folders))}")
    return build(records)


def from_wandb(project: str, group: str, entity: str | None = None, api=None) -> Runs:
    """Runs of one W&B group through the public API (needs network and `wandb login`)."""
    if api is None:
        import wandb

        api = wandb.Api()
    path = f"{entity}/{project}" if entity else project
    records = []
    for run in api.runs(path, filters={"group": group}):
        history = list(run.scan_history())
        records.append(
            _from_wandb_fields(run.name, f"wandb:{path}/{run.id}", dict(run.config), dict(run.summary_metrics), history)
        )
    if not records:
        raise ValueError(f"no W&B runs in {path} with group {group!r}")
    return build(records)


def from_recorded(path: str | Path) -> Runs:
    """Runs from a JSON recording of the W&B API's answers (a list of {name, config, summary, history})."""
    data = json.loads(Path(path).read_text())
    return build(
        [
            _from_wandb_fields(d["name"], f"recorded:{d.get('id', d['name'])}", d["config"], d["summary"], d["history"])
            for d in data
        ]
    )


def is_missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v))
