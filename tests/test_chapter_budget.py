"""The output rule, counted: in every chapter and worked solution, what nbval does not compare
stays a minority of the stored output.

A stored output holds only what every supported machine reproduces (CONTRIBUTING.md, "The output
rule"). A machine-dependent value is printed after ``⏱`` (times, rates, bandwidths) or ``⚙``
(anything else that varies: trained metrics' last digits, float differences, device and backend
names, torch's error texts); ``tests/sanitize.cfg`` blanks from the marker to the end of the
line. A cell tagged ``nbval-ignore-output`` is not compared at all. Both hide something from the
comparison, so together they may cover at most a quarter of a chapter's output lines, and every
blanked line still carries its measured value for the reader. A worked solution answers a few
exercises, several of them "measure this" questions, in a handful of lines: there what is blanked
must stay a minority (under half).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("[0-9][0-9]*.ipynb")) + sorted(
    (ROOT / "solutions").glob("chapter[0-9][0-9].ipynb")
)
IGNORE_TAG = "nbval-ignore-output"
MARKERS = ("\u23f1", "\u2699")  # ⏱ and ⚙, as tests/sanitize.cfg spells them
MAX_BLANKED = {"chapters": 0.25, "solutions": 0.49}


def output_lines(cell: dict) -> list[str]:
    """The text lines of a code cell's stored outputs (streams and text/plain results)."""
    lines = []
    for out in cell.get("outputs", []):
        text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
        lines += [line for line in text.splitlines() if line.strip()]
    return lines


def blanked(notebook: Path) -> tuple[int, int, list[str]]:
    """(lines nbval does not compare, all output lines, marked lines that carry no value)."""
    hidden = total = 0
    empty = []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        if cell["cell_type"] != "code":
            continue
        lines = output_lines(cell)
        total += len(lines)
        if IGNORE_TAG in cell.get("metadata", {}).get("tags", []):
            hidden += len(lines)
            continue
        for line in lines:
            marks = [line.index(m) for m in MARKERS if m in line]
            if marks:
                hidden += 1
                if not re.search(r"\w", line[min(marks) + 1 :]):
                    empty.append(line)
    return hidden, total, empty


def test_the_markers_are_the_ones_sanitize_blanks():
    config = (ROOT / "tests" / "sanitize.cfg").read_text(encoding="utf-8")
    for marker in MARKERS:
        assert f"regex: {marker}[^\\n]*" in config, f"tests/sanitize.cfg does not blank lines marked {marker}"


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_blanked_output_is_at_most_a_quarter(notebook):
    hidden, total, _ = blanked(notebook)
    cap = MAX_BLANKED[notebook.parent.name]
    assert total, f"{notebook.name} has no stored output: is it executed?"
    assert hidden <= cap * total, (
        f"{notebook.parent.name}/{notebook.name}: {hidden} of {total} output lines are not compared "
        f"({hidden / total:.0%}; at most {cap:.0%}). Print what every machine reproduces "
        "(counts, formulas, decisions the cell asserts) and keep measured values to fewer lines."
    )


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_marked_line_shows_its_measured_value(notebook):
    _, _, empty = blanked(notebook)
    assert not empty, f"{notebook.name}: marked lines with no value after the marker: {empty[:3]}"


def test_a_line_printed_through_varies_is_blanked_from_its_marker_on():
    from course_utils.notebook.marks import MARKS, varies

    assert set(MARKS.values()) == set(MARKERS)
    config = (ROOT / "tests" / "sanitize.cfg").read_text(encoding="utf-8")
    rules = re.findall(r"^regex: (.*)\nreplace: (.*)$", config, flags=re.MULTILINE)
    for kind, blank in (("clock", "⏱ <measured>"), ("machine", "⚙ <this machine>")):
        line = f"compared {varies(kind, '1.23 s, 0.7071 AUC')}"
        for regex, replace in rules:
            line = re.sub(regex, replace, line)
        assert line == f"compared {blank}", line
    with pytest.raises(ValueError, match="clock"):
        varies("wall", "1 s")
