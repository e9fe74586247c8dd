"""A report's headline: one sentence, its numbers read from the report's own tables, shown at the top of its
``report.md`` and in the README, so that the README cannot cite a number the report does not have.

A report folder may hold ``headline.md``: a template in the notes' placeholders (:mod:`analysis.notes`). The README
carries each headline between two markers, filled by ``python -m analysis headlines`` (``--check``: exit 1, saying
which, when one is out of date)::

    <!-- headline reports/drift_calibration -->
    ...the rendered sentence...
    <!-- /headline -->
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from analysis.notes import render

FILE = "headline.md"
_OPEN = re.compile(r"<!--\s*headline\s+(?P<folder>\S+)\s*-->[ \t]*\r?\n")
_CLOSE = re.compile(r"<!--\s*/headline\s*-->")


def template(folder: Path) -> str | None:
    """The report folder's headline template, None without one."""
    f = Path(folder) / FILE
    return f.read_text(encoding="utf-8") if f.is_file() else None


def headline(folder: Path) -> str | None:
    """The headline with its placeholders filled from the tables in ``folder`` (one paragraph, its lines as
    written), None where the folder has no template; a :class:`analysis.notes.NotesError` where a placeholder
    names nothing there."""
    text = template(folder)
    return None if text is None else render(text, Path(folder)).strip()


def fill(readme: str, root: Path) -> tuple[str, list[str]]:
    """``readme`` with every headline block refilled from its report folder (relative to ``root``), and the folders
    whose block changed; a ValueError for a block whose folder has no headline template."""
    changed: list[str] = []
    out, at = [], 0
    for opened in _OPEN.finditer(readme):
        folder = opened.group("folder")
        close = _CLOSE.search(readme, opened.end())
        if close is None or _OPEN.search(readme, opened.end(), close.start()):
            raise ValueError(f"the README's headline block for {folder} has no <!-- /headline --> before the next")
        text = headline(root / folder)
        if text is None:
            raise ValueError(f"the README's headline block for {folder} has no {folder}/{FILE}")
        body = text + "\n"
        if body != readme[opened.end() : close.start()]:
            changed.append(folder)
        out += [readme[at : opened.end()], body]
        at = close.start()
    return "".join([*out, readme[at:]]), changed


def main(readme: Path, check: bool) -> int:
    """Refill ``readme``'s headline blocks (or, with ``check``, only say which are out of date: exit 1)."""
    try:
        text, changed = fill(readme.read_text(encoding="utf-8"), readme.parent)
    except ValueError as e:  # a NotesError too
        print(f"analysis: error: {e}", file=sys.stderr)
        return 2
    if check:
        for folder in changed:
            print(f"analysis: {readme}'s headline of {folder} is out of date: python -m analysis headlines")
        return 1 if changed else 0
    readme.write_text(text, encoding="utf-8")
    print(f"analysis: {len(changed)} headline(s) refilled in {readme}" + (f": {', '.join(changed)}" if changed else ""))
    return 0
