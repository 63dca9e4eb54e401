"""The second half of every notebook's setup cell: after ``pip install`` of the course, what else a
hosted notebook (Colab, Kaggle) needs, and whether the installed course is the notebook's release.

    python -m course_utils.notebook.hosted 0.1.0      # the version the notebook belongs to

The setup cell (``templates/setup_cell.py``, three lines, the same in every notebook) installs the
course's release with ``pip install --no-deps`` where ``course_utils`` is missing, pinned to the tag
``v<version>`` of the repository (both read from ``pyproject.toml``: ``[project.urls] Repository``
and ``[project] version``; ``tests/test_packaging.py`` checks that the cell says the same), then runs
this. It:

* refuses, in one line, a course installed at another version than the notebook's: a notebook of
  one release run against another's code fails in ways that say nothing about why (exit code 1);
* installs the course's dependencies that are missing, never torch: the image's own build stays
  (a ``torch>=2.9`` resolved by pip on a machine without it would fetch a CUDA build of several GB);
* prints nothing when all is there (a checkout, a wheel install, a second run).

Taught in chapter 00 (what the first cell of every notebook does).
"""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

__all__ = ["DISTRIBUTION", "missing_requirements", "check_release", "repository", "main"]

DISTRIBUTION = "distributed-recsys-course"
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def missing_requirements() -> list[str]:
    """The course's requirements (``pip`` specs, extras left out) whose package is not installed, torch
    excepted."""
    missing = []
    for spec in metadata.requires(DISTRIBUTION) or []:
        if "extra ==" in spec:
            continue
        name = _NAME.match(spec).group(1)
        if name.lower() == "torch":
            continue
        try:
            metadata.version(name)
        except metadata.PackageNotFoundError:
            missing.append(spec.split(";")[0].strip())
    return missing


def check_release(release: str) -> str | None:
    """One line saying why the installed course is not ``release``, or None when it is."""
    try:
        installed = metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return f"the course ({DISTRIBUTION}) is not installed; run this notebook's first cell again"
    if installed == release:
        return None
    return (
        f"this notebook belongs to release {release} of the course, and {installed} is installed; "
        f'install {release} (pip install --no-deps -- "{DISTRIBUTION} @ git+{repository()}@v{release}", '
        "then restart the kernel), or open the notebook of the installed release; "
        "in a checkout: pip install -e ."
    )


def repository() -> str:
    """The course's repository, from the installed package's metadata (``[project.urls] Repository``)."""
    for entry in metadata.metadata(DISTRIBUTION).get_all("Project-URL") or []:
        label, _, url = entry.partition(",")
        if label.strip().lower() == "repository":
            return url.strip()
    return "REPOSITORY"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m course_utils.notebook.hosted VERSION", file=sys.stderr)
        return 2
    problem = check_release(args[0])
    if problem:
        print(f"setup: {problem}", file=sys.stderr)
        return 1
    missing = missing_requirements()
    if missing:  # --timeout: pip gives up on a stalled connection instead of waiting forever
        pip = [sys.executable, "-m", "pip", "install", "-q", "--timeout", "60", "--"]
        subprocess.run(pip + missing, check=True, timeout=900)
    return 0


if __name__ == "__main__":
    sys.exit(main())
