"""The "build it" exercises as the chapters show them: a stub, its checker, and the worked solution.

A chapter listed in ``BUILD_IT`` has, in a code cell after its "## Exercises" cell, a call of a
``course_utils.exercises.check_*`` function on a stub defined in that same cell (the learner's
blank, stored with the checker's "not yet" report). Its ``solutions/chapterNN.ipynb`` runs the same
checker on ``solutions.<fn>``, a worked solution of ``course_utils/exercises/solutions.py``, with a
stored output saying "passed:". Read from the notebooks' JSON and the package's source: nothing runs.
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
EXERCISES = ROOT / "course_utils" / "exercises"
BUILD_IT = ("02", "03", "04", "05", "06", "07", "08")  # the chapters 02-08 that show their build-it exercise


def _module(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"))


def _all(path: Path) -> set[str]:
    """The names in a module's ``__all__`` (a list of string literals)."""
    for node in _module(path).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return {elt.value for elt in node.value.elts}
    raise AssertionError(f"{path} has no __all__")


CHECKERS = {name for name in _all(EXERCISES / "__init__.py") if name.startswith("check_")}
SOLUTIONS = {
    node.name
    for node in _module(EXERCISES / "solutions.py").body
    if isinstance(node, ast.FunctionDef | ast.ClassDef)
}


def _cells(notebook: Path) -> list[dict]:
    return json.loads(notebook.read_text(encoding="utf-8"))["cells"]


def _source(cell: dict) -> str:
    return "".join(cell["source"])


def _output(cell: dict) -> str:
    return "".join("".join(out.get("text", "")) for out in cell.get("outputs", []))


def _checker_calls(tree: ast.Module) -> list[tuple[str, ast.expr]]:
    """``(checker, argument)`` of each call of an imported ``course_utils.exercises`` checker."""
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module == "course_utils.exercises"
        for alias in node.names
        if alias.name in CHECKERS
    }
    return [
        (node.func.id, node.args[0])
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in imported
        and len(node.args) == 1
    ]


def _build_it_cell(number: str) -> tuple[dict, str]:
    """The chapter's build-it code cell and the checker it calls."""
    (chapter,) = (ROOT / "chapters").glob(f"{number}_*.ipynb")
    cells = _cells(chapter)
    starts = [i for i, c in enumerate(cells) if c["cell_type"] == "markdown" and "## Exercises" in _source(c)]
    assert starts, f"{chapter.name} has no '## Exercises' cell"
    for cell in cells[starts[0] + 1 :]:
        if cell["cell_type"] != "code":
            continue
        tree = ast.parse(_source(cell))
        defined = {n.name for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        for checker, argument in _checker_calls(tree):
            if isinstance(argument, ast.Name) and argument.id in defined:
                return cell, checker
    raise AssertionError(
        f"{chapter.name}: no cell after '## Exercises' calls a checker on a stub defined in it"
    )


def test_the_package_has_checkers_and_solutions_to_find():
    assert len(CHECKERS) >= 7 and len(SOLUTIONS) >= 7, (CHECKERS, SOLUTIONS)


@pytest.mark.parametrize("number", BUILD_IT)
def test_the_chapter_runs_a_checker_on_a_stub_after_its_exercises(number):
    cell, checker = _build_it_cell(number)
    assert "not yet:" in _output(cell), f"chapter {number}: store the {checker} report of the blank stub"


@pytest.mark.parametrize("number", BUILD_IT)
def test_the_solution_runs_the_same_checker_on_the_worked_solution(number):
    _, checker = _build_it_cell(number)
    passing = []
    for cell in _cells(ROOT / "solutions" / f"chapter{number}.ipynb"):
        if cell["cell_type"] != "code":
            continue
        for name, argument in _checker_calls(ast.parse(_source(cell))):
            if (
                name == checker
                and isinstance(argument, ast.Attribute)
                and ast.unparse(argument.value) == "solutions"
                and argument.attr in SOLUTIONS
                and "passed:" in _output(cell)
            ):
                passing.append(argument.attr)
    assert passing, f"solutions/chapter{number}.ipynb: run {checker}(solutions.<fn>), stored output 'passed:'"
