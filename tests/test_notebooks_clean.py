"""Notebooks are committed without outputs and honour the fast-mode switch."""
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb")) + sorted((ROOT / "labs").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(list((ROOT / "notebooks").glob("*.ipynb"))) >= 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
def test_notebook_has_no_outputs(path):
    notebook = nbformat.read(path, as_version=4)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a code cell has outputs; clear them before committing"
            assert cell.execution_count is None, f"{path.name}: a code cell has an execution count"


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("*.ipynb")),
                         ids=[p.name for p in sorted((ROOT / "notebooks").glob("*.ipynb"))])
def test_notebook_mentions_fast_mode(path):
    source = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
    assert "fast_mode" in source or "pick(" in source, f"{path.name} ignores SAZO_FAST"
