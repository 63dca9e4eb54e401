"""Every "section N" a chapter, solution or quiz names exists: in the same chapter, or in the
chapter it names ("chapter 07, section 11", "chapter 04's section 5b", "chapter 06 (sections 9 to
12)", "appendix 04a, section 2"), read line by line as the website's links read them
(``site/_ext/section_links.py``, which fails the site's build on a reference that does not resolve).

A section is a markdown heading that starts with its number (``## 5.``, ``### 5b.``). Solutions
refer to their chapter's sections. Links to solutions' exercises are checked in test_solutions.py.
"""

import json
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.chapter()

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb")) + sorted((ROOT / "solutions").glob("*.ipynb"))
HEADING = re.compile(r"^#{2,4}\s+(\d+[a-z]?)\.", re.M)
REFERENCE = re.compile(
    r"(?:(?:[Cc]hapter|[Aa]ppendix) (?P<chapter>\d\d[a-z]?)(?:['’]s|,)?\s*\(?\s*)?"
    r"[Ss]ections? (?P<first>\d+[a-z]?)(?:\s*(?:to|and|-|,)\s*(?P<last>\d+[a-z]?))?"
)


def markdown(path: Path) -> list[str]:
    return [
        "".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "markdown"
    ]


def chapter_of(path: Path) -> str:
    """``04`` for chapters/04_ddp.ipynb, solutions/chapter04.ipynb and quiz/chapter04*.md, ``07a``
    for the appendix."""
    name = path.stem.removesuffix("-answers")
    return name.removeprefix("chapter") if name.startswith("chapter") else name.split("_")[0]


SECTIONS = {
    chapter_of(p): {m.group(1) for text in markdown(p) for m in HEADING.finditer(text)}
    for p in sorted((ROOT / "chapters").glob("*.ipynb"))
}


def test_headings_are_found():
    assert {"1", "5", "6"} <= SECTIONS["08"] and "5b" in SECTIONS["04"]


QUIZZES = sorted((ROOT / "quiz").glob("chapter*.md"))


def texts(path: Path) -> list[str]:
    """The lines of a notebook's markdown cells, or of a quiz file: the website links a reference
    within one line of text (a reference broken over two lines names the page's own chapter)."""
    cells = [path.read_text(encoding="utf-8")] if path.suffix == ".md" else markdown(path)
    return [line for text in cells for line in text.splitlines()]


@pytest.mark.parametrize("path", NOTEBOOKS + QUIZZES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_section_reference_resolves(path):
    wrong = []
    for text in texts(path):
        for m in REFERENCE.finditer(text):
            chapter = m.group("chapter") or chapter_of(path)
            for number in filter(None, (m.group("first"), m.group("last"))):
                if chapter in SECTIONS and number not in SECTIONS[chapter]:
                    where = text[max(0, m.start() - 50) : m.end()]
                    wrong.append(f"...{where!r}: chapter {chapter} has no section {number}")
    assert not wrong, "\n".join(wrong)


def test_a_wrong_reference_is_caught():
    text = "as chapter 08, section 12 showed"
    m = REFERENCE.search(text)
    assert m.group("chapter") == "08" and m.group("first") == "12" and "12" not in SECTIONS["08"]
    m = REFERENCE.search("see appendix 04a, section 2")
    assert m.group("chapter") == "04a" and m.group("first") == "2"
    # The website's pages carry typographic apostrophes (Sphinx's smart quotes): chapter 07’s.
    for apostrophe in ("'", "’"):
        m = REFERENCE.search(f"as chapter 07{apostrophe}s section 9 showed")
        assert m.group("chapter") == "07" and m.group("first") == "9"
