"""No fixed claim strings: a notebook prints what it measured, and an assert that could fail states
the claim.

A ``print`` whose text is fixed (every argument a string literal, or an f-string with no value in
it) prints the same words whether the cell's check holds or not, so such a line may only introduce
what follows: a heading that ends with ``:``, or a table's header row (``|`` between columns).
Either way it states no result: "within 1e-6", "equal", "more than 3x", "slower than" belong in
the message of the assert that checks them, beside the measured numbers the cell prints (exactly,
where every machine reproduces them; after ``varies("machine", ...)`` where they do not).
A print that does show values may still not state a bound in its fixed words ("weights equal
within 1e-6" beside the rank's name): a bound is the assert's, unless the words label the value
that follows them ("ranks that waited more than 1.5 s:").
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
RESULT_WORDS = re.compile(
    r"\b(within|equal|equals|identical|more than|less than|fewer than|at most|at least|above|below|"
    r"slower|faster|greater|smaller|larger|beats?|differs?)\b",
    re.IGNORECASE,
)
BOUND = re.compile(
    r"\b(within|above|below|more than|less than|fewer than|at most|at least)\s+[-+]?\.?\d", re.IGNORECASE
)


def _fixed(node: ast.expr) -> str | None:
    """The text of a string literal, an f-string with no value in it, or ``+`` of such; else ``None``."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr) and all(isinstance(v, ast.Constant) for v in node.values):
        return "".join(v.value for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _fixed(node.left), _fixed(node.right)
        return None if left is None or right is None else left + right
    return None


def fixed_text(call: ast.Call) -> str | None:
    """The text a ``print(...)`` call shows when every argument is fixed; ``None`` otherwise."""
    parts = [_fixed(arg) for arg in call.args]
    return " ".join(parts).strip() if parts and None not in parts else None


def stated_thresholds(call: ast.Call) -> list[str]:
    """The fixed fragments of a ``print(...)`` call, values around them or not, that state a bound
    ("within 1e-6", "above 0.70", "more than 3x"): a claim the printed value does not make by itself.
    A fragment that ends with ``:`` labels the value after it ("ranks that waited over 1.5 s:")."""
    fragments = [n.value for n in ast.walk(call) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return [f for f in fragments if BOUND.search(f) and not f.rstrip().endswith(":")]


def fixed_claims(source: str) -> list[str]:
    """What a code cell prints that breaks the rule: fixed texts that are not a heading or a header
    row, or that state a result, and bounds stated beside printed values. IPython's ``%`` and ``!``
    lines are left out; a cell that is not Python yields none."""
    lines = ["" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"):
            continue
        text = fixed_text(node)
        if text:
            heading = text.endswith(":") or " | " in text
            if not heading or RESULT_WORDS.search(text):
                found.append(f"line {node.lineno}: {text!r}")
        else:
            found += [f"line {node.lineno}: {fragment!r}" for fragment in stated_thresholds(node)]
    return found


def test_the_check_tells_a_claim_from_a_heading():
    cell = (
        'print("largest difference:", gap)\n'
        'print("step | loss")\n'
        'print("per rank, after 3 steps:")\n'
        'print(f"loss {loss:.4f}")\n'
        'print("parameters equal within 1e-5")\n'
        'print(f"spawn slower " + "than fork")\n'
        'print("both runs, weights equal within 1e-6:")\n'
        'print(f"{kind}: weights equal within 1e-6")\n'
        'print(f"{kind}: weights within 1e-6 of one process:", gap)\n'
        'print(f"ranks that waited more than 1.5 s: {late}")\n'
        "!pip list\n"
    )
    claims = fixed_claims(cell)
    assert [c.split(":")[0] for c in claims] == ["line 5", "line 6", "line 7", "line 8"], claims


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_a_notebook_prints_no_fixed_claim(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    found = [
        f"cell {i}, {claim}"
        for i, cell in enumerate(cells)
        if cell["cell_type"] == "code"
        for claim in fixed_claims("".join(cell["source"]))
    ]
    assert not found, (
        f"{notebook.parent.name}/{notebook.name} prints fixed claims; print the measured values and "
        "state the claim in the message of the assert that checks it:\n  " + "\n  ".join(found)
    )
