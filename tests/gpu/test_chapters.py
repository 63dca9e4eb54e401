"""Every chapter and worked solution executed top to bottom on this GPU machine: each cell's own
asserts must hold.

Stored outputs are not compared (they were made on a CPU); a cell that raises fails the test.
``python -m pytest tests/gpu -m gpu`` runs this with the rest of the GPU set.
"""

from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parents[2]
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("chapter*.ipynb"))


@pytest.mark.gpu(1)
@pytest.mark.parametrize("chapter", CHAPTERS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_chapter_runs_to_its_last_cell(chapter, tmp_path):
    import importlib.util

    import nbformat
    from nbclient import NotebookClient

    if chapter.name == "07a_torchrec.ipynb" and importlib.util.find_spec("torchrec") is None:
        pytest.skip("appendix 07a needs torchrec, not a course dependency (its section 1 says how to get it)")

    notebook = nbformat.read(chapter, as_version=4)
    NotebookClient(
        notebook, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(chapter.parent)}}
    ).execute()
    assert any(c.get("outputs") for c in notebook.cells if c.cell_type == "code")
