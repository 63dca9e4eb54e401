"""The maintainers' dev loop: a chapter is the unit of work.

    nox -l                          # the sessions
    nox -s lint                     # ruff check and format --check, lint-imports, at pinned versions
    nox -s unit                     # tests that start no process and run no notebook (< 1 min)
    nox -s chapter -- 04            # chapter 04's tests, notebooks and worked solution (nbval)
    nox -s regenerate -- 04         # re-execute chapter 04's notebooks and solution, outputs stored
    nox -s stress -- 04 [--runs N]  # chapter 04's notebooks N times in a row (tools/stress.py)
    nox -s site                     # the course as a website, into build/site/ (site/build.py)
    nox -s ci                       # .ci/run, exactly as CI runs it (it builds its own venvs)

A chapter's notebooks are its main path and its appendices (``04a_...``). Sessions reuse their venv
(``reuse_venv``); ``nox -R`` skips the install step too. torch is installed first as
``$COURSE_TORCH`` (default: the course's torch from pyproject.toml's ``[tool.course.matrix]``, the
CPU build CI uses), so pip never replaces it with another build; ruff is the matrix's too. CI itself
starts from bare Python, without nox (.ci/run).

Not taught in a chapter: the maintainers' loop (CONTRIBUTING.md, "The dev loop").
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

import nox

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib

nox.options.reuse_venv = "yes"
nox.options.sessions = ["lint", "unit"]

ROOT = Path(__file__).parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MATRIX = PYPROJECT["tool"]["course"]["matrix"]  # the pins


def _needs_torchrec() -> frozenset[str]:
    """``NEEDS_TORCHREC``, read from its module's source (nox's own python may lack torch)."""
    tree = ast.parse((ROOT / "course_utils" / "sharding" / "torchrec_dlrm.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "NEEDS_TORCHREC":
            return frozenset(ast.literal_eval(node.value.args[0]))
    raise RuntimeError("NEEDS_TORCHREC not found in course_utils/sharding/torchrec_dlrm.py")


RUFF = f"ruff=={MATRIX['ruff']}"  # as .ci/run installs it; tests/test_packaging.py checks pre-commit's


def _install(session: nox.Session) -> None:
    session.install(os.environ.get("COURSE_TORCH", f"torch=={MATRIX['course']['torch']}"))
    session.install("-e", ".[notebook,test,kubernetes]")


def _chapter(session: nox.Session) -> str:
    """The chapter number the session was given (``-- 04``), as two digits."""
    if len(session.posargs) < 1 or not session.posargs[0].isdigit():
        session.error(f"name a chapter: nox -s {session.name} -- 04")
    number = f"{int(session.posargs[0]):02d}"
    if not list(ROOT.glob(f"chapters/{number}_*.ipynb")):
        known = sorted(p.name[:2] for p in ROOT.glob("chapters/[0-9][0-9]_*.ipynb"))
        session.error(f"no chapter {number}; the chapters are {', '.join(known)}")
    return number


def _notebooks(number: str) -> list[str]:
    """The chapter's notebook, its appendices (``07a_...``) and its worked solution."""
    found = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(f"chapters/{number}[a-z_]*.ipynb"))
    solution = ROOT / "solutions" / f"chapter{number}.ipynb"
    return found + ([str(solution.relative_to(ROOT))] if solution.exists() else [])


@nox.session
def lint(session: nox.Session) -> None:
    """ruff's linter (notebooks included) and formatter, as CI runs them; then the import
    contracts (``lint-imports``, at the matrix's version; pyproject.toml states them)."""
    session.install(RUFF)
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.install(f"import-linter=={MATRIX['import-linter']}")
    session.run("lint-imports", "--no-cache")


@nox.session
def unit(session: nox.Session) -> None:
    """The unit tier: no process launches, no notebooks (conftest.py's --unit)."""
    _install(session)
    session.run("pytest", "tests", "--unit", "-q", *session.posargs)


@nox.session
def chapter(session: nox.Session) -> None:
    """One chapter: its unit and process tests, its notebook and its solution under nbval."""
    number = _chapter(session)
    _install(session)
    session.run(
        "pytest", "--nbval", "--chapter", str(int(number)), "tests", *_notebooks(number), *session.posargs[1:]
    )


@nox.session
def regenerate(session: nox.Session) -> None:
    """Re-execute a chapter, its appendices and its worked solution in place (tools/regenerate.py).
    The appendices that need TorchRec (``NEEDS_TORCHREC``) are left out: their outputs come from a
    TorchRec environment (README)."""
    number = _chapter(session)
    _install(session)
    needing = _needs_torchrec()
    session.run(
        "python", "tools/regenerate.py", *[n for n in _notebooks(number) if Path(n).name not in needing]
    )


@nox.session
def stress(session: nox.Session) -> None:
    """A chapter's notebooks (with its appendices) run again and again (tools/stress.py; default 10
    runs). The cells of the appendices that need TorchRec are skipped where it does not import."""
    number = _chapter(session)
    _install(session)
    notebooks = [n for n in _notebooks(number) if n.startswith("chapters/")]
    session.run("python", "tools/stress.py", *session.posargs[1:], *notebooks)


@nox.session
def site(session: nox.Session) -> None:
    """The course as a website in build/site/, from the committed, executed notebooks (site/build.py).
    Installs only pyproject.toml's site extra (neither the course nor torch); options after -- go to
    the build (--out DIR) or to sphinx-build (-E: read every page again)."""
    session.install(*PYPROJECT["project"]["optional-dependencies"]["site"])
    session.run("python", "site/build.py", *session.posargs)


@nox.session(venv_backend="none")
def ci(session: nox.Session) -> None:
    """.ci/run, as CI runs it on a clean clone (it makes its own venvs)."""
    session.run("bash", ".ci/run", external=True)
