"""Chapter quizzes: show the questions in a notebook, grade a learner's answers.

Each chapter NN has two files in ``quiz/`` (at the repository root; installed with the package
as ``course_utils/quiz_files``, see ``folder``)::

    chapterNN.md          # Chapter NN - Title, then "### 1. Question?" and options "A." to "D."
    chapterNN-answers.md  # the same, the right option in bold (**B. text**), then an explanation

In a notebook::

    from course_utils import quiz
    quiz.ask(4)                     # shows chapter 4's questions
    quiz.check(4, "BCAD ABCD")      # grades them, explains every answer

The folder can be moved with ``COURSE_QUIZ_DIR`` or ``quiz_dir=``. ``load`` parses each file
(``quiz_parse``) and cross-checks the two; every problem raises ``ValueError`` naming the file
and question. The two-file layout, a questions file and an answers file per chapter, is the one
of the end-of-chapter quizzes in Maicon Melo Alves, *Accelerate Model Training with PyTorch 2.X*
(Packt, 2024); ``quiz/chapter01-answers.md`` says which of its questions the course covers.

Not taught in a chapter: every chapter ends with its quiz, ``quiz.ask(NN)``.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

# Question and Quiz are re-exported: quiz.load returns them
from course_utils.notebook.quiz_parse import OPTIONS, QUESTIONS_PER_CHAPTER, Question, Quiz, parse  # noqa: F401
from course_utils.notebook.show import in_kernel


@dataclass(frozen=True)
class Graded:
    """One graded question: the letter ``given``, the right ``answer``, its text and why."""

    number: int
    given: str
    answer: str
    correct: bool
    answer_text: str
    explanation: str


@dataclass(frozen=True)
class Result:
    """A graded attempt: ``score`` out of ``total``, ``details`` per question.

    ``repr`` is one line; ``str`` is the full report that ``check`` prints.
    """

    chapter: int
    title: str
    score: int
    total: int
    details: tuple[Graded, ...]

    def __repr__(self) -> str:
        wrong = [g.number for g in self.details if not g.correct]
        return f"Result(chapter={self.chapter}, score={self.score}/{self.total}, wrong={wrong})"

    def __str__(self) -> str:
        lines = [f"Chapter {self.chapter} - {self.title}: {self.score}/{self.total} right"]
        for g in self.details:
            verdict = "right" if g.correct else f"wrong (you chose {g.given})"
            lines += ["", f"{g.number}. {verdict}: {g.answer}. {g.answer_text}"]
            lines += ["   " + line if line else "" for line in g.explanation.splitlines()]
        return "\n".join(lines)


def folder(quiz_dir: str | os.PathLike | None = None) -> Path:
    """The quiz folder: ``quiz_dir`` if given, else ``$COURSE_QUIZ_DIR``, else the checkout's
    ``quiz/`` (in a checkout), else the copy installed with the package (``course_utils/quiz_files``,
    e.g. after ``pip install git+...``)."""
    if quiz_dir or os.environ.get("COURSE_QUIZ_DIR"):
        return Path(quiz_dir or os.environ["COURSE_QUIZ_DIR"])
    root = Path(__file__).resolve().parents[2]  # the checkout, or site-packages in a wheel install
    if (root / "quiz").is_dir() and (root / "pyproject.toml").is_file():
        return root / "quiz"
    # pyproject.toml maps the package course_utils.quiz_files to the top-level quiz/
    return Path(str(resources.files("course_utils") / "quiz_files"))


def chapters(quiz_dir: str | os.PathLike | None = None) -> list[int]:
    """Sorted numbers of the chapters that have a questions file ``chapterNN.md``."""
    found = (re.fullmatch(r"chapter(\d+)\.md", p.name) for p in folder(quiz_dir).glob("chapter*.md"))
    return sorted(int(m[1]) for m in found if m)


def chapter_number(chapter: int | str) -> int:
    """Accepts ``4``, ``"04"``, ``"chapter04"`` or ``"Chapter 4"``; returns ``4``."""
    m = re.fullmatch(r"(?:chapter)?\s*(\d+)", str(chapter).strip(), re.IGNORECASE)
    if isinstance(chapter, bool) or not isinstance(chapter, (int, str)) or not m:
        raise ValueError(f"chapter must be a number such as 4, '04' or 'chapter04', got {chapter!r}")
    return int(m[1])


def load(chapter: int | str, quiz_dir: str | os.PathLike | None = None) -> Quiz:
    """Parse and cross-check a chapter's two quiz files; ``ValueError`` names any problem.

    Checks: each file's heading names the chapter; 8 questions numbered 1-8 with
    options A-D; the same title, questions and options in both files; in the
    questions file no bold option and no text after the options; in the answers
    file exactly one bold option and an explanation per question.
    """
    n, where = chapter_number(chapter), folder(quiz_dir)
    qfile, afile = where / f"chapter{n:02d}.md", where / f"chapter{n:02d}-answers.md"
    if not qfile.is_file():
        known = ", ".join(map(str, chapters(where)))
        found = f"quizzes exist for chapters {known}" if known else "there are no quizzes"
        missing = "" if where.is_dir() else " (no such folder)"
        raise ValueError(
            f"no quiz for chapter {n}; {found} in {where}{missing} "
            f"(set COURSE_QUIZ_DIR to the course's quiz/ folder, or pass quiz_dir=, to look elsewhere)"
        )
    if not afile.is_file():
        raise ValueError(f"{afile.name} is missing: add it next to {qfile.name}")
    (qn, qtitle, asked, qbold), (an, atitle, answered, abold) = parse(qfile), parse(afile)
    for path, num, found in ((qfile, qn, asked), (afile, an, answered)):
        if num != n:
            raise ValueError(f"{path.name}: the heading says chapter {num}, expected {n}")
        if len(found) != QUESTIONS_PER_CHAPTER:
            raise ValueError(f"{path.name}: expected {QUESTIONS_PER_CHAPTER} questions, found {len(found)}")
    if " ".join(qtitle.split()) != " ".join(atitle.split()):
        raise ValueError(f"{afile.name}: title {atitle!r} differs from {qtitle!r} in {qfile.name}")
    for q, a in zip(asked, answered, strict=False):
        at, aat = f"{qfile.name}, question {q.number}", f"{afile.name}, question {q.number}"
        pairs = [("the question", q.text, a.text), ("the text before the options", q.body, a.body)]
        for what, x, y in pairs + [(f"option {k}", q.options[k], a.options[k]) for k in OPTIONS]:
            if " ".join(x.split()) != " ".join(y.split()):
                raise ValueError(f"{aat}: {what} differs from {qfile.name}: {y!r} vs {x!r}")
        if qbold[q.number] or q.explanation:
            raise ValueError(
                f"{at}: bold options and text after the options belong in "
                f"{afile.name} only (the questions file must not reveal answers)"
            )
        if len(abold[q.number]) != 1:
            raise ValueError(
                f"{aat}: expected exactly one bold option (like **B. text**), found {len(abold[q.number])}"
            )
        if not a.explanation:
            raise ValueError(f"{aat}: add one or two sentences of explanation after the options")
    return Quiz(n, qtitle, tuple(answered))


def _render(quiz: Quiz) -> tuple[str, str]:
    """The questions, never the answers, as (plain text, Markdown)."""
    call = f'quiz.check({quiz.chapter}, "ABCD...")'
    hint = f"with your {len(quiz.questions)} letters, one per question, in order."
    text = [f"Quiz: Chapter {quiz.chapter} - {quiz.title} ({len(quiz.questions)} questions)"]
    md = [f"**Quiz: Chapter {quiz.chapter} - {quiz.title}**"]
    for q in quiz.questions:
        options = [f"{k}. {v}" for k, v in q.options.items()]
        text += ["", f"{q.number}. {q.text}"]
        text += ["   " + line if line else "" for line in q.body.splitlines() + options]
        md += ["", f"**{q.number}. {q.text}**", ""] + ([q.body, ""] if q.body else [])
        md += ["  \n".join(options)]  # two spaces: a line break in Markdown
    text += ["", f"Check your answers: {call} {hint}"]
    md += ["", f"Check your answers: `{call}` {hint}"]
    return "\n".join(text), "\n".join(md)


def ask(chapter: int | str, quiz_dir: str | os.PathLike | None = None) -> None:
    """Show a chapter's questions: Markdown in a notebook (plain text beside it), else printed."""
    text, markdown = _render(load(chapter, quiz_dir))
    if in_kernel():
        from IPython.display import display

        display({"text/plain": text, "text/markdown": markdown}, raw=True)
    else:
        print(text)


