"""The test tiers and the chapter a test belongs to, for the dev loop (noxfile.py).

* Every test carries ``chapter(n, ...)`` markers: a notebook from its file name
  (``chapters/04_ddp.ipynb``, ``solutions/chapter04.ipynb``), a test file from ``CHAPTER_OF_FILE``.
  ``pytest --chapter 4`` keeps only chapter 4's tests (``nox -s chapter -- 04``).
* ``chapters/07a_torchrec.ipynb`` (``NEEDS_TORCHREC``) needs TorchRec, which is not a course
  dependency: where it does not import, its cells are skipped at collection, saying why, unless
  ``COURSE_REQUIRE_TORCHREC=1`` (``.ci/run``'s TorchRec part), where they run and fail.
* Tests that start processes (ranks, torchrun, a kernel, a venv) carry ``launches``: every test of
  a file in ``LAUNCH_FILES``, and any other test whose own code calls one of ``LAUNCHERS`` or
  carries the marker by hand (its own code: the test, its fixtures, the functions of its module
  it calls). ``pytest --unit`` keeps the rest, notebooks excluded
  (``nox -s unit``), and fails a test that starts a process anyway, naming it: mark it
  ``@pytest.mark.launches`` (or list its file) and the tier stays honest.

Not taught in a chapter: the maintainers' test loop (CONTRIBUTING.md, "The dev loop").
"""

from __future__ import annotations

import inspect
import multiprocessing.process
import os
import re
import subprocess
from pathlib import Path

import pytest

# Test files and the chapters whose code they test; () for course-wide checks (layout, quizzes,
# packaging, the output rule), which `--chapter` leaves out. tests/test_chapter_layout.py checks
# that every test file is listed.
CHAPTER_OF_FILE = {
    "test_launch.py": (0,),
    "test_launch_in_kernel.py": (0,),
    "test_hardware.py": (0,),
    "test_notebook_helpers.py": (0,),
    "test_checks.py": (0,),
    "test_data.py": (1,),
    "test_criteo.py": (1,),
    "test_criteo_job.py": (1, 8),
    "test_models.py": (1,),
    "test_metrics.py": (1,),
    "test_train.py": (1,),
    "test_collectives.py": (2,),
    "test_cluster_model.py": (2,),
    "test_cluster_ranks.py": (2, 4, 6),
    "test_gpu_report.py": (4,),
    "test_compat.py": (2, 7),
    "test_torchrun.py": (2, 8),
    "test_data_parallel.py": (3,),
    "test_gil.py": (3,),
    "test_ddp.py": (4,),
    "test_ddp_data.py": (4,),
    "test_ddp_practice.py": (4,),
    "test_ddp_options.py": (4,),
    "test_ddp_torchrun.py": (4,),
    "test_ddp_cluster.py": (4,),
    "test_loaders.py": (4,),
    "test_model_parallel.py": (5,),
    "test_tensor_parallel.py": (5,),
    "test_activation_memory.py": (5,),
    "test_fsdp.py": (5,),
    "test_pipeline_executor.py": (6,),
    "test_pipeline_from_torch.py": (6,),
    "test_pipeline_plain.py": (6,),
    "test_pipeline_recompute.py": (6,),
    "test_pipeline_schedules.py": (6,),
    "test_pipeline_simulate.py": (6,),
    "test_explorers.py": (2, 6, 7),
    "test_sharding.py": (7,),
    "test_hybrid.py": (7,),
    "test_sparse_optim.py": (7,),
    "test_torchrec.py": (7,),
    "test_checkpoint.py": (8,),
    "test_checkpoint_async.py": (8,),
    "test_modeled_io.py": (8,),
    "test_elastic.py": (8,),
    "test_train_hybrid.py": (8,),
    "test_nothing_left_behind.py": (0, 2, 8),
    "test_job_bad_input.py": (8,),
    "test_checkpoint_folders.py": (8,),
    "test_chaos.py": (8,),
    "test_private_torch_api.py": (),
    "test_imports.py": (),
    "test_packaging.py": (),
    "test_chapter_budget.py": (),
    "test_chapter_layout.py": (),
    "test_cross_references.py": (),
    "test_quiz.py": (),
    "test_quiz_balance.py": (),
    "test_chapter_length.py": (),
    "test_quiz_figures.py": (),
    "test_solutions.py": (),
    "test_stress_tool.py": (),
    "test_wheel.py": (),
    "test_site.py": (),  # the website (site/): built, served on loopback, read in Chromium
    # tests/gpu: run on GPU machines only (README, "GPUs")
    "test_chapters.py": (),
    "test_one_gpu.py": (),
    "test_two_gpus.py": (),
    "test_nccl_streams.py": (),
    "test_ddp_on_gpu.py": (),
    "test_data_parallel_gpus.py": (),
}

