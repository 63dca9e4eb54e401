"""The quizzes cannot be gamed: over the whole course, read through the course's quiz parser.

What a learner could guess from without knowing the answer:

* the letter: over all the quizzes each letter is the right one in 15-35% of the questions;
* the length: the right option is the longest of its question in at most a third of the
  questions, and the shortest in at most a third (distractors are not visibly shorter either).

"Length" is what the learner sees. ``quiz.ask`` shows the options as Markdown in a notebook, so
an option's shown length is its text without the Markdown markup that a notebook does not print
(the backticks of inline code, the asterisks or underscores of bold and italics, backslash
escapes), in characters; see ``shown``. An option is "the longest" if no other option of its
question is longer, ties included, unless all four have the same length (e.g. ``3 and 9``,
``0 and 9``, ...: then the length tells nothing).

Run ``python tests/test_quiz_balance.py`` to print the statistics.
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from course_utils import quiz

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
QUIZ = ROOT / "quiz"
COURSE_CHAPTERS = list(range(9))  # chapters 00-08 each end with a quiz
LETTER_SHARE = (0.15, 0.35)
LENGTH_CUE_SHARE = 1 / 3
PACKT = "Accelerate Model Training with PyTorch 2.X"


def shown(option: str) -> str:
    """An option's text as a notebook shows its Markdown: no backticks, no emphasis markers."""
    parts = re.split(r"(`[^`]*`)", option)  # inline code, shown as it is, without the backticks
    return "".join(part[1:-1] if part.startswith("`") else _plain(part) for part in parts)


def _plain(text: str) -> str:
    """Markdown outside inline code: bold and italics lose their markers, ``\\*`` shows ``*``."""
    text = re.sub(r"\\(.)", lambda m: chr(0xE000 + ord(m[1])), text)  # hide escaped characters
    text = re.sub(r"(\*\*|__)(?!\s)(.+?)(?<!\s)\1", r"\2", text)  # bold
    text = re.sub(r"(?<![\w*])([*_])(?!\s)(.+?)(?<!\s)\1(?![\w*])", r"\2", text)  # italics
    return re.sub("[\ue000-\uefff]", lambda m: chr(ord(m[0]) - 0xE000), text)


def length_cue(question: quiz.Question) -> str:
    """``"longest"`` or ``"shortest"`` if the right option is that (see the module docstring), or ``""``."""
    sizes = {letter: len(shown(text)) for letter, text in question.options.items()}
    right, others = sizes.pop(question.answer), sizes.values()
    if len(set(others) | {right}) == 1:
        return ""
    return "longest" if right >= max(others) else "shortest" if right <= min(others) else ""


def course_questions() -> list[tuple[int, quiz.Question]]:
    return [(n, q) for n in COURSE_CHAPTERS for q in quiz.load(n, QUIZ).questions]


def statistics() -> dict:
    """Letter counts and length cues over all the course's questions."""
    questions = course_questions()
    cues = Counter(length_cue(q) for _, q in questions)
    return {
        "questions": len(questions),
        "letters": Counter(q.answer for _, q in questions),
        "longest": cues["longest"],
        "shortest": cues["shortest"],
        "per_quiz": {n: "".join(q.answer for m, q in questions if m == n) for n in COURSE_CHAPTERS},
    }


def test_every_chapter_has_a_quiz():
    assert quiz.chapters(QUIZ) == COURSE_CHAPTERS


def test_shown_length_drops_the_markup_a_notebook_does_not_print():
    assert shown("`LOCAL_RANK=1`; it selects `cuda:1`") == "LOCAL_RANK=1; it selects cuda:1"
    assert shown("a **range** split and *Zipf* ids, `x * y`") == "a range split and Zipf ids, x * y"
    assert shown("2 (w - 1) * alpha, x_1 and y_2") == "2 (w - 1) * alpha, x_1 and y_2"  # no emphasis
    assert shown(r"\*not italic\*") == "*not italic*" and shown("`*args*` and **kw**") == "*args* and kw"


def test_length_cue_counts_ties_but_not_four_equal_lengths():
    def question(options, answer):
        return quiz.Question(1, "?", "", dict(zip("ABCD", options, strict=True)), answer)

    assert length_cue(question(["long one", "short", "short", "tiny"], "A")) == "longest"
    assert length_cue(question(["`x`", "y", "zz", "ww"], "A")) == "shortest"  # shown: x
    assert length_cue(question(["same", "same", "tin", "ti"], "A")) == "longest"  # a tie at the top
    assert length_cue(question(["mid", "long", "s", "mid"], "A")) == ""
    assert length_cue(question(["3/24", "3/15", "3/12", "3/27"], "A")) == ""  # nothing to see


def test_each_letter_is_right_in_15_to_35_percent_of_the_questions():
    stats = statistics()
    low, high = LETTER_SHARE
    shares = {letter: stats["letters"][letter] / stats["questions"] for letter in quiz.OPTIONS}
    assert all(low <= share <= high for share in shares.values()), (shares, stats["per_quiz"])


@pytest.mark.parametrize("cue", ["longest", "shortest"])
def test_the_right_option_is_rarely_the_longest_or_the_shortest(cue):
    found = [(n, q.number) for n, q in course_questions() if length_cue(q) == cue]
    assert len(found) <= LENGTH_CUE_SHARE * len(course_questions()), (
        f"the right option is the {cue} in {found}"
    )


def test_the_packt_quiz_questions_are_mapped_to_course_questions():
    """The end-of-chapter quiz of the Packt book's chapter "Distributed Training at a Glance" is
    covered: quiz 01's answers file names the book and maps each of its questions to a question
    of quiz 01, on the same topic."""
    preamble = (QUIZ / "chapter01-answers.md").read_text(encoding="utf-8").split("\n### ")[0]
    assert PACKT in preamble and "Maicon Melo Alves" in preamble and "Packt" in preamble
    mapped = {
        int(p): int(q) for p, q in re.findall(r"Packt question (\d) \([^)]*\) is question (\d)", preamble)
    }
    assert sorted(mapped) == [1, 2], "map Packt questions 1 and 2 to questions of quiz 01"
    right = {q.number: q.options[q.answer].lower() for q in quiz.load(1, QUIZ).questions}
    assert "memory" in right[mapped[1]] and "slow" in right[mapped[1]]  # the two reasons
    assert (
        "data parallelism" in right[mapped[2]] and "model parallelism" in right[mapped[2]]
    )  # the strategies


if __name__ == "__main__":
    found = statistics()
    total = found["questions"]
    print(f"{total} questions in {len(COURSE_CHAPTERS)} quizzes")
    print(
        "right letter:",
        ", ".join(f"{k} {found['letters'][k]} ({found['letters'][k] / total:.0%})" for k in "ABCD"),
    )
    for cue in ("longest", "shortest"):
        print(f"right option is the {cue}: {found[cue]} of {total} ({found[cue] / total:.0%})")
    print("answer keys:", "  ".join(f"{n:02d} {key}" for n, key in found["per_quiz"].items()))
