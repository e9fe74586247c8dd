"""Tests for ablate.tracking.run_dir."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from ablate.tracking.run_dir import (
    STATUSES,
    SUMMARY_KEYS,
    RunFolder,
    atomic_write_json,
    atomic_write_text,
    to_python,
)


def strict_loads(text: str) -> object:
    """json.loads that refuses the non-standard NaN/Infinity/-Infinity tokens."""

    def refuse(token: str) -> None:
        raise ValueError(f"not strict JSON: {token}")

    return json.loads(text, parse_constant=refuse)


def _same(a: object, b: object) -> bool:
    """Equal, NaN equal to NaN, a float never equal to None."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


def _summary(**overrides: object) -> dict[str, object]:
    base: dict[str, object] = {k: 0.5 for k in SUMMARY_KEYS}
    base.update(status="finished", steps=10)
    base.update(overrides)
    return base


def test_summary_keys_exact() -> None:
    assert SUMMARY_KEYS == (
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
    assert STATUSES == ("finished", "failed", "diverged")


def test_every_summary_key_is_documented() -> None:
    from ablate.run import SUMMARY_FROM_METRICS
    from ablate.tracking.run_dir import SUMMARY_DOCS

    assert set(SUMMARY_KEYS) | set(SUMMARY_FROM_METRICS) <= set(SUMMARY_DOCS)
    assert "stand-in divergence" in SUMMARY_DOCS["kl_approx"]
    assert "kl_rel_err" not in SUMMARY_FROM_METRICS  # a ratio to a true KL that is small only in short runs


def test_atomic_writes_content_and_no_temp_files(tmp_path: Path) -> None:
    atomic_write_text(tmp_path / "a.txt", "hello\n")
    atomic_write_text(tmp_path / "a.txt", "world\n")  # overwrite
    atomic_write_json(tmp_path / "b.json", {"x": [1, 2], "y": "z"})
    assert (tmp_path / "a.txt").read_text() == "world\n"
    assert json.loads((tmp_path / "b.json").read_text()) == {"x": [1, 2], "y": "z"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "b.json"]


def test_atomic_write_failure_keeps_old_file(tmp_path: Path) -> None:
    target = tmp_path / "c.json"
    atomic_write_json(target, {"ok": 1})
    with pytest.raises(TypeError):
        atomic_write_text(target, 123)  # type: ignore[arg-type]
    assert json.loads(target.read_text()) == {"ok": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["c.json"]


def test_write_config_resolved(tmp_path: Path) -> None:
    cfg = OmegaConf.create({"a": 3, "b": "${a}", "nested": {"c": "x-${a}"}})
    folder = RunFolder(tmp_path / "run")
    folder.write_config(cfg)
    loaded = OmegaConf.load(folder.config_path)
    assert loaded.b == 3 and loaded.nested.c == "x-3"
    assert "${" not in folder.config_path.read_text()


def test_summary_missing_keys_named(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    bad = _summary()
    del bad["kl_true"], bad["wall_s"]
    with pytest.raises(ValueError, match="kl_true") as info:
        folder.write_summary(bad)
    assert "wall_s" in str(info.value)
    assert not folder.summary_path.exists()
    assert folder.read_summary() is None


def test_summary_bad_status(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    with pytest.raises(ValueError, match="status"):
        folder.write_summary(_summary(status="done"))
    assert not folder.summary_path.exists()


def test_summary_is_strict_json_with_null_and_its_reason(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    reasons = {"kl_true": "policy diverged"}
    folder.write_summary(
        _summary(
            status="diverged",
            kl_true=float("nan"),
            ppl=np.float32("inf"),
            length=-math.inf,
            win_rate=float("nan"),  # no reason given
            ref_bytes=np.int64(1234),
            ref_hit_rate=float("nan"),  # a regime's own figure, not in the schema
            provenance={"x": [1.0, float("nan")]},
            nan_reasons=reasons,
        )
    )
    raw = strict_loads(folder.summary_path.read_text())
    assert raw["kl_true"] is None and raw["ppl"] is None and raw["length"] is None and raw["win_rate"] is None
    assert raw["ref_hit_rate"] is None and raw["provenance"] == {"x": [1.0, None]}
    why = raw["nan_reasons"]
    assert why["kl_true"] == "policy diverged"  # the reason given is kept
    assert why["ppl"].startswith("+inf") and why["length"].startswith("-inf") and why["win_rate"].startswith("NaN")
    assert "ref_hit_rate" in why and set(why) == {"kl_true", "ppl", "length", "win_rate", "ref_hit_rate"}
    assert reasons == {"kl_true": "policy diverged"}  # the caller's mapping is not changed
    out = folder.read_summary()
    assert out is not None
    for key in ("kl_true", "win_rate", "ref_hit_rate"):
        assert isinstance(out[key], float) and math.isnan(out[key]), key
    assert out["ppl"] == math.inf and out["length"] == -math.inf  # an infinity reads back as itself, not as NaN
    assert out["ref_bytes"] == 1234 and isinstance(out["ref_bytes"], int)
    assert out["nan_reasons"] == why and out["status"] == "diverged"


def test_summary_without_nan_gets_no_reasons_key(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.write_summary(_summary())
    assert "nan_reasons" not in strict_loads(folder.summary_path.read_text())


def test_old_nan_token_summary_reads_as_the_strict_one(tmp_path: Path) -> None:
    """A summary.json an older run wrote with NaN/Infinity tokens reads to the same numbers as the strict file
    written now; a null that is not a number (no reason, not a numeric schema key) stays None."""
    summary = _summary(kl_true=float("nan"), ref_hit_rate=float("nan"), nan_reasons={"kl_true": "none"})
    new = RunFolder(tmp_path / "new")
    new.write_summary(summary)
    old = RunFolder(tmp_path / "old")
    old_reasons = {
        "kl_true": "none",
        "ref_hit_rate": strict_loads(new.summary_path.read_text())["nan_reasons"]["ref_hit_rate"],
    }
    old.summary_path.write_text(json.dumps({**summary, "nan_reasons": old_reasons, "note": None}, indent=2))
    a, b = old.read_summary(), new.read_summary()
    assert a is not None and b is not None and a.pop("note") is None
    assert _same(a, b) and math.isnan(b["kl_true"]) and math.isnan(b["ref_hit_rate"])


def test_metrics_nan_and_types(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.log_metrics(np.int64(0), {"loss": np.float32(0.5), "kl": float("nan"), "t": torch.tensor(2.0)})
    line = folder.metrics_path.read_text().splitlines()[0]
    row = strict_loads(line)
    assert row["step"] == 0 and isinstance(row["time"], float)
    assert row["loss"] == 0.5 and row["t"] == 2.0 and row["kl"] is None
    assert row["nan_reasons"] == {"kl": "NaN, with no reason given by the code that computed it"}
    (back,) = folder.read_metrics()
    assert math.isnan(back["kl"]) and back["loss"] == 0.5
    with pytest.raises(ValueError, match="step"):
        folder.log_metrics(1, {"step": 3})
    with pytest.raises(ValueError, match="nan_reasons"):
        folder.log_metrics(1, {"nan_reasons": 3})


def test_a_metrics_line_says_why_each_null_is_null_and_an_infinity_reads_back(tmp_path: Path) -> None:
    """The rule summary.json keeps, per evaluation: a null in metrics.jsonl carries its reason (the evaluation's,
    or what the value was), and an infinite divergence reads back as +inf, not as a NaN nobody computed."""
    folder = RunFolder(tmp_path)
    metrics = {"kl/approx": math.inf, "kl/abs_err": math.inf, "eval/ppl": float("nan"), "kl/true": 0.5}
    folder.log_metrics(0, metrics, reasons={"eval/ppl": "no tokens scored", "kl/true": "unused: finite"})
    folder.log_metrics(20, {"kl/approx": 1.5, "kl/true": 0.5})
    first, second = (strict_loads(x) for x in folder.metrics_path.read_text().splitlines())
    assert first["kl/approx"] is None and first["nan_reasons"] == {
        "kl/approx": "+inf (JSON has no infinity: written as null)",
        "kl/abs_err": "+inf (JSON has no infinity: written as null)",
        "eval/ppl": "no tokens scored",
    }
    assert "nan_reasons" not in second  # a line with only numbers gets none
    back, _ = folder.read_metrics()
    assert back["kl/approx"] == math.inf and back["kl/abs_err"] == math.inf and math.isnan(back["eval/ppl"])
    folder.truncate_metrics(0)  # a resume rewrites the lines it keeps, reasons and all
    (kept,) = folder.read_metrics()
    assert kept["kl/approx"] == math.inf and kept["nan_reasons"] == first["nan_reasons"]


def test_a_rewritten_metrics_line_keeps_reasons_only_for_its_nulls(tmp_path: Path) -> None:
    """A line read back with a reason for a value that is a number (a hand-edited file) and a null with none: the
    resume's rewrite gives the null its reason and drops the number's, as a fresh line would have them."""
    folder = RunFolder(tmp_path)
    folder.metrics_path.write_text('{"step": 0, "kl": null, "loss": 0.5, "nan_reasons": {"loss": "stale"}}\n')
    folder.truncate_metrics(0)
    (line,) = folder.metrics_path.read_text().splitlines()
    assert strict_loads(line)["nan_reasons"] == {"kl": "NaN, with no reason given by the code that computed it"}


def test_an_evaluations_reasons_go_to_its_logged_names() -> None:
    from ablate.tracking import schema

    metrics = {"kl/approx": float("nan"), "kl/true": 2.0, "eval/ppl": math.inf, "cost/ref_bytes": float("nan")}
    given = {"kl_approx": "ref=cached has no next-token distribution", "ppl": "x", "kl_true": "y"}
    why = schema.logged_reasons(given, metrics)
    assert why == {"kl/approx": "ref=cached has no next-token distribution"}  # by its logged name
    # an infinity keeps the writer's reason, a finite value needs none, a NaN without one gets the writer's


def test_metrics_append_across_folders(tmp_path: Path) -> None:
    RunFolder(tmp_path).log_metrics(0, {"loss": 1.0})
    RunFolder(tmp_path).log_metrics(1, {"loss": 0.5})
    rows = RunFolder(tmp_path).read_metrics()
    assert [(r["step"], r["loss"]) for r in rows] == [(0, 1.0), (1, 0.5)]


def test_truncated_last_line_skipped(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.log_metrics(0, {"loss": 1.0})
    folder.log_metrics(1, {"loss": 0.5})
    with open(folder.metrics_path, "a") as fh:
        fh.write('{"step": 2, "lo')  # simulated kill mid-write
    with pytest.warns(RuntimeWarning, match="truncated"):
        rows = folder.read_metrics()
    assert [r["step"] for r in rows] == [0, 1]
    # A later append (resumed job) still produces a parseable record.
    folder.log_metrics(3, {"loss": 0.25})
    with pytest.warns(RuntimeWarning):
        rows = folder.read_metrics()
    assert [r["step"] for r in rows] == [0, 1, 3]


def test_metrics_strict_lines_and_old_nan_token_lines_read_the_same(tmp_path: Path) -> None:
    new = RunFolder(tmp_path / "new")
    new.log_metrics(0, {"kl/approx": float("nan"), "train/loss": math.inf, "kl/true": 0.5})
    new.log_metrics(1, {"kl/approx": -math.inf, "kl/true": 0.25})
    for line in new.metrics_path.read_text().splitlines():
        strict_loads(line)
    old = RunFolder(tmp_path / "old")  # an older writer: NaN/Infinity tokens, no reasons
    rows = [{k: v for k, v in r.items() if k != "nan_reasons"} for r in new.read_metrics()]
    old.metrics_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert "NaN" in old.metrics_path.read_text() and "Infinity" in old.metrics_path.read_text()
    a, b = old.read_metrics(), new.read_metrics()
    assert _same(a, [{k: v for k, v in r.items() if k != "nan_reasons"} for r in b])
    assert all(isinstance(r["kl/approx"], float) and not math.isfinite(r["kl/approx"]) for r in b)
    assert b[0]["train/loss"] == math.inf and b[1]["kl/approx"] == -math.inf
    new.truncate_metrics(0)  # rewritten strict
    (only,) = [strict_loads(line) for line in new.metrics_path.read_text().splitlines()]
    assert only["step"] == 0 and only["kl/approx"] is None


def test_read_metrics_missing_file(tmp_path: Path) -> None:
    assert RunFolder(tmp_path / "new").read_metrics() == []


def test_write_samples(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    folder.write_samples([{"prompt": "p", "reward": np.float64(1.5)}, {"prompt": "q", "reward": float("nan")}])
    rows = [strict_loads(x) for x in folder.samples_path.read_text().splitlines()]
    assert rows[0] == {"prompt": "p", "reward": 1.5} and rows[1] == {"prompt": "q", "reward": None}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["samples.jsonl"]


def test_to_python_scalars() -> None:
    f = to_python(np.float32(0.25))
    i = to_python(np.int64(7))
    t = to_python(torch.tensor(1.5))
    ti = to_python(torch.tensor(3))
    assert type(f) is float and f == 0.25
    assert type(i) is int and i == 7
    assert type(t) is float and t == 1.5
    assert type(ti) is int and ti == 3
    assert type(to_python(np.bool_(True))) is bool
    nested = to_python({"a": [np.int32(1), torch.tensor([1.0, 2.0])], "b": np.array(2.0)})
    assert nested == {"a": [1, [1.0, 2.0]], "b": 2.0} and type(nested["b"]) is float
    OmegaConf.create(to_python({"x": np.float32(1.0), "y": np.int64(2)}))  # accepted


def test_each_evaluation_adds_its_samples_and_a_resume_truncates_them(tmp_path: Path) -> None:
    folder = RunFolder(tmp_path)
    rows = lambda step, n: [{"step": step, "prompt": f"p{i}", "reward": float(step + i)} for i in range(n)]  # noqa: E731
    folder.add_samples(rows(0, 2))
    folder.add_samples(rows(20, 2))
    folder.add_samples(rows(40, 3))
    assert [r["step"] for r in folder.read_samples()] == [0, 0, 20, 20, 40, 40, 40]
    folder.add_samples(rows(40, 1))  # the same evaluation written again: replaced, not doubled
    assert [r["step"] for r in folder.read_samples()] == [0, 0, 20, 20, 40]
    folder.truncate_samples(20)  # a job resuming from its checkpoint at step 20
    assert [r["step"] for r in folder.read_samples()] == [0, 0, 20, 20]
    assert folder.read_samples()[3] == {"step": 20, "prompt": "p1", "reward": 21.0}


def test_the_read_only_folder_takes_what_the_run_folder_takes() -> None:
    """Processes other than rank 0 get a ReadOnlyFolder: each method it overrides must accept the same arguments
    (a new keyword on RunFolder alone fails only in a two-process job)."""
    import inspect

    from ablate.tracking.run_dir import ReadOnlyFolder

    overridden = [n for n, f in vars(ReadOnlyFolder).items() if callable(f) and not n.startswith("_")]
    assert "log_metrics" in overridden
    for name in overridden:
        assert inspect.signature(getattr(ReadOnlyFolder, name)) == inspect.signature(getattr(RunFolder, name)), name
