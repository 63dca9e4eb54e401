"""course_utils.notebook.quiz: (a) every quiz in the repo is well formed, (b) parsing, grading, errors."""

import json
import re
from pathlib import Path

import pytest

from course_utils import quiz

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "quiz_fixtures"
REPO_CHAPTERS = sorted(
    {
        int(m[1])
        for p in (ROOT / "quiz").glob("chapter*.md")
        if (m := re.fullmatch(r"chapter(\d+)(?:-answers)?\.md", p.name))
    }
)
NOTEBOOKS = sorted((ROOT / "chapters").glob("[0-9][0-9]_*.ipynb"))


# (a) the repository's quizzes and chapters ------------------------------------------------


@pytest.mark.parametrize("chapter", REPO_CHAPTERS)
def test_repo_quiz_is_well_formed(chapter):
    q = quiz.load(chapter, ROOT / "quiz")  # raises on any mismatch between the two files
    assert q.chapter == chapter and q.title
    assert len(q.questions) == 8
    for question in q.questions:
        assert tuple(question.options) == ("A", "B", "C", "D")
        assert question.answer in question.options
        assert question.explanation


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.name)
def test_chapter_notebook_asks_its_quiz(notebook):
    chapter = int(notebook.name[:2])
    assert chapter in quiz.chapters(ROOT / "quiz"), f"add quiz/chapter{chapter:02d}.md and its answers file"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    code = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert re.search(rf"quiz\.ask\(\s*{chapter}\s*\)", code), f"add a cell with quiz.ask({chapter})"


def test_default_folder_is_repo_quiz(monkeypatch):
    monkeypatch.delenv("COURSE_QUIZ_DIR", raising=False)
    assert quiz.folder() == ROOT / "quiz"
    monkeypatch.setenv("COURSE_QUIZ_DIR", str(FIXTURES))
    assert quiz.folder() == FIXTURES and quiz.chapters() == [1, 2]
    assert quiz.folder(ROOT) == ROOT


# (b) parsing ------------------------------------------------------------------------------


def test_parse_fixture_with_code_block_and_inline_code():
    q = quiz.load(1, FIXTURES)
    assert (q.chapter, q.title, len(q.questions)) == (1, "Why distribute", 8)
    third = q.questions[2]
    assert third.text == "What does this code print?"
    assert third.body.startswith("```python") and "A. = rows * dim" in third.body
    assert third.options == {"A": "`16000`", "B": "`64000`", "C": "`4000`", "D": "`1000`"}
    assert third.answer == "B"
    assert third.explanation.splitlines()[-1] == "A float32 value takes 4 bytes."
    assert [x.answer for x in q.questions] == list("BCBCBBBB")


def test_parse_list_markers_blank_lines_and_bold_letter():
    q = quiz.load("chapter02", FIXTURES)
    assert q.title == "Process groups"
    assert q.questions[0].options["C"] == "option c of 1" and q.questions[0].answer == "C"
    assert q.questions[0].explanation == "Explanation: C is right for question 1."


@pytest.mark.parametrize("chapter", [1, "1", "01", "chapter01", "Chapter 1", " chapter1 "])
def test_chapter_spellings(chapter):
    assert quiz.chapter_number(chapter) == 1


@pytest.mark.parametrize("chapter", ["one", "ch-1", 1.0, True, None, "1a"])
def test_bad_chapter_spelling(chapter):
    with pytest.raises(ValueError, match="chapter must be a number such as 4, '04' or 'chapter04'"):
        quiz.load(chapter, FIXTURES)


def test_unknown_chapter_lists_the_known_ones(tmp_path):
    with pytest.raises(ValueError, match=r"no quiz for chapter 9; quizzes exist for chapters 1, 2 "):
        quiz.ask(9, FIXTURES)
    with pytest.raises(ValueError, match=r"no quiz for chapter 1; there are no quizzes in .*COURSE_QUIZ_DIR"):
        quiz.check(1, "A" * 8, quiz_dir=tmp_path)


# ask --------------------------------------------------------------------------------------


def test_ask_prints_questions_not_answers(capsys):
    quiz.ask(1, FIXTURES)
    text = capsys.readouterr().out
    assert text.startswith("Quiz: Chapter 1 - Why distribute (8 questions)\n\n1. An embedding table")
    assert "   B. 2.56 GB\n" in text and "   ```python\n" in text
    assert "**" not in text and "2.56e9" not in text  # no bold answer, no explanation
    assert text.rstrip().endswith('quiz.check(1, "ABCD...") with your 8 letters, one per question, in order.')
    quiz.ask("01", FIXTURES)
    assert capsys.readouterr().out == text  # deterministic


def test_ask_in_a_kernel_displays_markdown_and_plain_text(monkeypatch):
    shown = []
    monkeypatch.setattr("IPython.get_ipython", lambda: type("Shell", (), {"kernel": object()})())
    monkeypatch.setattr("IPython.display.display", lambda obj, raw: shown.append(obj))
    quiz.ask(1, FIXTURES)
    (bundle,) = shown
    assert set(bundle) == {"text/plain", "text/markdown"}
    assert bundle["text/plain"].startswith("Quiz: Chapter 1")
    md = bundle["text/markdown"]
    assert "**1. An embedding table" in md and "A. 64 MB  \nB. 2.56 GB  \n" in md
    assert "**B." not in md and "2.56e9" not in md


