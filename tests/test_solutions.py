"""Worked solutions: one notebook per chapter, one section per exercise, figures sourced.

``solutions/chapterNN.ipynb`` answers every item of chapter NN's "## Exercises" list:

- cell 0 is markdown headed ``# Chapter NN: worked solutions`` with a link back to the chapter;
- cell 1 is the chapters' setup cell (``templates/setup_cell.py``), so it runs on Colab and Kaggle;
- exercise k has a markdown cell whose first line is ``## Exercise k``, in order, one per exercise;
- the chapter links each exercise to ``../solutions/chapterNN.ipynb#Exercise-k``;
- the notebook runs top to bottom with the outputs stored in it: the README's test command
  compares it with nbval (``pytest --nbval chapters solutions tests``), as it does the chapters;
- every number written in an exercise's markdown is sourced in ``tests/solution_figures/chapterNN.py``
  (``Computed``, ``InChapter`` or ``Exempt``, see ``tests/figure_sources.py``; ``InChapter`` looks in
  the stored outputs of the chapter and of the solution notebook itself); numbers the exercise
  itself gives, and integers below 10, need no entry.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from figure_sources import load_spec, output_lines, unsourced

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
SOLUTIONS = ROOT / "solutions"
SPECS = Path(__file__).resolve().parent / "solution_figures"
CHAPTERS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))
REQUIRED = tuple(range(9))  # every chapter has its solutions
PRESENT = sorted(SOLUTIONS.glob("chapter[0-9][0-9].ipynb"))
_ITEM = re.compile(r"^(\d+)\.\s+(.*)")


def cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def text(cell: dict) -> str:
    return "".join(cell["source"])


def chapter_of(solution: Path) -> Path:
    (notebook,) = (ROOT / "chapters").glob(f"{solution.stem[len('chapter') :]}_*.ipynb")
    return notebook


def exercises(notebook: Path) -> dict[int, str]:
    """The chapter's exercises, ``{k: text}``, from the numbered list after its "## Exercises" heading."""
    found: dict[int, str] = {}
    inside = False
    for cell in cells(notebook):
        if cell["cell_type"] != "markdown":
            continue
        for line in text(cell).splitlines():
            if line.startswith("#"):
                inside = line.strip().lower() in ("## exercises", "### exercises")
                current = None
                continue
            if not inside:
                continue
            if m := _ITEM.match(line):
                current = int(m[1])
                found[current] = m[2]
            elif current is not None and line.strip():
                found[current] += " " + line.strip()
    return found


def sections(solution: Path) -> dict[int, str]:
    """``{k: markdown of exercise k's section}`` (every markdown cell up to the next exercise)."""
    found: dict[int, str] = {}
    current = None
    for cell in cells(solution):
        if cell["cell_type"] != "markdown":
            continue
        first = text(cell).splitlines()[0] if text(cell) else ""
        if m := re.fullmatch(r"## Exercise (\d+)", first.strip()):
            current = int(m[1])
            found[current] = ""
        if current is not None:
            found[current] += text(cell) + "\n"
    return found


def test_required_chapters_have_solutions():
    missing = [n for n in REQUIRED if not (SOLUTIONS / f"chapter{n:02d}.ipynb").exists()]
    assert not missing, f"write solutions/chapterNN.ipynb for chapters {missing}"


@pytest.mark.parametrize("solution", PRESENT, ids=lambda p: p.name)
def test_solution_answers_every_exercise_in_order(solution):
    chapter = chapter_of(solution)
    nb = cells(solution)
    assert nb[0]["cell_type"] == "markdown"
    assert text(nb[0]).startswith(f"# Chapter {solution.stem[-2:]}: worked solutions")
    assert f"../chapters/{chapter.name}" in text(nb[0]), "cell 0 links back to the chapter"
    setup = (ROOT / "templates" / "setup_cell.py").read_text(encoding="utf-8")
    assert nb[1]["cell_type"] == "code" and text(nb[1]).strip() == setup.strip()
    asked = exercises(chapter)
    assert asked, f"{chapter.name} has no '## Exercises' list"
    assert list(sections(solution)) == list(range(1, len(asked) + 1))


@pytest.mark.parametrize("solution", PRESENT, ids=lambda p: p.name)
def test_chapter_links_each_exercise_to_its_solution(solution):
    for k, exercise in exercises(chapter_of(solution)).items():
        assert f"../solutions/{solution.name}#Exercise-{k}" in exercise, f"exercise {k} has no solution link"


@pytest.mark.parametrize("solution", PRESENT, ids=lambda p: p.name)
def test_solution_numbers_have_a_source(solution):
    spec_path = SPECS / f"{solution.stem}.py"
    spec = load_spec(spec_path) if spec_path.exists() else {}
    asked = exercises(chapter_of(solution))
    items = [(k, asked.get(k, ""), prose) for k, prose in sections(solution).items()]
    problems = unsourced(
        items,
        spec,
        output_lines(chapter_of(solution)) + output_lines(solution),
        f"solution_figures/{spec_path.name}",
    )
    assert not problems, "\n".join(f"exercise {p}" for p in problems)
