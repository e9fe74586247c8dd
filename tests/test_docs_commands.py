"""Every command in README.md and docs/*.md still parses and composes as written, so a renamed option, group, key or
subcommand breaks this test, not a reader. Commands are read from the fenced ``bash`` blocks (and the ``$ ``
lines of plain blocks); none is run: ``python -m ablate`` commands (and ``accelerate launch -m ablate``) are
composed and validated job by job, with the CLI's launcher check, as the CLI's preflight does, but without
looking for models, data files or packages (those need the machine the command is meant for); the audit's and the
bench's commands compose each regime's config the same way; the argparse tools (``analysis``, ``ablate.sweep``,
``ablate.status``, ``ablate.export``, ...) parse their arguments and stop. A ``$ `` line followed by ``ablate: error:``
must fail the full preflight with that very line. The README's own-data block is also run as written, on the tiny
model, by ``tests/tasks/test_readme_own_data.py``."""

from __future__ import annotations

import argparse
import re
import runpy
import shlex
import sys

import pytest

from tests.conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
ARGPARSE_TOOLS = ("analysis", "ablate.sweep", "ablate.status", "ablate.export", "ablate.metrics_doc")
SCRIPTS = ("scripts/setup.sh", ".ci/run")
OTHER_PROGRAMS = ("wandb", "hf")  # not ours: documented, not checked


def _blocks(text: str) -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", text, re.S | re.M)


def doc_commands(page) -> list[tuple[str, str | None]]:
    """(command, the error line shown after it or None) for every command of a page."""
    out = []
    for lang, body in _blocks(page.read_text()):
        if lang == "bash" and body.lstrip().startswith("export "):
            continue  # a block that sets up its own environment is run as written by its own test (test_plugins.py)
        if lang == "bash":
            joined = re.sub(r"\\\n\s*", " ", body)
            for line in joined.splitlines():
                if line.strip() and not line.lstrip().startswith("#"):
                    out.append((line.strip(), None))
        elif lang == "":
            lines = body.splitlines()
            for i, line in enumerate(lines):
                if line.startswith("$ "):
                    nxt = lines[i + 1] if i + 1 < len(lines) else ""
                    out.append((line[2:], nxt if nxt.startswith("ablate: error: ") else None))
    return out


ALL = [(p.relative_to(REPO).as_posix(), c, e) for p in PAGES for c, e in doc_commands(p)]


def _argv(segment: list[str]) -> tuple[str, list[str]] | None:
    """(module, arguments) of a ``python -m <module> ...`` or ``accelerate launch ... -m <module> ...`` segment."""
    if segment[0].endswith("python") or segment[0] == "accelerate":
        i = segment.index("-m")
        return segment[i + 1], segment[i + 2 :]
    return None


class _Parsed(Exception):
    pass


def _parse_only(module: str, args: list[str], monkeypatch) -> None:
    """Run ``python -m <module> <args>`` up to its argparse: the arguments parse, then it stops."""
    original = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, *a, **k):
        original(self, *a, **k)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [module, *args])
    with pytest.raises(_Parsed):
        runpy.run_module(module, run_name="__main__", alter_sys=False)


@pytest.fixture
def compose_only(monkeypatch):
    """The CLI's checks before any model loads, less the ones that look for models, data and packages."""
    import ablate.cli
    from ablate.validation import validate

    monkeypatch.setattr(ablate.cli, "check_config", validate)
    monkeypatch.setattr("ablate.models.loading.check_device", lambda device: None)  # GPU commands: as on a GPU box


def check_command(command: str, error: str | None, monkeypatch) -> None:
    from ablate.cli import preflight

    for part in command.split("&&"):
        segment = shlex.split(part, comments=True)
        if not segment:
            continue
        if segment[0] in SCRIPTS:
            path = REPO / segment[0]
            assert path.is_file() and path.stat().st_mode & 0o111, f"{segment[0]} is not an executable script"
            continue
        if segment[0] in OTHER_PROGRAMS:
            continue
        found = _argv(segment)
        assert found, f"a command this test does not know how to check: {part.strip()!r}"
        module, args = found
        if error:
            from ablate.errors import AblateError

            assert module == "ablate"
            monkeypatch.undo()  # the full preflight: the shown error comes from it
            with pytest.raises(AblateError) as e:
                preflight(args)
            assert f"ablate: error: {e.value}" == error
        elif module == "ablate":
            preflight(args)
        elif module == "ablate.audit":
            from ablate.audit.cli import compose_configs, parser, split_regimes

            parsed = parser().parse_args(args)
            regimes, rest = split_regimes(parsed.overrides)
            compose_configs(regimes, rest, REPO / "runs" / "audit-doc-check")
        elif module == "ablate.bench":
            from ablate.bench.config import compose_bench, run_configs

            run_configs(compose_bench(args).regimes, args)
        elif module == "ablate.bench.profile":
            from ablate.bench.profile import compose_profile

            compose_profile(args)
        elif module == "ablate.sweep" and args[:1] == ["slurm-preview"]:
            _parse_only(module, args, monkeypatch)
            preflight(["-m", f"+sweep={args[1]}", "hydra/launcher=slurm", *args[2:]])
        elif module in ARGPARSE_TOOLS:
            _parse_only(module, args, monkeypatch)
        else:
            raise AssertionError(f"a module this test does not know how to check: {module} ({part.strip()!r})")


def test_the_pages_hold_commands():
    pages = {p for p, _, _ in ALL}
    assert {"README.md", "docs/config.md", "docs/clusters.md", "docs/statistics.md", "docs/audit.md"} <= pages
    assert any(e for _, _, e in ALL), "the config page's error examples are read"


def _param(page: str, command: str, error: str | None):
    """A sweep preset composes every job of its grid (tens of jobs: > 20 s): the slow tier."""
    marks = [pytest.mark.slow] if "+sweep=" in command or "slurm-preview" in command else []
    return pytest.param(page, command, error, marks=marks, id=f"{page}:{command[:60]}")


@pytest.mark.parametrize(("page", "command", "error"), [_param(*a) for a in ALL])
def test_every_documented_command_composes(page, command, error, compose_only, monkeypatch):
    check_command(command, error, monkeypatch)
