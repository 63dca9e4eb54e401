"""Every number a quiz states that the course computes is what the package computes.

For quiz NN, ``tests/quiz_figures/chapterNN.py`` says where each number of the right option and the
explanation comes from: ``FIGURES = {question number: {number as written: source}}``, sources as in
``tests/figure_sources.py`` (``Computed``, ``InChapter``, ``Exempt``). Numbers the question or its
wrong options give, and integers below 10, need no entry; an entry for one is checked all the same
(a figure the question states, a distractor the code computes). ``CLAIMS`` checks answers that are
behaviours: the package does what the question and its right option say. This is the one place
quiz numbers are checked, all in this process (closed forms and models; no ranks are started).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from figure_sources import (
    load_claims,
    load_spec,
    matches,
    needs_source,
    numbers,
    output_lines,
    unheld,
    unsourced,
)

from course_utils import quiz

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
SPECS = Path(__file__).resolve().parent / "quiz_figures"
CHECKED = range(9)  # the chapters whose quizzes must have a spec
SPEC_CHAPTERS = sorted(int(p.stem[len("chapter") :]) for p in SPECS.glob("chapter[0-9][0-9].py"))


def test_checked_chapters_have_a_spec():
    assert set(CHECKED) <= set(SPEC_CHAPTERS), f"add tests/quiz_figures/chapterNN.py for {CHECKED}"


def _given(q: quiz.Question) -> str:
    """What the question gives: its text, its lines before the options and its wrong options."""
    return " ".join([q.text, q.body, *(text for letter, text in q.options.items() if letter != q.answer)])


def _stated(q: quiz.Question) -> str:
    """What the answer states: the right option and the explanation."""
    return f"{q.answer}. {q.options[q.answer]}\n{q.explanation}"


@pytest.mark.parametrize("chapter", SPEC_CHAPTERS)
def test_every_number_has_a_source(chapter):
    spec = load_spec(SPECS / f"chapter{chapter:02d}.py")
    q = quiz.load(chapter, ROOT / "quiz")
    (notebook,) = (ROOT / "chapters").glob(f"{chapter:02d}_*.ipynb")
    items = [(x.number, _given(x), _stated(x)) for x in q.questions]
    problems = unsourced(items, spec, output_lines(notebook), f"quiz_figures/chapter{chapter:02d}.py")
    assert not problems, "\n".join(f"question {p}" for p in problems)


@pytest.mark.parametrize("chapter", SPEC_CHAPTERS)
def test_every_claimed_behaviour_holds(chapter):
    claims = load_claims(SPECS / f"chapter{chapter:02d}.py")
    questions = quiz.load(chapter, ROOT / "quiz").questions
    stated = {x.number: f"{x.text}\n{x.body}\n{_stated(x)}" for x in questions}
    problems = unheld(claims, stated, f"quiz_figures/chapter{chapter:02d}.py")
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


def test_a_given_number_with_an_entry_is_checked_and_a_claim_must_be_stated():
    from figure_sources import Claim, Computed

    spec = {1: {"2.1": Computed(lambda: 2.0), "16.8": Computed(lambda: 16.8)}}
    problems = unsourced([(1, "one row is 2.1 MB; A. 16.8 MB", "B. 10.5 MB")], spec, [], "s")
    assert problems == ["1 '10.5': no source in s", "1 '2.1': computed 2.0"]
    claims = {1: (Claim("raises", lambda: True), Claim("moves", lambda: False))}
    assert unheld(claims, {1: "it moves"}, "s") == [
        "1 'raises': in s but not in the question or its answer",
        "1 'moves': the computation does not hold",
    ]
