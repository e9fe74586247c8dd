"""Per-run output folder: resolved config, metrics log, samples and summary.

All whole-file writes are atomic (temp file in the same directory, fsync,
``os.replace``), so a killed job never leaves a half-written file. JSON is
written with Python's ``allow_nan=True``: NaN/inf appear as the non-standard
tokens ``NaN``/``Infinity``/``-Infinity``, which ``json.loads`` and pandas
read back as floats.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig, OmegaConf

__all__ = [
    "SUMMARY_DOCS",
    "SUMMARY_KEYS",
    "STATUSES",
    "RunFolder",
    "atomic_write_json",
    "atomic_write_text",
    "to_python",
]

SUMMARY_KEYS: tuple[str, ...] = (
    "status",
    "steps",
    "win_rate",
    "win_rate_lo",
    "win_rate_hi",
    "reward_gold",
    "kl_true",
    "kl_approx",
    "kl_abs_err",
    "ppl",
    "length",
    "rep_2",
    "distinct_2",
    "unsafe_rate",
    "ref_bytes",
    "ref_ms_per_step",
    "wall_s",
)
STATUSES: tuple[str, ...] = ("finished", "failed", "diverged")

#: What each summary key measures (units: nats are summed over a response, then averaged over responses).
#: ``<key>_step0`` is the same figure at step 0, where the policy is the SFT model.
SUMMARY_DOCS: dict[str, str] = {
    "status": "finished | failed | diverged",
    "steps": "optimiser steps completed",
    "win_rate": "share of evaluation prompts whose policy response beats the SFT model's by gold reward "
    "(ties count half)",
    "win_rate_lo": "95% Wilson interval, lower end (valid but conservative with half ties)",
    "win_rate_hi": "95% Wilson interval, upper end (valid but conservative with half ties)",
    "reward_gold": "mean gold reward (VADER compound) of the policy's evaluation responses",
    "reward_gold_sft": "mean gold reward of the SFT model's responses to the same prompts",
    "reward_proxy": "mean learned (proxy) reward of the policy's responses; NaN when the run trains on gold",
    "kl_true": "true KL: exact KL(policy || full reference) per response token, summed over each sampled "
    "response and averaged (float64 log-softmax); the judge of truth, whatever the regime",
    "kl_true_k1": "Schulman's k1 estimate of kl_true from the sampled tokens (unbiased, can be negative)",
    "kl_true_k3": "Schulman's k3 estimate of kl_true from the sampled tokens (unbiased, >= 0)",
    "kl_approx": "stand-in divergence: exact KL(policy || the regime's reference) on the same fresh evaluation "
    "samples. It is the KL a KL-penalised algorithm (PPO/GRPO) would see; DPO never computes a KL "
    "and consumes only sequence log-probs of its training pairs, so for DPO it describes the "
    "stand-in, not what training used. NaN where the stand-in has no next-token distribution "
    "(cached) or there is none (none)",
    "kl_abs_err": "|kl_approx - kl_true| (nats per response)",
    "logp_mae": "mean absolute error of the stand-in's per-token log-probs against the full reference's, on the "
    "policy's evaluation samples",
    "logp_rmse": "root-mean-square of the same per-token log-prob error",
    "logp_max_err": "largest absolute per-token log-prob error",
    "ppl": "perplexity of the policy on held-out plain text",
    "length": "mean response length in tokens (EOS included; capped at task.max_new_tokens)",
    "rep_2": "mean share of repeated bigrams within a response",
    "distinct_2": "distinct bigrams over all bigrams across the responses",
    "unsafe_rate": "share of responses the safety judge scores at or above task.unsafe_threshold",
    "ref_bytes": "bytes the reference holds in memory (weights, adapters, caches)",
    "ref_ms_per_step": "reference time per optimiser step (training calls only, not audits)",
    "wall_s": "wall time of the job, earlier attempts of a resumed job included",
}

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
SUMMARY_FILE = "summary.json"


def _is_torch_tensor(value: Any) -> bool:
    """True for a torch.Tensor, without importing torch."""
    cls = type(value)
    return cls.__module__.startswith("torch") and hasattr(value, "detach")


def to_python(value: Any) -> Any:
    """Convert numpy/torch scalars and arrays (recursively) to plain Python.

    Scalars become ``int``/``float``/``bool``/``str``; arrays and multi-element
    tensors become lists; mappings and sequences are converted element-wise;
    ``Path`` becomes ``str``. Anything else is returned unchanged.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.item() if value.ndim == 0 else value.tolist()
    if _is_torch_tensor(value):
        t = value.detach().cpu()
        return t.item() if t.dim() == 0 else t.tolist()
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if OmegaConf.is_config(value):
        return to_python(OmegaConf.to_container(value, resolve=True))
    if isinstance(value, Mapping):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_python(v) for v in value]
    return value


