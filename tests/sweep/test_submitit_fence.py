"""ablate.sweep.submitit_fence: every use of submitit's private API, checked against the installed submitit before
``slurm-preview`` renders a job script."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from ablate.errors import MissingAsset
from ablate.versions import DEPENDENCIES

pytest.importorskip("submitit")

from ablate.sweep import submitit_fence  # noqa: E402
from ablate.sweep.__main__ import main  # noqa: E402

ABLATE = Path(submitit_fence.__file__).parents[1]


def test_the_installed_submitit_keeps_the_contract():
    assert "==" + importlib.metadata.version("submitit") == DEPENDENCIES["submitit"]
    assert submitit_fence.problems() == []
    submitit_fence.check()


def test_a_parameter_submitit_no_longer_converts_is_one_line(monkeypatch):
    from submitit.slurm.slurm import SlurmExecutor

    # a submitit that no longer maps the shared timeout_min onto SLURM's time
    real = SlurmExecutor._equivalence_dict.__func__
    monkeypatch.setattr(
        SlurmExecutor,
        "_equivalence_dict",
        classmethod(lambda cls: {k: v for k, v in real(cls).items() if k != "timeout_min"}),
    )
    with pytest.raises(MissingAsset) as e:
        submitit_fence.check()
    line = str(e.value)
    assert "\n" not in line and "is incompatible with ablate (checked with submitit==" in line
    assert "rendering a job script fails" in line and line.endswith(f"install submitit{DEPENDENCIES['submitit']}")


def test_a_script_that_renders_otherwise_is_named(monkeypatch):
    from submitit.slurm import slurm

    # a submitit whose job script drops the array's limit on jobs at a time
    real = slurm._make_sbatch_string
    monkeypatch.setattr(slurm, "_make_sbatch_string", lambda *a, **kw: real(*a, **kw).replace("%2\n", "\n"))
    found = submitit_fence.problems()
    assert len(found) == 1 and "'array': '0-2'" in found[0], found


def test_slurm_preview_checks_the_contract_first(monkeypatch):
    monkeypatch.setattr(
        submitit_fence,
        "_problems_by_library",
        lambda: {"submitit": ["the job script no longer runs submitit.core._submit"]},
    )
    with pytest.raises(MissingAsset, match=r"^submitit .* is incompatible with ablate .*core\._submit; install"):
        main(["slurm-preview", "seeds"])


def test_only_the_fence_imports_submitit():
    outside = [
        str(p.relative_to(ABLATE.parent))
        for p in ABLATE.rglob("*.py")
        if p.name != "submitit_fence.py"
        if re.search(r"^\s*(from|import) (submitit|hydra_plugins\.hydra_submitit_launcher)\b", p.read_text(), re.M)
    ]
    assert outside == []


def test_a_launcher_plugin_that_changed_names_the_plugin(monkeypatch):
    monkeypatch.setattr(submitit_fence, "launcher_params", lambda launcher: {})  # parameters kept elsewhere
    with pytest.raises(MissingAsset) as e:
        submitit_fence.check()
    line = str(e.value)
    assert line.startswith("hydra-submitit-launcher 1.2.0 is incompatible with ablate")
    assert "SlurmLauncher no longer keeps its parameters as params" in line
    assert line.endswith("install hydra-submitit-launcher==1.2.0")


def test_a_missing_package_is_named_not_installed(monkeypatch):
    from ablate.versions import incompatible

    def version(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    assert incompatible("submitit", ["x"]).startswith("submitit (not installed) is incompatible with ablate")
