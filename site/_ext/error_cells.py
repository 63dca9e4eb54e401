"""A notebook page whose stored outputs hold an error fails the build.

The site shows the committed outputs as they are (nothing is re-run), so a cell that raised when
the notebook was last executed would be published as a traceback. Each such cell is reported
(notebook, cell number, exception) as a warning, which ``site/build.py`` (``-W``) makes fatal.
"""

from __future__ import annotations

import json
from pathlib import Path

from sphinx.util import logging

logger = logging.getLogger(__name__)


def error_cells(notebook: dict) -> list[str]:
    """``"cell 12: ValueError: ..."`` for every code cell with an error output (cells from 0)."""
    found = []
    for index, cell in enumerate(notebook.get("cells", [])):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                found.append(f"cell {index}: {output.get('ename', '?')}: {output.get('evalue', '')[:200]}")
    return found


def check_notebook(app, docname: str, source: list[str]) -> None:
    if Path(app.env.doc2path(docname)).suffix != ".ipynb":
        return
    for where in error_cells(json.loads(source[0])):
        logger.warning(
            f"stored output is an error ({where}); re-execute the notebook (tools/regenerate.py)",
            location=docname,
            type="course",
            subtype="error_cell",
        )


def setup(app):
    app.connect("source-read", check_notebook)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
