"""A Kaggle button beside the book theme's Colab button, on every notebook page.

sphinx-book-theme builds the launch menu (Colab, from ``launch_buttons.colab_url``) in its
``html-page-context`` handler; this one runs after it and adds Kaggle's "open a notebook from
GitHub" address for the same file at the same release (the theme's ``repository_url`` and
``repository_branch``, which ``conf.py`` reads from ``pyproject.toml``):
``https://www.kaggle.com/kernels/welcome?src=https://github.com/ORG/REPO/blob/vX.Y.Z/PATH``.
"""

from __future__ import annotations

from pathlib import Path

KAGGLE = "https://www.kaggle.com/kernels/welcome?src="


def add_kaggle_button(app, pagename, templatename, context, doctree) -> None:
    groups = [b for b in context.get("header_buttons", []) if b.get("label") == "launch-buttons"]
    if not groups:
        return  # not a notebook page
    options = app.config.html_theme_options
    path = pagename + Path(app.env.doc2path(pagename)).suffix
    notebook = f"{options['repository_url']}/blob/{options['repository_branch']}/{path}"
    groups[0]["buttons"].append(
        {
            "type": "link",
            "text": "Kaggle",
            "tooltip": "Launch on Kaggle",
            "icon": "fab fa-kaggle",
            "url": KAGGLE + notebook,
            "label": "launch-kaggle",
        }
    )


def setup(app):
    app.connect("html-page-context", add_kaggle_button, priority=510)  # after the theme's (501)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
