"""The dev loop's bookkeeping (conftest.py): every test file declares its chapters in its own
``pytestmark`` (``chapter()`` for a course-wide file), no test file imports another, and nothing
keeps a list of test files or reads test sources to classify them."""

import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parents[1]
TEST_FILES = sorted(p for p in (ROOT / "tests").rglob("test_*.py") if "helpers" not in p.parts)


def _root_conftest():
    spec = importlib.util.spec_from_file_location("root_conftest", ROOT / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _is_chapter_mark(node) -> bool:
    """``pytest.mark.chapter(...)``"""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "chapter"
        and ast.unparse(node.func.value) == "pytest.mark"
    )


def declared_chapters(path: Path) -> tuple[int, ...] | None:
    """The chapters in a test file's module-level ``pytestmark`` (``()``: course-wide); ``None``
    where it declares none."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "pytestmark" for t in node.targets):
            marks = node.value.elts if isinstance(node.value, ast.List) else [node.value]
            for mark in filter(_is_chapter_mark, marks):
                return tuple(ast.literal_eval(arg) for arg in mark.args)
    return None


def test_every_test_file_declares_its_chapters():
    missing = [str(p.relative_to(ROOT)) for p in TEST_FILES if declared_chapters(p) is None]
    assert not missing, (
        "add a module-level pytestmark = pytest.mark.chapter(N) (chapter() if course-wide) to "
        + ", ".join(missing)
    )
    for path in TEST_FILES:
        assert set(declared_chapters(path)) <= set(range(9)), path.name


def test_every_chapter_has_tests():
    covered = {n for path in TEST_FILES for n in declared_chapters(path)}
    assert covered == set(range(9))


def imported_test_modules(source: str) -> list[tuple[int, str]]:
    """(line, module) for each test module (``test_*``, ``conftest``, ``tests.*``) that ``source``
    imports, wherever the import is (at the top or inside a function)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names = [node.module]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "tests" or parts[-1].startswith("test_") or parts[-1] == "conftest":
                found.append((node.lineno, name))
    return found


def test_no_test_file_imports_another():
    found = [
        f"{path.relative_to(ROOT)}:{line} imports {name}"
        for path in TEST_FILES
        for line, name in imported_test_modules(path.read_text())
    ]
    assert not found, "move what they share to tests/helpers/ or tests/conftest.py: " + "; ".join(found)


def test_the_import_check_sees_imports_inside_functions_and_spares_helpers():
    source = "from helpers.p2p import only_batched_p2p\n\ndef test_a():\n    import test_ddp as t\n"
    assert imported_test_modules(source) == [(4, "test_ddp")]


@pytest.mark.launches
def test_under_unit_a_test_that_starts_a_process_fails_naming_itself(tmp_path):
    """conftest.py as the only plugin, on two planted tests: the marked one is left out, the
    unmarked one that starts a process fails and is named."""
    (tmp_path / "test_planted.py").write_text(
        "import subprocess, sys\nimport pytest\n\npytestmark = pytest.mark.chapter(4)\n\n"
        "def test_starts_one():\n    subprocess.run([sys.executable, '-c', 'pass'])\n\n"
        "@pytest.mark.launches\ndef test_marked():\n    subprocess.run([sys.executable, '-c', 'pass'])\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "--unit", "-q"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "test_planted.py::test_starts_one started a process, but --unit" in done.stdout
    assert "1 failed, 1 deselected" in done.stdout


def test_no_conftest_lists_test_files_or_reads_test_sources():
    """The tiers come from each file's own marks: no conftest names a test file outside its
    docstrings, or reads source code (``inspect.getsource``) to classify tests."""
    for conftest in sorted(ROOT.glob("**/conftest.py")):
        if ".venv" in conftest.parts or "site-packages" in conftest.parts:
            continue
        tree = ast.parse(conftest.read_text())
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                assert not re.search(r"test_\w+\.py", node.value), (conftest, node.value)
            if isinstance(node, ast.Attribute):
                assert node.attr not in ("getsource", "getsourcelines"), conftest


def test_notebooks_take_their_chapter_from_their_file_name():
    conf = _root_conftest()
    assert conf._NOTEBOOK_CHAPTER.match("04_ddp.ipynb")[1] == "04"
    assert conf._NOTEBOOK_CHAPTER.match("chapter07.ipynb")[2] == "07"
    assert conf._NOTEBOOK_CHAPTER.match("07a_torchrec.ipynb")[1] == "07"  # an appendix: its chapter's


def test_the_notebooks_that_need_torchrec_exist():
    """conftest.py skips these where TorchRec does not import: each name must be a real notebook."""
    names = _root_conftest().NEEDS_TORCHREC
    assert names and all((ROOT / "chapters" / name).is_file() for name in names), names


def test_notebooks_carry_no_execution_metadata():
    import json
    import sys

    sys.path.insert(0, str(ROOT / "tools"))
    try:
        from strip_metadata import strip
    finally:
        sys.path.remove(str(ROOT / "tools"))
    notebooks = sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("solutions/*.ipynb")])
    solutions = [p for p in notebooks if p.parent.name == "solutions"]
    assert len(solutions) == 9 and len(notebooks) >= 9 + 9  # the 9 chapters (and appendices), 9 solutions
    carrying = [p.name for p in notebooks if strip(json.loads(p.read_text()))]
    assert not carrying, f"run: python tools/strip_metadata.py {' '.join(carrying)}"
