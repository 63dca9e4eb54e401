"""Chapters do not hide more output than they did: output-ignored cells and stopwatch lines are capped.

A cell tagged ``nbval-ignore-output`` is not compared by nbval, and a line starting with ``⏱`` is
rewritten by ``tests/sanitize.cfg`` before comparing. Both are for genuinely varying figures (wall
time, bandwidth); each hides something from the comparison, so their number per chapter may only
go down. The caps are the counts of 2026-11-23 before the chapter corrections of issues 12-13, lowered
where those corrections needed fewer; chapter 07's one output-ignored cell is the TorchRec comparison
(issue 13 asks for it: its output depends on whether TorchRec is installed). Chapter 04 has two more
than before: its cells 42 and 53 print training results whose fourth digit depends on the CPU's
matrix kernels (held-out log loss 0.6201 on the machine that stored the outputs, 0.6205 on one whose
MKL runs AVX-512 kernels; AUC 0.7483 against 0.7472), and their claims are asserted (cells 42, 54).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"
IGNORE_TAG = "nbval-ignore-output"
STOPWATCH = "\u23f1"

# chapter: (output-ignored cells, stopwatch lines in stored outputs)
CAPS = {
    0: (1, 1),
    1: (0, 12),
    2: (1, 12),
    3: (1, 14),
    4: (3, 6),
    5: (0, 2),
    6: (0, 3),
    7: (1, 4),
    8: (0, 0),
}


def counts(notebook: Path) -> tuple[int, int]:
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    ignored = sum(IGNORE_TAG in c.get("metadata", {}).get("tags", []) for c in cells)
    clock = 0
    for cell in cells:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            clock += sum(line.startswith(STOPWATCH) for line in text.splitlines())
    return ignored, clock


@pytest.mark.parametrize("notebook", sorted(CHAPTERS.glob("[0-9][0-9]_*.ipynb")), ids=lambda p: p.name)
def test_no_more_hidden_output_than_before(notebook):
    chapter = int(notebook.name[:2])
    ignored, clock = counts(notebook)
    cap_ignored, cap_clock = CAPS[chapter]
    assert ignored <= cap_ignored, f"{notebook.name}: {ignored} output-ignored cells, at most {cap_ignored}"
    assert clock <= cap_clock, f"{notebook.name}: {clock} stopwatch lines, at most {cap_clock}"
