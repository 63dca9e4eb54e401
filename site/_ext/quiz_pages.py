"""A chapter's quiz as a web page: the questions, each answer folded under its question.

Reads ``quiz/chapterNN.md`` and ``quiz/chapterNN-answers.md`` with the course's own parser
(``course_utils/notebook/quiz_parse.py``, loaded from its file: it needs only the standard library,
and the site's build installs neither the course nor torch) and writes one MyST page.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _parser():
    name = "course_quiz_parse"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            name, ROOT / "course_utils" / "notebook" / "quiz_parse.py"
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses look their module up here
        spec.loader.exec_module(module)
    return sys.modules[name]


def quiz_page(questions_file: Path, chapter_link: str | None) -> str:
    """MyST text of the page for ``questions_file`` (its ``-answers.md`` beside it)."""
    parse = _parser().parse
    answers_file = questions_file.with_name(questions_file.stem + "-answers.md")
    if not answers_file.exists():
        raise SystemExit(f"{questions_file}: no {answers_file.name} beside it; write the answers file")
    chapter, title, questions, _ = parse(questions_file)
    answers = {q.number: q for q in parse(answers_file)[2]}
    lines = [f"# Quiz {chapter:02d} - {title}", ""]
    where = f"[chapter {chapter:02d}]({chapter_link})" if chapter_link else f"chapter {chapter:02d}"
    lines += [
        f"Eight questions on {where}. Choose an option, then open the answer below the question. "
        f'In the notebook, `quiz.check({chapter}, "ABCD...")` grades a whole set of answers.',
        "",
    ]
    for q in questions:
        lines += [f"**{q.number}. {q.text}**", ""]
        if q.body:
            lines += [q.body, ""]
        lines += [f"- **{letter}.** {text}" for letter, text in q.options.items()] + [""]
        answer = answers.get(q.number)
        if answer is None or not answer.answer:
            raise SystemExit(f"{answers_file}: question {q.number} has no single bold (right) option")
        lines += [
            ":::{dropdown} Answer",
            f"**{answer.answer}. {answer.options[answer.answer]}**",
            "",
            answer.explanation,
            ":::",
            "",
        ]
    return "\n".join(lines)
