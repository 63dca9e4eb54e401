"""The architecture of ``course_utils`` as import-linter checks it, and the chapter each module names.

The contracts are in ``pyproject.toml`` (``[tool.importlinter]``): the layers, the topic packages
in chapter order, and no import cycle between the modules or packages of one package. CI runs
them as ``lint-imports``; here they run in-process on the same graph (built by grimp from the
source: every import statement counts, inside functions too), and again with one planted import
each, to show that every contract names what breaks it.

Also here: every module's docstring says which chapter teaches it.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest
from importlinter import cli  # configures import-linter's settings on import
from importlinter.application import use_cases
from importlinter.application.app_config import settings

pytestmark = pytest.mark.chapter()

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DIR = ROOT / "course_utils"
PYPROJECT = str(ROOT / "pyproject.toml")


def test_the_import_contracts_hold(capsys):
    status = cli.lint_imports(config_filename=PYPROJECT, no_cache=True, no_logo=True)
    out = capsys.readouterr().out
    assert status == 0, out
    assert "Contracts: 3 kept, 0 broken." in out


def broken_contracts(capsys, planted: list[tuple[str, str]] = (), modules: list[str] = ()) -> set[str]:
    """The ids of the contracts in pyproject.toml that the package breaks once its import graph
    also has the ``planted`` imports (importer, imported) and the extra ``modules``: lint-imports
    run on that graph (import-linter's settings take the graph builder, for runs such as this)."""
    real = settings.GRAPH_BUILDER

    class Planting:
        def build(self, **options):
            graph = real.build(**options)
            for module in modules:
                graph.add_module(module)
            for importer, imported in planted:
                graph.add_import(importer=importer, imported=imported)
            return graph

    settings.configure(GRAPH_BUILDER=Planting())
    try:
        passed = use_cases.lint_imports(config_filename=PYPROJECT, cache_dir=None, no_logo=True)
    finally:
        settings.configure(GRAPH_BUILDER=real)
    out = capsys.readouterr().out
    contracts = tomllib.loads(Path(PYPROJECT).read_text())["tool"]["importlinter"]["contracts"]
    assert all(f"{c['name']} KEPT" in out or f"{c['name']} BROKEN" in out for c in contracts), out
    broken = {c["id"] for c in contracts if f"{c['name']} BROKEN" in out}
    assert passed == (not broken), out
    return broken


@pytest.mark.parametrize(
    "planted, modules, broken",
    [
        ([], [], set()),
        # layer 0 importing layer 1: runtime's hardware probe importing show_source's module
        ([("course_utils.runtime.hardware", "course_utils.notebook.show")], [], {"layers"}),
        # a loose module at the top of course_utils/, in no layer
        ([], ["course_utils.helpers"], {"layers"}),
        # chapter 02's ring all-reduce importing chapter 06's schedules
        ([("course_utils.collectives.ring", "course_utils.pipeline.schedules")], [], {"chapter-order"}),
        # two modules of one package importing each other (background imports folders already)
        ([("course_utils.checkpoint.folders", "course_utils.checkpoint.background")], [], {"no-cycles"}),
        # the forward import this contract removed: chapter 04a's module importing chapter 08's,
        # which now imports it (its model and sparse gradient average moved to chapter 04a)
        (
            [("course_utils.ddp.sparse_tables", "course_utils.checkpoint.background")],
            [],
            {"chapter-order", "no-cycles"},
        ),
    ],
    ids=["as-is", "upward", "loose-module", "forward-chapter", "cycle", "04a-imports-08"],
)
def test_each_contract_names_a_planted_import_that_breaks_it(planted, modules, broken, capsys):
    assert broken_contracts(capsys, planted, modules) == broken


def module_files(package_dir: Path) -> dict[str, Path]:
    """``{dotted module name: file}`` for every ``.py`` file under ``package_dir``."""
    root = package_dir.parent
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


TAUGHT = re.compile(r"^(Taught in chapters? \d\d\b|Not taught in a chapter: )")


@pytest.mark.parametrize("module", sorted(module_files(PACKAGE_DIR)))
def test_every_module_says_which_chapter_teaches_it(module):
    """Each module's docstring has a line "Taught in chapter NN." (with the section, or several
    chapters), as d2l's "Defined in" does, or "Not taught in a chapter: " and what it is for."""
    doc = ast.get_docstring(ast.parse(module_files(PACKAGE_DIR)[module].read_text())) or ""
    assert any(TAUGHT.match(line) for line in doc.splitlines()), (
        f"{module}: its docstring has no line 'Taught in chapter NN.' (or 'Not taught in a chapter: ...')"
    )
