"""Links for the prose's section references, and Jupyter's heading anchors.

A chapter's sections are its headings that start with a number (``## 5.``, ``### 5b.``). Text such
as "section 5", "sections 9 to 12", "chapter 07, section 11" or "appendix 04a, section 2" becomes
a link to the (first) section it names: in the chapter it names, else in the page's own chapter
(a worked solution or a quiz refers to its chapter's sections). The grammar is the one
``tests/test_cross_references.py`` checks (``tests/test_site.py`` holds the two equal). A reference
to a section its chapter lacks is a warning, so the build fails on it.

``jupyter_slug`` gives headings the anchors Jupyter gives them (``## Exercise 1`` ->
``#Exercise-1``), so the chapters' links to ``../solutions/chapterNN.ipynb#Exercise-k`` resolve.
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx import addnodes
from sphinx.util import logging

logger = logging.getLogger(__name__)

NUMBERED_TITLE = re.compile(r"^(\d+[a-z]?)\.\s")
REFERENCE = re.compile(
    r"(?:(?:[Cc]hapter|[Aa]ppendix) (?P<chapter>\d\d[a-z]?)(?:['’]s|,)?\s*\(?\s*)?"
    r"[Ss]ections? (?P<first>\d+[a-z]?)(?:\s*(?:to|and|-|,)\s*(?P<last>\d+[a-z]?))?"
)
CHAPTER_DOC = re.compile(r"^chapters/(\d\d[a-z]?)_")  # chapters/04_ddp, chapters/04a_ddp_in_practice
OWN_CHAPTER = re.compile(r"^(?:solutions|quiz)/chapter(\d\d)$")
SKIP = (nodes.literal_block, nodes.literal, nodes.reference, nodes.title, nodes.raw, addnodes.pending_xref)


def jupyter_slug(title: str) -> str:
    """Jupyter's anchor for a heading: its text, spaces as hyphens, case kept."""
    return re.sub(r"[^\w\- ]", "", title.strip()).replace(" ", "-")


def chapter_of(docname: str) -> str | None:
    """``04`` for chapters/04_ddp, solutions/chapter04 and quiz/chapter04; ``04a`` for an appendix."""
    found = CHAPTER_DOC.match(docname) or OWN_CHAPTER.match(docname)
    return found[1] if found else None


def collect_sections(app, doctree) -> None:
    """Remember the numbered sections of every chapter page: {docname: {"5b": section id}}."""
    docname = app.env.docname
    if not CHAPTER_DOC.match(docname):
        return
    sections = {}
    for section in doctree.findall(nodes.section):
        numbered = NUMBERED_TITLE.match(section[0].astext())
        if numbered and section["ids"]:
            sections.setdefault(numbered[1], section["ids"][0])
    app.env.course_sections = getattr(app.env, "course_sections", {})
    app.env.course_sections[docname] = sections


def purge(app, env, docname) -> None:
    getattr(env, "course_sections", {}).pop(docname, None)


def merge(app, env, docnames, other) -> None:
    env.course_sections = getattr(env, "course_sections", {})
    env.course_sections.update(
        {d: s for d, s in getattr(other, "course_sections", {}).items() if d in docnames}
    )


def _linkable(text: nodes.Text) -> bool:
    parent = text.parent
    while parent is not None:
        if isinstance(parent, SKIP):
            return False
        parent = parent.parent
    return True


def link_references(app, doctree, fromdoc: str) -> None:
    sections = getattr(app.env, "course_sections", {})
    docs = {chapter_of(d): d for d in sections}
    own = chapter_of(fromdoc)
    for text in [t for t in doctree.findall(nodes.Text) if _linkable(t)]:
        pieces, last = [], 0
        for found in REFERENCE.finditer(text.astext()):
            chapter = found["chapter"] or own
            target = docs.get(chapter)
            if target is None:
                continue
            missing = [n for n in (found["first"], found["last"]) if n and n not in sections[target]]
            if missing:
                logger.warning(
                    f"{found[0]!r}: chapter {chapter} has no section {missing[0]}",
                    location=fromdoc,
                    type="course",
                    subtype="section_reference",
                )
                continue
            uri = "" if target == fromdoc else app.builder.get_relative_uri(fromdoc, target)
            link = nodes.reference(found[0], found[0], internal=True, classes=["section-link"])
            link["refuri"] = f"{uri}#{sections[target][found['first']]}"
            pieces += [nodes.Text(text.astext()[last : found.start()]), link]
            last = found.end()
        if pieces:
            pieces.append(nodes.Text(text.astext()[last:]))
            text.parent.replace(text, [p for p in pieces if p.astext()])


def setup(app):
    app.connect("doctree-read", collect_sections)
    app.connect("env-purge-doc", purge)
    app.connect("env-merge-info", merge)
    app.connect("doctree-resolved", link_references)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
