"""Every number in a quiz's answer explanations is reproduced by a computation or a chapter figure.

For quiz NN, ``tests/quiz_figures/chapterNN.py`` says where each number in the explanations comes
from: ``FIGURES = {question number: {number as written: source}}``, sources as in
``tests/figure_sources.py`` (``Computed``, ``InChapter``, ``Exempt``). Numbers given in the
question or its options, and integers below 10, need no entry.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from figure_sources import load_spec, matches, needs_source, numbers, output_lines, unsourced

from course_utils import quiz

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
SPECS = Path(__file__).resolve().parent / "quiz_figures"
CHECKED = (0, 1, 2, 3, 4)  # the chapters whose quizzes must have a spec
SPEC_CHAPTERS = sorted(int(p.stem[len("chapter") :]) for p in SPECS.glob("chapter[0-9][0-9].py"))


def test_checked_chapters_have_a_spec():
    assert set(CHECKED) <= set(SPEC_CHAPTERS), f"add tests/quiz_figures/chapterNN.py for {CHECKED}"


@pytest.mark.parametrize("chapter", SPEC_CHAPTERS)
def test_every_number_has_a_source(chapter):
    spec = load_spec(SPECS / f"chapter{chapter:02d}.py")
    q = quiz.load(chapter, ROOT / "quiz")
    (notebook,) = (ROOT / "chapters").glob(f"{chapter:02d}_*.ipynb")
    items = [(x.number, " ".join([x.text, x.body, *x.options.values()]), x.explanation) for x in q.questions]
    problems = unsourced(items, spec, output_lines(notebook), f"quiz_figures/chapter{chapter:02d}.py")
    assert not problems, "\n".join(f"question {p}" for p in problems)


def test_numbers_and_matching():
    assert numbers("64 / 4 = 16 MB, about 0.67 GB/s; 1,000,000 rows on DCNv2 (H100).") == [
        "64",
        "4",
        "16",
        "0.67",
        "1,000,000",
    ]
    assert numbers("see [the solution](../solutions/chapter04.ipynb#Exercise-2) for 12") == ["12"]
    assert matches("0.67", 0.6667, 0) and not matches("0.67", 0.66, 0)
    assert matches("1.0", 0.96, 0.05) and not matches("1.0", 0.9, 0.05)
    assert not needs_source("3", set()) and needs_source("12", set()) and not needs_source("12", {"12"})
