"""ablate.hydra_fence: every use of Hydra beyond its documented API, checked against the installed Hydra."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path

import pytest

from ablate import hydra_fence
from ablate.errors import MissingAsset
from ablate.versions import DEPENDENCIES

ABLATE = Path(hydra_fence.__file__).parent


def test_the_installed_hydra_keeps_the_contract():
    assert "==" + importlib.metadata.version("hydra-core") == DEPENDENCIES["hydra-core"]
    assert hydra_fence.problems() == []
    hydra_fence.check()


def test_a_broken_contract_is_one_line(monkeypatch):
    real = hydra_fence.parse
    # a parser that no longer splits values at commas: seed=0,1 is one value
    monkeypatch.setattr(hydra_fence, "parse", lambda lines: real([line.replace(",", "_") for line in lines]))
    with pytest.raises(MissingAsset) as e:
        hydra_fence.check()
    line = str(e.value)
    assert "\n" not in line and "is incompatible with ablate (checked with hydra-core==" in line
    assert "no longer expands seed=0,1 to 0 and 1" in line and line.endswith(
        f"install hydra-core{DEPENDENCIES['hydra-core']}"
    )


def test_only_the_fence_imports_hydra_s_private_modules():
    private = ("hydra.core.override_parser", "hydra.core.global_hydra", "hydra.types", "hydra.experimental")
    outside = [
        f"{p.relative_to(ABLATE.parent)}: {name}"
        for p in ABLATE.rglob("*.py")
        if p.name != "hydra_fence.py"
        for name in private
        if name in p.read_text()
    ]
    assert outside == []


def test_importing_the_fence_does_not_import_hydra():
    code = "import sys, ablate.hydra_fence; print('hydra' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
