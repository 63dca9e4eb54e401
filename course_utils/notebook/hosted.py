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

import subprocess
import sys
from importlib import metadata

__all__ = ["DISTRIBUTION", "missing_requirements", "install_extra", "check_release", "repository", "main"]

DISTRIBUTION = "distributed-recsys-course"


def missing_requirements(extra: str | None = None) -> list[str]:
    """The course's requirements (``pip`` specs; those of ``extra`` if given, else the core ones)
    that apply to this Python and whose package is not installed, torch excepted."""
    from packaging.requirements import Requirement  # matplotlib's dependency, so always there

    missing = []
    for spec in metadata.requires(DISTRIBUTION) or []:
        requirement = Requirement(spec)
        marker = requirement.marker
        if (marker is not None and "extra" in str(marker)) != (extra is not None):
            continue  # a core requirement when an extra's are wanted, or the other way round
        if marker is not None and not marker.evaluate({"extra": extra or ""}):
            continue  # another extra's, or not for this Python
        if requirement.name.lower() == "torch":
            continue
        try:
            metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            missing.append(spec.split(";")[0].strip())
    return missing


def _pip_install(specs: list[str]) -> None:
    # --timeout: pip gives up on a stalled connection instead of waiting forever
    pip = [sys.executable, "-m", "pip", "install", "-q", "--timeout", "60", "--"]
    subprocess.run(pip + specs, check=True, timeout=900)


def install_extra(extra: str) -> None:
    """Install what the course's optional ``extra`` needs and is missing (an appendix that needs
    more than the course, e.g. 08a's ``kubernetes``, calls this first); prints nothing when all is
    there. ``ValueError`` (one line) for an extra the course does not declare."""
    declared = metadata.metadata(DISTRIBUTION).get_all("Provides-Extra") or []
    if extra not in declared:
        raise ValueError(f"the course has no extra {extra!r}; it has {sorted(declared)}")
    missing = missing_requirements(extra)
    if missing:
        _pip_install(missing)


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
    if missing:
        _pip_install(missing)
    return 0


if __name__ == "__main__":
    sys.exit(main())