# Files whose tests start processes throughout (ranks, torchrun, kernels, venvs).
LAUNCH_FILES = {
    "test_cluster_ranks.py",
    "test_launch.py",
    "test_launch_in_kernel.py",
    "test_torchrun.py",
    "test_ddp_torchrun.py",
    "test_elastic.py",
    "test_train_hybrid.py",
    "test_nothing_left_behind.py",
    "test_chaos.py",
    "test_checkpoint_async.py",
    "test_pipeline_executor.py",
    "test_pipeline_plain.py",
    "test_torchrec.py",
    "test_wheel.py",
    "test_stress_tool.py",
    "test_gil.py",  # threads_vs_processes launches its ranks inside the package
    "test_gpu_report.py",  # build_report launches its ranks inside the package
}
# Calls in a test's own code that start processes.
LAUNCHERS = re.compile(
    r"\b(launch|run_torchrun|run_together|run_elastic|run_schedules?|mp\.spawn|spawn|Popen|"
    r"subprocess\.run|check_output|start_processes|srun)\s*\("
)
_NOTEBOOK_CHAPTER = re.compile(r"^(?:(\d\d)[a-z]?_\w+|chapter(\d\d))\.ipynb$")  # 07a_x: an appendix
# Notebooks that need TorchRec (not a course dependency), and the variable that makes it required.
NEEDS_TORCHREC = {"07a_torchrec.ipynb"}
REQUIRE_TORCHREC = "COURSE_REQUIRE_TORCHREC"


def torchrec_missing() -> str | None:
    """``None`` when torchrec imports here, else why not (one line)."""
    try:
        import torchrec  # noqa: F401
    except Exception as exc:  # ImportError, or OSError from an fbgemm_gpu built for another torch
        return f"{type(exc).__name__}: {str(exc)[:200]}"
    return None


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
        "markers", "chapter(n, ...): the chapters whose code the test checks (conftest.py)"
    )
    config.addinivalue_line(
        "markers", "launches: starts processes (ranks, torchrun, a kernel); not in --unit"
    )


def chapters_of(item) -> tuple[int, ...]:
    """The chapters of a collected test: its ``chapter`` markers."""
    return tuple(n for mark in item.iter_markers("chapter") for n in mark.args)


def _code_reached(item, depth: int = 2) -> str:
    """The source of a test function, of the fixtures it uses and of the functions of its own
    module that it calls (``depth`` calls deep): where a launch would be written."""
    module = getattr(item, "module", None)
    todo = [getattr(item, "function", None)]
    fixtures = getattr(item, "_fixtureinfo", None)
    for name in fixtures.names_closure if fixtures else ():
        for definition in fixtures.name2fixturedefs.get(name, ()):
            todo.append(definition.func)
    seen, sources = set(), []
    for _ in range(depth + 1):
        called = []
        for function in todo:
            if function is None or function in seen:
                continue
            seen.add(function)
            try:
                source = inspect.getsource(function)
            except (OSError, TypeError):
                continue
            sources.append(source)
            for name in re.findall(r"\b(\w+)\s*\(", source):
                found = getattr(module, name, None)
                if inspect.isfunction(found) and found.__module__ == getattr(module, "__name__", None):
                    called.append(found)
        todo = called
    return "\n".join(sources)


def _launches(item) -> bool:
    if item.get_closest_marker("launches") or Path(str(item.fspath)).name in LAUNCH_FILES:
        return True
    return bool(LAUNCHERS.search(_code_reached(item)))


def pytest_collection_modifyitems(config, items):
    for item in items:
        name = Path(str(item.fspath)).name
        found = _NOTEBOOK_CHAPTER.match(name)
        if found:
            item.add_marker(pytest.mark.chapter(int(found[1] or found[2])))
            item.add_marker(pytest.mark.launches)  # a kernel
        elif name in CHAPTER_OF_FILE and CHAPTER_OF_FILE[name]:
            item.add_marker(pytest.mark.chapter(*CHAPTER_OF_FILE[name]))
        if not found and _launches(item):
            item.add_marker(pytest.mark.launches)
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
            "mark it @pytest.mark.launches (or add its file to LAUNCH_FILES in conftest.py)"
        )

    monkeypatch.setattr(multiprocessing.process.BaseProcess, "start", refuse)
    monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