def _dumps(obj: Any, **kwargs: Any) -> str:
    """json.dumps with NaN allowed and unknown objects stringified."""
    return json.dumps(to_python(obj), allow_nan=True, default=str, **kwargs)


def _fsync_dir(directory: Path) -> None:
    """Best-effort fsync of a directory so a rename survives a crash."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` atomically (temp file + fsync + replace)."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp_name, 0o644)
        os.replace(tmp_name, target)
    except BaseException:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(target.parent)
    return target


def atomic_write_json(path: str | os.PathLike[str], obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically; NaN/inf kept as ``NaN`` tokens."""
    return atomic_write_text(path, _dumps(obj, indent=2) + "\n")


class RunFolder:
    """One run's output directory (created on construction)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"RunFolder({str(self.path)!r})"

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_FILE

    @property
    def metrics_path(self) -> Path:
        return self.path / METRICS_FILE

    @property
    def samples_path(self) -> Path:
        return self.path / SAMPLES_FILE

    @property
    def summary_path(self) -> Path:
        return self.path / SUMMARY_FILE

    def write_config(self, cfg: DictConfig | Mapping[str, Any]) -> Path:
        """Write the resolved config to ``config.yaml`` atomically."""
        if not OmegaConf.is_config(cfg):
            cfg = OmegaConf.create(to_python(dict(cfg)))
        return atomic_write_text(self.config_path, OmegaConf.to_yaml(cfg, resolve=True))

    def log_metrics(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Append ``{"step", "time", **metrics}`` as one fsynced JSON line.

        If the file ends in a partial line (killed writer), a newline is added
        first so the new record stays parseable.
        """
        clash = {"step", "time"} & set(metrics)
        if clash:
            raise ValueError(f"metric names reserved by log_metrics: {sorted(clash)}")
        record = {"step": int(to_python(step)), "time": time.time(), **metrics}
        line = _dumps(record) + "\n"
        with open(self.metrics_path, "a+b") as fh:
            if fh.tell() > 0:
                fh.seek(-1, os.SEEK_END)
                if fh.read(1) != b"\n":
                    line = "\n" + line
            fh.write(line.encode("utf-8"))
            fh.flush()
            os.fsync(fh.fileno())

    def read_metrics(self) -> list[dict[str, Any]]:
        """Read ``metrics.jsonl``; unparseable (e.g. truncated) lines are skipped with a warning."""
        if not self.metrics_path.exists():
            return []
        rows: list[dict[str, Any]] = []
        text = self.metrics_path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                warnings.warn(
                    f"{self.metrics_path}:{lineno}: skipping truncated/corrupt line",
                    RuntimeWarning,
                    stacklevel=2,
                )
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def truncate_metrics(self, step: int) -> None:
        """Keep only the records up to ``step`` (a job resuming from its checkpoint at ``step`` logs the
        later ones again); rewritten atomically."""
        rows = [r for r in self.read_metrics() if int(r.get("step", 0)) <= step]
        atomic_write_text(self.metrics_path, "".join(_dumps(r) + "\n" for r in rows))

    def write_samples(self, rows: list[Mapping[str, Any]]) -> Path:
        """Write generation samples to ``samples.jsonl`` atomically."""
        text = "".join(_dumps(dict(r)) + "\n" for r in rows)
        return atomic_write_text(self.samples_path, text)

    def write_summary(self, summary: Mapping[str, Any]) -> Path:
        """Validate and atomically write ``summary.json``.

        Every key in ``SUMMARY_KEYS`` must be present (values may be NaN/None);
        ``status`` must be in ``STATUSES``. Extra keys (e.g. ``nan_reasons``,
        a dict metric -> reason) are kept.
        """
        missing = [k for k in SUMMARY_KEYS if k not in summary]
        if missing:
            raise ValueError(f"summary is missing required keys: {', '.join(missing)}")
        status = summary["status"]
        if status not in STATUSES:
            raise ValueError(f"summary status {status!r} not in {STATUSES}")
        reasons = summary.get("nan_reasons")
        if reasons is not None and not isinstance(reasons, Mapping):
            raise ValueError("summary 'nan_reasons' must be a mapping of key -> reason")
        return atomic_write_json(self.summary_path, dict(summary))

    def read_summary(self) -> dict[str, Any] | None:
        """Return the parsed ``summary.json``, or None if it does not exist."""
        if not self.summary_path.exists():
            return None
        with open(self.summary_path, encoding="utf-8") as fh:
            return json.load(fh)
