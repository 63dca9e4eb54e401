"""Build the course's website into ``build/site/`` (``nox -s site`` runs this).

    python site/build.py                      # build/site/index.html
    python site/build.py --out /tmp/site      # elsewhere
    python site/build.py -E                   # other options go to sphinx-build (-E: reread all)

Sphinx (with myst-nb, execution off, and sphinx-book-theme) reads the committed, executed
notebooks as they are. This script lays out Sphinx's source folder, ``<out>-src/``, mirroring the
repository: ``chapters/`` and ``solutions/`` (copies, modification times kept, so that Sphinx
rereads only what changed), ``README.md``
(the home page includes its chapter table), the pages in ``site/*.md``, and a page per quiz
(``quiz/chapterNN.md`` with its answers folded, written by ``site/_ext/quiz_pages.py``). The
configuration is ``site/conf.py``. Every warning fails the build (``-W --keep-going``): a notebook
missing from the table of contents (``site/index.md``), a stored error output, a broken link.

Needs the ``site`` extra of ``pyproject.toml`` (not the course itself, nor torch).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import time
from pathlib import Path

SITE = Path(__file__).resolve().parent
ROOT = SITE.parent
sys.path.insert(0, str(SITE / "_ext"))

from quiz_pages import quiz_page  # noqa: E402  (site/_ext)


def stage(src: Path) -> None:
    """Lay out Sphinx's source folder ``src`` (emptied first)."""
    shutil.rmtree(src, ignore_errors=True)
    (src / "quiz").mkdir(parents=True)
    for name in ("chapters", "solutions"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    for page in [ROOT / "README.md", *SITE.glob("*.md")]:
        shutil.copy2(page, src / page.name)
    for questions in sorted((ROOT / "quiz").glob("chapter[0-9][0-9].md")):
        chapter = sorted((ROOT / "chapters").glob(f"{questions.stem[-2:]}_*.ipynb"))
        link = f"../chapters/{chapter[0].name}" if chapter else None
        (src / "quiz" / questions.name).write_text(quiz_page(questions, link), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="default: build/site")
    args, sphinx_args = parser.parse_known_args(argv)
    try:
        from sphinx.cmd.build import build_main
    except ImportError:
        print(
            "site: Sphinx is not installed here; run nox -s site, or pip install -e '.[site]'",
            file=sys.stderr,
        )
        return 2

    out = args.out.resolve()
    src, doctrees = out.with_name(out.name + "-src"), out.with_name(out.name + "-doctrees")
    start = time.perf_counter()
    stage(src)
    command = ["-b", "html", "-c", str(SITE), "-d", str(doctrees), "-W", "--keep-going", "-q"]
    status = build_main([*command, *sphinx_args, str(src), str(out)])
    took = time.perf_counter() - start
    if status:
        print(f"site: the build failed after {took:.0f} s (the warnings above say why)", file=sys.stderr)
    else:
        print(f"site: built {out / 'index.html'} in {took:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
