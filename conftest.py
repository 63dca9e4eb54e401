"""The test tiers and the chapter a test belongs to, for the dev loop (noxfile.py).

* Each test file declares itself in one module-level line, ``pytestmark``:
  ``pytestmark = [pytest.mark.chapter(4), pytest.mark.launches]``. ``chapter(n, ...)`` names the
  chapters whose code it checks; ``chapter()``, with no number, says the file is course-wide
  (layout, quizzes, packaging), and ``--chapter`` leaves it out. A notebook takes its chapter from
  its file name (``chapters/04_ddp.ipynb``, ``04a_...``, ``solutions/chapter04.ipynb``).
  ``pytest --chapter 4`` keeps chapter 4's tests (``nox -s chapter -- 04``).
* ``launches``: the test starts processes (ranks, torchrun, a kernel, a venv); in the file's
  ``pytestmark`` when all its tests do, else ``@pytest.mark.launches`` on each test that does.
  Notebooks always launch (a kernel). ``pytest --unit`` keeps the rest (``nox -s unit``) and fails
  a test that starts a process anyway, naming it. tests/test_chapter_layout.py fails on a test
  file without a chapter declaration, and on a test file that imports another (shared helpers
  live in ``tests/helpers/`` and ``tests/conftest.py``).
* ``chapters/07a_torchrec.ipynb`` (``NEEDS_TORCHREC``) needs TorchRec, which is not a course
  dependency: where it does not import, its cells are skipped at collection, saying why, unless
  ``COURSE_REQUIRE_TORCHREC=1`` (``.ci/run``'s TorchRec part), where they run and fail.

Not taught in a chapter: the maintainers' test loop (CONTRIBUTING.md, "The dev loop").
"""

from __future__ import annotations

import multiprocessing.process
import os
import re
import subprocess
from pathlib import Path

import pytest

from course_utils.sharding.torchrec_dlrm import NEEDS_TORCHREC, torchrec_missing

_NOTEBOOK_CHAPTER = re.compile(r"^(?:(\d\d)[a-z]?_\w+|chapter(\d\d))\.ipynb$")  # 07a_x: an appendix
# Notebooks that need TorchRec (not a course dependency), and the variable that makes it required.
REQUIRE_TORCHREC = "COURSE_REQUIRE_TORCHREC"


def _skip_without_torchrec(items) -> None:
    """Mark the cells of ``NEEDS_TORCHREC`` notebooks skipped where torchrec does not import (and
    ``COURSE_REQUIRE_TORCHREC=1`` is not set: then they run, and fail saying what is missing)."""
    needing = [item for item in items if Path(str(item.fspath)).name in NEEDS_TORCHREC]
    if not needing or os.environ.get(REQUIRE_TORCHREC) == "1":
        return
    missing = torchrec_missing()
    if missing is None:
        return
    skip = pytest.mark.skip(
        reason=f"needs torchrec, not a course dependency ({missing}); appendix 07a runs in a TorchRec "
        f"environment (its section 1; .ci/run part 4), where {REQUIRE_TORCHREC}=1 makes this a failure"
    )
    for item in needing:
        item.add_marker(skip)


def pytest_addoption(parser):
    group = parser.getgroup("course", "the course's test tiers (noxfile.py)")
    group.addoption(
        "--chapter", type=int, action="append", help="keep only this chapter's tests (repeatable)"
    )
    group.addoption("--unit", action="store_true", help="keep only tests that start no process, no notebooks")


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "chapter(n, ...): the chapters whose code the test checks; chapter(): course-wide",
    )
    config.addinivalue_line(
        "markers", "launches: starts processes (ranks, torchrun, a kernel); not in --unit"
    )


def chapters_of(item) -> tuple[int, ...]:
    """The chapters of a collected test: its ``chapter`` markers."""
    return tuple(n for mark in item.iter_markers("chapter") for n in mark.args)


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = Path(str(item.fspath)).name
        found = _NOTEBOOK_CHAPTER.match(name)
        if found:
            item.add_marker(pytest.mark.chapter(int(found[1] or found[2])))
            item.add_marker(pytest.mark.launches)  # a kernel
    _skip_without_torchrec(items)
    wanted, unit = config.getoption("--chapter"), config.getoption("--unit")
    if not wanted and not unit:
        return
    keep, drop = [], []
    for item in items:
        ok = (not wanted or set(chapters_of(item)) & set(wanted)) and not (
            unit and item.get_closest_marker("launches")
        )
        (keep if ok else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


class ProcessStarted(RuntimeError):
    """A test in the unit tier started a process."""


@pytest.fixture(autouse=True)
def _unit_tier_starts_no_process(request, monkeypatch):
    """Under ``--unit``, starting a process fails the test with what to do about it."""
    if not request.config.getoption("--unit"):
        yield
        return

    def refuse(*args, **kwargs):
        raise ProcessStarted(
            f"{request.node.nodeid} started a process, but --unit runs only tests that start none: "
            "mark it @pytest.mark.launches (or add pytest.mark.launches to its file's pytestmark)"
        )

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
