"""The course's code as Python syntax trees, for tests that read code instead of running it: every
module under ``course_utils/`` whole, and the notebooks of ``chapters/`` and ``solutions/`` one
code cell at a time."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_MAGIC = re.compile(r"^(\s*)[%!]")  # IPython line magics and shell escapes


def cell_code(cell: dict) -> str:
    """A code cell's source as Python: IPython's ``%magic`` and ``!shell`` lines become ``pass``."""
    source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
    return "\n".join(_MAGIC.sub(r"\1pass  # ", line) for line in source.splitlines())


def sources(tests: bool = False) -> dict[str, list[tuple[str, ast.Module]]]:
    """``{file: [(where, parsed code)]}``: a module is one piece (where ``""``), a notebook one
    per code cell (where ``"cell 12 "``); with ``tests``, the files of ``tests/`` too."""
    found = {}
    modules = sorted((ROOT / "course_utils").rglob("*.py"))
    if tests:
        modules += sorted((ROOT / "tests").rglob("*.py"))
    for path in modules:
        rel = path.relative_to(ROOT).as_posix()
        found[rel] = [("", ast.parse(path.read_text(), filename=rel))]
    for path in sorted([*ROOT.glob("chapters/*.ipynb"), *ROOT.glob("solutions/*.ipynb")]):
        rel = path.relative_to(ROOT).as_posix()
        cells = json.loads(path.read_text())["cells"]
        found[rel] = [
            (f"cell {i} ", ast.parse(cell_code(cell), filename=f"{rel} cell {i}"))
            for i, cell in enumerate(cells)
            if cell["cell_type"] == "code"
        ]
    return found
