"""Every notebook in analysis/notebooks runs top to bottom on a real (tiny) sweep."""

import pytest

from tests.conftest import REPO

NOTEBOOKS = sorted((REPO / "analysis" / "notebooks").glob("*.ipynb"))


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tiny_sweep, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    monkeypatch.setenv("ABLATE_SWEEP", str(tiny_sweep))
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(path, as_version=4)
    nbclient.NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(REPO)}}
    ).execute()
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    assert any("6 jobs" in o.get("text", "") or "8 jobs" in o.get("text", "") for o in outputs)


def test_there_is_a_notebook():
    assert NOTEBOOKS
