"""tools/commit_subject.py, the commit-msg hook: a subject of 72 characters or fewer, then a blank
line before the body."""

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()  # course-wide: the maintainers' tooling

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("commit_subject", ROOT / "tools" / "commit_subject.py")
commit_subject = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(commit_subject)


@pytest.mark.parametrize(
    "message",
    [
        "x" * 72,
        "A subject\n\nThe body, as long as it likes: " + "y" * 200,
        "# git's comment\nA subject after git's comment lines\n",
        "\n\nA subject after blank lines\n",
    ],
)
def test_a_short_subject_and_a_separate_body_pass(message):
    assert commit_subject.problems(message) == []


@pytest.mark.parametrize(
    ("message", "said"),
    [
        ("x" * 73, "73 characters, over 72"),
        ("A subject\nthe body at once", "leave a blank line"),
        ("# only git's comments\n\n", "empty"),
    ],
)
def test_a_long_subject_a_glued_body_or_nothing_fail_saying_why(message, said):
    (problem,) = commit_subject.problems(message)
    assert said in problem


def test_the_hook_exits_1_and_names_the_problem(tmp_path, capsys):
    message = tmp_path / "COMMIT_EDITMSG"
    message.write_text("z" * 80 + "\n")
    assert commit_subject.main([str(message)]) == 1
    assert "80 characters" in capsys.readouterr().err
    message.write_text("A fine subject\n\nDetails.\n")
    assert commit_subject.main([str(message)]) == 0
