"""A chapter's main path stays readable in one sitting: at most 40 cells, at most 25 of them code,
and at most 3,500 words of markdown. Deep dives live in an appendix notebook beside the chapter
(``chapters/NNa_name.ipynb``, tested by nbval like the chapter), held to the same limits; every
appendix belongs to a chapter."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))
MAX_CELLS, MAX_CODE, MAX_WORDS = 40, 25, 3500
NAME = re.compile(r"^(\d\d)([a-z]?)_\w+\.ipynb$")


def counts(notebook: Path) -> tuple[int, int, int]:
    """(all cells, code cells, words of markdown) of a notebook; a word is a run of non-space."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    words = sum(len(re.findall(r"\S+", "".join(c["source"]))) for c in cells if c["cell_type"] == "markdown")
    return len(cells), sum(c["cell_type"] == "code" for c in cells), words


def test_every_notebook_is_a_chapter_or_an_appendix_of_one():
    names = [p.name for p in NOTEBOOKS]
    assert all(NAME.match(n) for n in names), [n for n in names if not NAME.match(n)]
    mains = {NAME.match(n)[1] for n in names if not NAME.match(n)[2]}
    appendices = {n: NAME.match(n)[1] for n in names if NAME.match(n)[2]}
    assert mains == {f"{i:02d}" for i in range(9)}, sorted(mains)
    assert all(chapter in mains for chapter in appendices.values()), appendices


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebook_is_within_the_limits(notebook):
    cells, code, words = counts(notebook)
    kind = "appendix" if NAME.match(notebook.name)[2] else "main path"
    assert code <= MAX_CODE, f"{notebook.name} ({kind}) has {code} code cells; at most {MAX_CODE}"
    assert cells <= MAX_CELLS and words <= MAX_WORDS, (
        f"{notebook.name} ({kind}) has {cells} cells and {words} words of markdown; at most {MAX_CELLS} "
        f"and {MAX_WORDS}: move a deep dive to an appendix notebook (chapters/NNa_name.ipynb)"
    )
