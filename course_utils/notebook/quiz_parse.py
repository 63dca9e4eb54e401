"""The quiz file format: parse one ``quiz/chapterNN.md`` or ``chapterNN-answers.md`` file.

A file is ``# Chapter NN - Title``, then questions ``### N. Question?``, each with optional lines
(a code block) before its options ``A.`` to ``D.``, one per line; in an answers file the right
option is bold (``**B. text**``) and an explanation follows the options. Text before the first
question is not shown (an answers file may say there where its questions come from).
``course_utils.notebook.quiz`` cross-checks a chapter's two files and grades answers.

Not taught in a chapter: the format of the files behind ``quiz.ask`` and ``quiz.check``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

QUESTIONS_PER_CHAPTER = 8
OPTIONS = ("A", "B", "C", "D")
_TITLE = re.compile(r"#\s+Chapter\s+(\d+)\s+[-\u2013\u2014]\s+(\S.*)")
_QUESTION = re.compile(r"###\s+(\d+)\.\s+(\S.*)")
_OPTION = re.compile(r"(?:[-*]\s+)?(\*\*)?([A-Z])\.(?:\*\*)?\s+(\S.*)")  # "A. x", "**A. x**", "- A. x"


@dataclass(frozen=True)
class Question:
    """One question: its number, text, lines shown before the options, options, answer."""

    number: int
    text: str
    body: str  # explanatory lines or a code block, "" if none
    options: dict[str, str]  # letter -> option text (inline markdown kept)
    answer: str = ""  # the right letter (from the answers file)
    explanation: str = ""


@dataclass(frozen=True)
class Quiz:
    """A chapter's quiz: ``chapter`` number, ``title`` and its questions in order."""

    chapter: int
    title: str
    questions: tuple[Question, ...]


def parse(path: Path) -> tuple[int, str, list[Question], dict[int, list[str]]]:
    """Parse one quiz file: chapter, title, questions, and the bold letters of each question."""
    lines = path.read_text(encoding="utf-8-sig").splitlines()
    title = _TITLE.fullmatch(lines[0].strip()) if lines else None
    if not title:
        raise ValueError(f"{path.name}: the first line must be '# Chapter NN - Title'")
    blocks: list[dict] = []
    fenced = False  # inside a ``` code block
    for line in lines[1:]:
        s = line.strip()
        heading, option = not fenced and _QUESTION.fullmatch(s), not fenced and _OPTION.fullmatch(s)
        fenced ^= s.startswith(("```", "~~~"))
        if heading:
            blocks.append(
                dict(number=int(heading[1]), text=heading[2], body=[], options={}, bold=[], after=[])
            )
        elif not blocks:
            continue  # text before the first question is ignored
        elif option and not blocks[-1]["after"]:
            b, letter, text = blocks[-1], option[2], option[3]
            if letter in b["options"]:
                raise ValueError(f"{path.name}, question {b['number']}: option {letter} appears twice")
            if option[1]:  # **B. text** or **B.** text
                b["bold"].append(letter)
                text = text[:-2].rstrip() if text.endswith("**") else text
            b["options"][letter] = text
        elif blocks[-1]["options"]:
            if s or blocks[-1]["after"]:
                blocks[-1]["after"].append(line.rstrip())  # after the options: explanation
        else:
            blocks[-1]["body"].append(line.rstrip())  # between heading and options
    questions = []
    for i, b in enumerate(blocks, start=1):
        where = f"{path.name}, question {b['number']}"
        if b["number"] != i:
            raise ValueError(f"{where}: questions must be numbered 1, 2, 3, ... in order (expected {i})")
        if tuple(b["options"]) != OPTIONS:
            raise ValueError(
                f"{where}: expected options {', '.join(OPTIONS)}, one per line, in that "
                f"order; found {', '.join(b['options']) or 'none'}"
            )
        answer = b["bold"][0] if len(b["bold"]) == 1 else ""
        questions.append(
            Question(
                b["number"],
                b["text"],
                "\n".join(b["body"]).strip("\n"),
                b["options"],
                answer,
                "\n".join(b["after"]).strip(),
            )
        )
    return int(title[1]), title[2], questions, {b["number"]: b["bold"] for b in blocks}