def _letters(quiz: Quiz, answers: str | dict | list | tuple) -> list[str]:
    """The learner's answers as one upper-case letter per question, or a ``ValueError``."""
    n, how = len(quiz.questions), f'give one letter per question, e.g. quiz.check({quiz.chapter}, "ABCD...")'
    if isinstance(answers, str):
        given = list(re.sub(r"[\s,]", "", answers))
    elif isinstance(answers, dict):
        try:
            keyed = {int(k): v for k, v in answers.items()}
        except (TypeError, ValueError):
            raise ValueError(
                f"answers dict keys must be question numbers 1..{n}, got {list(answers)}"
            ) from None
        missing = [i for i in range(1, n + 1) if i not in keyed]
        unknown = sorted(set(keyed) - set(range(1, n + 1)))
        if missing or unknown:
            raise ValueError(
                f"answers dict needs one key per question 1..{n}: missing {missing}, unknown {unknown}"
            )
        given = [keyed[i] for i in range(1, n + 1)]
    elif isinstance(answers, (list, tuple)):
        given = list(answers)
    else:
        raise TypeError(f"answers must be a string, list or dict, got {type(answers).__name__}; {how}")
    if len(given) != n:
        raise ValueError(f"expected {n} answers, got {len(given)} ({answers!r}); {how}")
    letters = [g.strip().upper() if isinstance(g, str) else g for g in given]
    for q, letter in zip(quiz.questions, letters, strict=False):
        if letter not in q.options:
            raise ValueError(
                f"question {q.number}: {letter!r} is not an option; choose one of {', '.join(q.options)}"
            )
    return letters


def check(
    chapter: int | str,
    answers: str | dict | list | tuple,
    quiz_dir: str | os.PathLike | None = None,
    show: bool = True,
) -> Result:
    """Grade ``answers`` ("BCAD ABCD", a list, or {1: "B", ...}); print the report if ``show``."""
    quiz = load(chapter, quiz_dir)
    details = tuple(
        Graded(q.number, g, q.answer, g == q.answer, q.options[q.answer], q.explanation)
        for q, g in zip(quiz.questions, _letters(quiz, answers), strict=False)
    )
    result = Result(quiz.chapter, quiz.title, sum(g.correct for g in details), len(details), details)
    if show:
        print(result)
    return result
