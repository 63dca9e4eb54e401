"""Where a number written in learner-facing prose comes from (used by test_quiz_figures, test_solutions).

A spec file defines ``FIGURES = {item number: {number as written: source}}`` with one of:

- ``Computed(lambda: <course_utils call or arithmetic>, rel=0.0)``: the value, rounded to the
  digits written, equals the written number (or is within ``rel`` of it, for "about" figures);
- ``InChapter("text")``: the number, written the same way, appears on a stored output line of the
  chapter that also contains ``text`` (a figure the chapter measured or printed);
- ``Exempt("reason")``: not a figure (a year, a version, a name), or a figure only ranks compute
  (the reason names the test that starts them); the reason is required.

The four names (with ``Claim``, below) are provided when the spec file is executed. Numbers that
the item's own prompt (a quiz question and its wrong options, or the exercise) gives, and integers
below 10 (counts, formula constants), need no entry; an entry for one of them is checked all the
same (a computed figure in a question, a distractor the code computes). An entry for a number that
is not written fails too, so specs cannot go stale.

A quiz spec may also define ``CLAIMS = {question number: (Claim("text", lambda: ...), ...)}`` for
an answer (or a question's premise) that is a behaviour rather than a number: the question, its
right option or its explanation contains ``text``, and the computation, run on the package,
returns True.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

NUMBER = re.compile(r"(?<![\w.])\d[\d,]*(?:\.\d+)?(?![\w])")


@dataclass(frozen=True)
class Computed:
    value: Callable[[], float]
    rel: float = 0.0


@dataclass(frozen=True)
class InChapter:
    text: str


@dataclass(frozen=True)
class Exempt:
    reason: str


@dataclass(frozen=True)
class Claim:
    text: str
    holds: Callable[[], bool]


def numbers(text: str) -> list[str]:
    """Every number written in ``text``, as written (``1,000`` and ``0.67`` kept whole)."""
    text = re.sub(r"\b[A-Za-z]+\d[\w.-]*", " ", text)  # names with digits: DCNv2, x86_64, H100
    text = re.sub(r"\]\([^)]*\)", "]", text)  # link targets: ../solutions/chapter04.ipynb#Exercise-2
    return [m.group(0).rstrip(".,") for m in NUMBER.finditer(text)]


def needs_source(number: str, given: set[str]) -> bool:
    plain = number.replace(",", "")
    return number not in given and not (plain.isdigit() and int(plain) < 10)


def matches(written: str, value: float, rel: float) -> bool:
    x = float(written.replace(",", ""))
    decimals = len(written.split(".")[1]) if "." in written else 0
    if rel:
        return abs(value - x) <= rel * abs(x)
    return abs(value - x) <= 0.5 * 10**-decimals + 1e-9


def load_spec(path: Path) -> dict[int, dict[str, object]]:
    """The spec's ``FIGURES``."""
    return _run_spec(path)["FIGURES"]


def load_claims(path: Path) -> dict[int, tuple[Claim, ...]]:
    """The spec's ``CLAIMS`` ({} if it has none)."""
    return _run_spec(path).get("CLAIMS", {})


def _run_spec(path: Path) -> dict[str, object]:
    namespace = {"Computed": Computed, "InChapter": InChapter, "Exempt": Exempt, "Claim": Claim}
    exec(compile(path.read_text(encoding="utf-8"), str(path), "exec"), namespace)
    return namespace


def output_lines(notebook: Path) -> list[str]:
    """Every line of the stored outputs (stream text and text/plain) of ``notebook``."""
    lines = []
    for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            lines += text.splitlines()
    return lines


def chapter_says(chapter: int, *texts: str) -> bool:
    """Whether one stored output line of chapter ``chapter``'s main notebook contains all ``texts``
    (for a claim that the chapter demonstrates by running it, under nbval, rather than computes)."""
    (notebook,) = (Path(__file__).resolve().parent.parent / "chapters").glob(f"{chapter:02d}_*.ipynb")
    return any(all(text in line for text in texts) for line in output_lines(notebook))


def unsourced(
    items: Iterable[tuple[int, str, str]],
    spec: dict[int, dict[str, object]],
    lines: list[str],
    spec_name: str,
) -> list[str]:
    """Problems with ``items`` = (number, the prompt's text, the prose to check) against ``spec``."""
    problems = []
    for key, prompt, prose in items:
        given = set(numbers(prompt))
        written = numbers(prose)
        sources = spec.get(key, {})
        for number in dict.fromkeys(written + numbers(prompt)):
            source, where = sources.get(number), f"{key} {number!r}"
            if source is None:
                if number in written and needs_source(number, given):
                    problems.append(f"{where}: no source in {spec_name}")
            elif isinstance(source, Computed):
                value = source.value()
                if not matches(number, value, source.rel):
                    problems.append(f"{where}: computed {value!r}")
            elif isinstance(source, InChapter):
                if not any(number in line and source.text in line for line in lines):
                    problems.append(f"{where}: no stored output line has it and {source.text!r}")
            elif isinstance(source, Exempt):
                if not source.reason.strip():
                    problems.append(f"{where}: an exemption needs a reason")
            else:
                problems.append(f"{where}: unknown source {source!r}")
        problems += [
            f"{key} {n!r}: in {spec_name} but not written" for n in sources if n not in written + list(given)
        ]
    return problems


def unheld(claims: dict[int, tuple[Claim, ...]], prose: dict[int, str], spec_name: str) -> list[str]:
    """Problems with ``claims`` against ``prose`` = {question number: its question and answer}."""
    problems = []
    for key, entries in claims.items():
        for claim in entries:
            where = f"{key} {claim.text!r}"
            if claim.text not in prose.get(key, ""):
                problems.append(f"{where}: in {spec_name} but not in the question or its answer")
            elif not claim.holds():
                problems.append(f"{where}: the computation does not hold")
    return problems
