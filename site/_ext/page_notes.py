"""Notes on a notebook page where it needs one: the ⏱ / ⚙ lines, the explorers, the quiz.

- Before the first cell whose output holds a ⏱ or ⚙ line: what the markers mean (a value
  measured on the machine that ran the notebook), with a link to ``reading-outputs``; later ones
  carry the same text as a tooltip (``_static/markers.js``).
- After an explorer's cell (an ipywidgets view in its outputs): the page shows its figure at the
  starting values, and the sliders need a running notebook. The widgets are not embedded: that
  would load a widget manager from a CDN and show sliders that cannot redraw anything.
- At the end of a chapter's "Quiz" section: a link to the quiz's page, where each answer is
  folded under its question.
"""

from __future__ import annotations

import re

from docutils import nodes
from sphinx import addnodes

MARKERS = ("⏱", "⚙")
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
MARKERS_TEXT = (
    "In the outputs below, what follows ⏱ on a line is a time, rate or bandwidth measured when "
    "the notebook was run, and what follows ⚙ is another value that depends on the machine (a "
    "trained metric's last digits, a float difference, a device name). Yours will differ: the "
    "cells assert only what holds on every machine. "
)
EXPLORER_TEXT = (
    "This is the explorer's figure at its starting values. In a running notebook (JupyterLab, or "
    "Colab and Kaggle from the rocket button at the top of the page) sliders appear under it, "
    "and moving them redraws the figure."
)


def _cells(doctree):
    return [c for c in doctree.findall(nodes.container) if c.get("nb_element") == "cell_code"]


def _outputs(cell) -> list[nodes.Element]:
    return [c for c in cell.findall(nodes.container) if c.get("nb_element") == "cell_code_output"]


def _note(title: str, classes: list[str], *body: nodes.Node) -> nodes.admonition:
    note = nodes.admonition("", classes=["note", *classes])
    note += nodes.title("", title)
    note += nodes.paragraph("", "", *body)
    return note


def _doc_link(docname: str, target: str, text: str) -> addnodes.pending_xref:
    link = addnodes.pending_xref(
        "", refdomain="std", reftype="doc", reftarget=target, refexplicit=True, refdoc=docname, refwarn=True
    )
    link += nodes.inline("", text)
    return link


def _quiz_link(app, doctree) -> None:
    chapter = re.match(r"chapters/(\d\d)_", app.env.docname)
    quiz = f"quiz/chapter{chapter[1]}" if chapter else None
    if quiz not in app.env.found_docs:
        return
    for section in doctree.findall(nodes.section):
        if section[0].astext().strip() == "Quiz":
            link = _doc_link(app.env.docname, f"/{quiz}", f"Quiz {chapter[1]}")
            section += nodes.paragraph(
                "", "", link, nodes.Text(": the same questions, each answer folded under it.")
            )
            return


def add_notes(app, doctree) -> None:
    cells = _cells(doctree)
    marked = [c for c in cells if any(m in o.astext() for o in _outputs(c) for m in MARKERS)]
    if marked:
        link = _doc_link(app.env.docname, "/reading-outputs", "Reading the outputs")
        note = _note("⏱ and ⚙", ["course-markers"], nodes.Text(MARKERS_TEXT), link, nodes.Text("."))
        marked[0].parent.insert(marked[0].parent.index(marked[0]), note)
    for cell in cells:
        if any(c.get("mime_type") == WIDGET_VIEW for c in cell.findall(nodes.container)):
            note = _note("Explorer", ["course-explorer"], nodes.Text(EXPLORER_TEXT))
            cell.parent.insert(cell.parent.index(cell) + 1, note)
    _quiz_link(app, doctree)


def setup(app):
    app.connect("doctree-read", add_notes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