# check ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "answers",
    [
        "BCBCBBBA",
        "bcbc bbba",
        "B,C,B,C,B,B,B,A",
        list("BCBCBBBA"),
        {i + 1: x for i, x in enumerate("BCBCBBBa")},
        {str(i + 1): x for i, x in enumerate("BCBCBBBA")},
    ],
)
def test_check_accepts_string_list_dict(answers, capsys):
    result = quiz.check(1, answers, quiz_dir=FIXTURES)
    assert (result.score, result.total) == (7, 8)
    assert repr(result) == "Result(chapter=1, score=7/8, wrong=[8])"
    assert [g.correct for g in result.details] == [True] * 7 + [False]
    last = result.details[-1]
    assert (last.number, last.given, last.answer, last.answer_text) == (8, "A", "B", "`gloo`")
    out = capsys.readouterr().out
    assert out == str(result) + "\n"
    assert out.startswith("Chapter 1 - Why distribute: 7/8 right\n\n1. right: B. 2.56 GB\n   10,000,000 rows")
    assert "8. wrong (you chose A): B. `gloo`\n   gloo runs on CPUs" in out


def test_check_quietly(capsys):
    assert quiz.check(2, "CDABCDAB", quiz_dir=FIXTURES, show=False).score == 8
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    "answers, message",
    [
        ("BCEBBBBB", "question 3: 'E' is not an option; choose one of A, B, C, D"),
        ("BCxBBBBB", "question 3: 'X' is not an option; choose one of A, B, C, D"),
        (["B", "C", "", "B", "B", "B", "B", "B"], "question 3: '' is not an option"),
        ("BCB", r"expected 8 answers, got 3 \('BCB'\); give one letter per question"),
        ("BCBCBBBBB", "expected 8 answers, got 9"),
        (list("BCB"), "expected 8 answers, got 3"),
        ({1: "B", 2: "C"}, r"one key per question 1..8: missing \[3, 4, 5, 6, 7, 8\]"),
        ({i: "B" for i in range(1, 10)}, r"missing \[\], unknown \[9\]"),
        ({"one": "B"}, r"answers dict keys must be question numbers 1..8, got \['one'\]"),
    ],
)
def test_check_bad_answers(answers, message):
    with pytest.raises(ValueError, match=message):
        quiz.check(1, answers, quiz_dir=FIXTURES)


def test_check_bad_answer_type():
    with pytest.raises(TypeError, match="answers must be a string, list or dict, got int"):
        quiz.check(1, 12345678, quiz_dir=FIXTURES)


# malformed quiz files ---------------------------------------------------------------------


def broken(tmp_path, questions=None, answers=None):
    """Copy fixture chapter 1 to tmp_path, applying (old, new) replacements to either file."""
    for name, edits in (("chapter01.md", questions), ("chapter01-answers.md", answers)):
        text = (FIXTURES / name).read_text(encoding="utf-8")
        for old, new in edits or []:
            assert old in text, old
            text = text.replace(old, new, 1)
        (tmp_path / name).write_text(text, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    "old, new, message",
    [
        (
            "**C. Two**",
            "C. Two",
            r", question 4: expected exactly one bold option \(like \*\*B. text\*\*\), found 0",
        ),
        ("A. None", "**A. None**", r", question 4: expected exactly one bold option .*found 2"),
        ("How large", "How big", r", question 1: the question differs from chapter01.md"),
        (
            "C. 640 MB",
            "C. 0.64 GB",
            r", question 1: option C differs from chapter01.md: '0.64 GB' vs '640 MB'",
        ),
        ("print(rows * dim * 4)", "print(rows * dim)", r", question 3: the text before the options differs"),
        (
            "The first and second moment estimates.",
            "",
            r", question 4: add one or two sentences of explanation",
        ),
        ("Why distribute", "Why distribution", r": title 'Why distribution' differs from 'Why distribute'"),
    ],
)
def test_malformed_answers_file(tmp_path, old, new, message):
    with pytest.raises(ValueError, match="^chapter01-answers.md" + message):
        quiz.load(1, broken(tmp_path, answers=[(old, new)]))


@pytest.mark.parametrize(
    "old, new, message",
    [
        ("D. Four\n", "", r", question 4: expected options A, B, C, D, one per line.*found A, B, C$"),
        ("D. Four\n", "D. Four\nE. Eight\n", r", question 4: .*found A, B, C, D, E$"),
        ("D. Four\n", "C. Four\n", r", question 4: option C appears twice"),
        (
            "### 5.",
            "### 6.",
            r", question 6: questions must be numbered 1, 2, 3, ... in order \(expected 5\)",
        ),
        (
            "D. Four\n",
            "D. Four\n\nThe answer is C.\n",
            r", question 4: bold options and text after the options",
        ),
        ("B. One", "**B. One**", r", question 4: .*must not reveal answers"),
        ("# Chapter 01 - ", "Chapter 1: ", r": the first line must be '# Chapter NN - Title'"),
        ("# Chapter 01", "# Chapter 02", r": the heading says chapter 2, expected 1"),
    ],
)
def test_malformed_questions_file(tmp_path, old, new, message):
    with pytest.raises(ValueError, match="^chapter01.md" + message):
        quiz.load(1, broken(tmp_path, questions=[(old, new)]))


def test_wrong_number_of_questions(tmp_path):
    text = (FIXTURES / "chapter01.md").read_text(encoding="utf-8")
    folder = broken(tmp_path, [(text[text.index("### 8.") :], "")])
    with pytest.raises(ValueError, match="chapter01.md: expected 8 questions, found 7"):
        quiz.load(1, folder)


def test_missing_answers_file(tmp_path):
    (broken(tmp_path) / "chapter01-answers.md").unlink()
    with pytest.raises(ValueError, match="chapter01-answers.md is missing: add it next to chapter01.md"):
        quiz.check(1, "A" * 8, quiz_dir=tmp_path)
