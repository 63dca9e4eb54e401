"""Sphinx configuration of the course's website (``nox -s site``, or ``python site/build.py``).

The pages are the committed, executed notebooks (chapters, appendices, worked solutions), never
re-run (myst-nb's execution is off), the quizzes, and the README's chapter table as the home page.
``site/build.py`` lays out the source folder (``build/site-src/``) and calls Sphinx with this folder
as its configuration; the extensions in ``site/_ext/`` add what the theme lacks.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "_ext"))

from course_release import release_info  # noqa: E402  (site/_ext, on the path just above)

RELEASE = release_info(HERE.parent / "pyproject.toml")

project = "Distributed Training for Large Recommendation Models"
author = "the course's authors"
copyright = "the course's authors, under the Apache-2.0 license"
version = release = RELEASE.version

extensions = [
    "myst_nb",
    "sphinx_design",
    "sphinx.ext.mathjax",
    "sphinx-mathjax-offline",  # MathJax 3 from its wheel, copied into _static/mathjax
    "error_cells",  # site/_ext: a stored error output fails the build
    "page_notes",  # site/_ext: the ⏱ and ⚙ lines, the explorers' sliders, the quiz's answers
    "section_links",  # site/_ext: "section 5" links to section 5; Jupyter's heading anchors
    "launch_kaggle",  # site/_ext: Kaggle beside the theme's Colab button
]

root_doc = "index"
exclude_patterns = ["README.md", "**/.ipynb_checkpoints"]  # README.md: only included by index.md

# The notebooks are shown as committed: nbval has compared exactly these outputs.
nb_execution_mode = "off"
nb_merge_streams = True
nb_ipywidgets_js = {}  # no widget manager from a CDN: the explorers' figures are stored as images
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence"]
myst_heading_anchors = 3
myst_heading_slug_func = "section_links.jupyter_slug"  # "## Exercise 1" -> #Exercise-1, as Jupyter

html_theme = "sphinx_book_theme"
html_title = project
html_favicon = "_static/favicon.svg"  # else browsers ask for /favicon.ico, a 404
html_context = {"default_mode": "auto"}  # the theme logs an error on a first visit without it
html_static_path = ["_static"]
html_css_files = ["course.css"]
html_js_files = ["markers.js"]
html_copy_source = True
html_show_sourcelink = False
html_last_updated_fmt = None
html_theme_options = {
    "repository_url": RELEASE.repository,
    "repository_branch": RELEASE.tag,  # the launch buttons open the notebooks of this release
    "path_to_docs": "",
    "use_repository_button": True,
    "use_download_button": True,
    "use_fullscreen_button": False,
    "launch_buttons": {"colab_url": "https://colab.research.google.com"},
    "home_page_in_toc": True,
    "show_toc_level": 2,
    "navigation_with_keys": False,
    "footer_content_items": ["copyright.html"],
    "navbar_persistent": [],  # search lives in the sidebar; no second field in a header bar
}
