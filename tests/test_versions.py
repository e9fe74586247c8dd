"""One table of version pins (``ablate.versions``): it agrees with pyproject.toml and scripts/setup.sh, and the
install commands the command line and the regimes print come from it."""

from __future__ import annotations

import re

import tomllib
from packaging.requirements import Requirement

from ablate import cli, versions
from ablate.refs.quantized import BNB
from tests.conftest import REPO


def test_the_table_is_pyproject_dependencies():
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    declared = {r.name: str(r.specifier) for r in map(Requirement, deps)}
    table = {name: str(Requirement(name + spec).specifier) for name, spec in versions.DEPENDENCIES.items()}
    assert table == declared


def test_the_table_is_what_setup_installs():
    installed = dict(re.findall(r"install (?:--no-deps )?([A-Za-z0-9_.-]+)==([0-9][0-9A-Za-z.]*)", _setup()))
    assert installed == versions.SETUP
    for name, version in versions.SETUP.items():  # torch: tested with one version, any >= 2.4 accepted
        assert Requirement(name + versions.DEPENDENCIES.get(name, "")).specifier.contains(version), name


def _setup() -> str:
    return (REPO / "scripts" / "setup.sh").read_text()


def test_install_commands_come_from_the_table():
    assert versions.pip_spec("torch") == "torch==2.13.0" == cli.REQUIRED["torch"][0]
    assert versions.pip_spec("gguf") == "gguf"  # a range, not a pin: the bare name (no shell quoting)
    commands = {**cli.REQUIRED, **cli.COMPOSE_TIME, **BNB}
    for pip_arg, _why in commands.values():
        assert pip_arg == versions.pip_spec(re.split("==", pip_arg)[0]), pip_arg


def test_no_pin_in_the_code_disagrees_with_the_table():
    """Any ``name==version`` written in ablate/ (messages, hints) names the table's version."""
    pins = {**{n: s.removeprefix("==") for n, s in versions.DEPENDENCIES.items()}, **versions.SETUP}
    for path in (REPO / "ablate").rglob("*.py"):
        for name, version in re.findall(r"\b([A-Za-z][A-Za-z0-9_-]*)==([0-9][0-9.]*[0-9])", path.read_text()):
            if name in pins:
                assert version == pins[name], f"{path.relative_to(REPO)}: {name}=={version}, table: {pins[name]}"
