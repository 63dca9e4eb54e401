"""The course installed as a wheel (``pip install git+...`` on Colab is not editable): no path may
assume a checkout.

``test_the_course_runs_from_its_wheel`` builds the wheel from a clean copy of this checkout,
installs it into a fresh venv that borrows this venv's packages (torch, jupyter) through a ``.pth``
file but not its editable install, and from a folder outside the checkout runs with that venv's
python: the quiz, ``show_source``, ``launch``, ``run_torchrun`` and chapter 00 as a notebook.
``test_solutions_run_from_a_temporary_directory`` runs worked solution 08 there under nbval.
Select or skip them with ``-m wheel`` / ``-m "not wheel"`` (about a minute each).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import zipfile
from pathlib import Path
from typing import NamedTuple

import pytest

pytestmark = [pytest.mark.chapter(), pytest.mark.launches]

ROOT = Path(__file__).resolve().parents[1]
QUIZ_FILES = sorted(p.name for p in (ROOT / "quiz").glob("*.md"))


def _pyproject() -> dict:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover
        tomllib = pytest.importorskip("tomli")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_pyproject_lists_every_package():
    """The packages are listed by hand (for course_utils.quiz_files): a new one must be added."""
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "course_utils").rglob("__init__.py")}
    setuptools = _pyproject()["tool"]["setuptools"]
    assert set(setuptools["packages"]) == found | {"course_utils.quiz_files", "course_utils.templates"}
    assert setuptools["package-dir"] == {
        "course_utils.quiz_files": "quiz",
        "course_utils.templates": "templates",
    }


def _clean_copy(destination: Path) -> Path:
    """The checkout without build leftovers (a stale build/ could put files in the wheel that the
    configuration no longer ships), as ``pip install git+...`` would see it."""

    def skip(folder, names):
        top = Path(folder) == ROOT
        return [
            n
            for n in names
            if n in {".git", "__pycache__", ".pytest_cache", ".ruff_cache"}
            or n.endswith(".egg-info")
            or (top and (n in {"build", "dist", "data"} or n.startswith(".venv")))
        ]

    return Path(shutil.copytree(ROOT, destination, ignore=skip))


def _run(cmd, cwd, timeout, env=None) -> subprocess.CompletedProcess:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    shown = " ".join(map(str, cmd))[:300]
    assert done.returncode == 0, f"{shown} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
    return done


# Run by the wheel venv's python, from a folder outside the checkout; prints one JSON line.
CHECKS = textwrap.dedent(
    """
    import contextlib, io, json, sys
    import torch.distributed as dist
    import course_utils
    from course_utils import launch, quiz, show_source
    from course_utils.runtime import runner, slurm_local

    result = quiz.check(4, "ABCDABCD", show=False)
    asked = io.StringIO()
    with contextlib.redirect_stdout(asked):
        quiz.ask(4)
    try:
        quiz.check(99, "ABCDABCD")
        unknown = ""
    except ValueError as err:
        unknown = str(err)
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        show_source(quiz.chapter_number)

    def rank_and_world():
        return dist.get_rank(), dist.get_world_size()

    torchrun = runner.run_torchrun(nproc_per_node=2, timeout=120)
    print(json.dumps({
        "executable": sys.executable,
        "course_utils": course_utils.__file__,
        "quiz_folder": str(quiz.folder()),
        "score": result.score,
        "total": result.total,
        "asked": asked.getvalue(),
        "unknown": unknown,
        "shown": shown.getvalue(),
        "launched": launch(rank_and_world, world_size=2, timeout=60),
        "torchrun": [(r["rank"], r["world_size"], r["all_reduce"]) for r in torchrun.reports],
        "sbatch": str(slurm_local.sbatch_template()),
        "sbatch_starts": slurm_local.sbatch_template().read_text().splitlines()[0],
    }))
    """
)

WHICH_PYTHON = "import sys, course_utils\nprint(sys.executable)\nprint(course_utils.__file__)"


class WheelVenv(NamedTuple):
    """A venv with the course's wheel installed (and this venv's torch & co. borrowed), and the
    environment to run its python with: its bin first on PATH, no PYTHONPATH."""

    wheel: Path
    venv: Path
    python: Path
    env: dict


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory) -> WheelVenv:
    tmp_path = tmp_path_factory.mktemp("wheel")
    wheels = tmp_path / "wheels"
    _run(
        # with build isolation: pip brings pyproject's build requirements (setuptools>=64), as a
        # learner's `pip install git+...` does; this venv's own setuptools may be older (65 has
        # no bdist_wheel without the wheel package)
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels)]
        + [str(_clean_copy(tmp_path / "src"))],
        tmp_path,
        300,
    )
    (wheel,) = wheels.glob("*.whl")

    # a venv without the editable install: this venv's site-packages by a .pth file, for torch & co.
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], tmp_path, 120)
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(_run([python, "-c", purelib], tmp_path, 60).stdout.strip())
    borrowed = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))
    (site / "borrowed_packages.pth").write_text("".join(f"{p}\n" for p in borrowed))
    _run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site), str(wheel)],
        tmp_path,
        120,
    )
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "COURSE_QUIZ_DIR"}}
    env["PATH"] = os.pathsep.join([str(venv / "bin"), env.get("PATH", "")])
    return WheelVenv(wheel, venv, python, env)


@pytest.mark.wheel
def test_the_course_runs_from_its_wheel(wheel_venv, tmp_path):
    wheel, venv, python, env = wheel_venv
    shipped = sorted(
        Path(n).name for n in zipfile.ZipFile(wheel).namelist() if n.startswith("course_utils/quiz_files/")
    )
    assert shipped == QUIZ_FILES != [], "the wheel must carry quiz/*.md as package data"

    work = tmp_path / "work"  # outside the checkout, with nothing of the course in it
    work.mkdir()
    found = json.loads(_run([python, "-c", CHECKS], work, 240, env).stdout.strip().splitlines()[-1])

    assert Path(found["executable"]).parent == venv / "bin"
    assert Path(found["course_utils"]).is_relative_to(venv), "the editable install leaked in"
    assert Path(found["quiz_folder"]).is_relative_to(venv)
    assert Path(found["sbatch"]).is_relative_to(venv) and found["sbatch_starts"] == "#!/bin/bash"
    assert found["total"] == 8 and 0 <= found["score"] <= 8
    assert found["asked"].startswith("Quiz: Chapter 4 - ") and "quiz.check(4," in found["asked"]
    assert "no quiz for chapter 99; quizzes exist for chapters 0, 1, 2" in found["unknown"]
    assert found["shown"].startswith("# course_utils/notebook/quiz.py  chapter_number\ndef chapter_number(")
    assert found["launched"] == [[0, 2], [1, 2]]
    assert [(r, w) for r, w, _ in found["torchrun"]] == [(0, 2), (1, 2)]
    assert all(s == [3.0 * i for i in range(1, 9)] for _, _, s in found["torchrun"])

    # chapter 00 as a notebook, with the venv's python as its kernel; a last cell says which python.
    # (`python -m jupyter nbconvert` would run the jupyter-nbconvert found on PATH, another python's)
    notebook = json.loads((ROOT / "chapters" / "00_setup.ipynb").read_text())
    notebook["cells"].append(
        {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": WHICH_PYTHON}
    )
    (work / "chapter00.ipynb").write_text(json.dumps(notebook))
    _run(
        [python, "-m", "nbconvert", "--to", "notebook", "--execute"]
        + ["--ExecutePreprocessor.timeout=600", "--output-dir", str(tmp_path / "out"), "chapter00.ipynb"],
        work,
        300,
        env,
    )
    executed = json.loads((tmp_path / "out" / "chapter00.ipynb").read_text())
    code = [c for c in executed["cells"] if c["cell_type"] == "code"]
    assert code[0]["outputs"] == [], "the setup cell must find course_utils and do nothing"
    executable, course_utils_file = "".join(code[-1]["outputs"][0]["text"]).split()
    assert Path(executable).parent == venv / "bin" and Path(course_utils_file).is_relative_to(venv)
    assert sorted(p.name for p in work.iterdir()) == ["chapter00.ipynb"]  # no clone of the course


# The worked solution that starts torchrun jobs (`python -m course_utils.scripts...` in new
# processes, whose PYTHONPATH the runner derives from where course_utils lives), reads a template
# and writes files of its own: it must not reach for the checkout (a ../benchmarks script, a path
# into chapters/). The others start ranks only through `launch`, which CHECKS runs from the wheel.
SOLUTIONS_FROM_THE_WHEEL = ["chapter08.ipynb"]


@pytest.mark.wheel
def test_solutions_run_from_a_temporary_directory(wheel_venv, tmp_path):
    """Solution 08 under nbval, its stored outputs compared, run by the wheel venv's python
    from a folder that holds only the notebooks and the sanitizer: what a learner who installed
    the course with pip and downloaded a solution gets. A last cell in each asserts that its
    kernel is that venv's python and imported the wheel's course_utils."""
    _, venv, python, env = wheel_venv
    work = tmp_path / "work"
    work.mkdir()
    whose = (
        "import sys, course_utils\n"
        f"assert sys.executable.startswith({str(venv)!r}), sys.executable\n"
        f"assert course_utils.__file__.startswith({str(venv)!r}), course_utils.__file__"
    )
    for name in SOLUTIONS_FROM_THE_WHEEL:
        notebook = json.loads((ROOT / "solutions" / name).read_text())
        notebook["cells"].append(
            {"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": whose}
        )
        (work / name).write_text(json.dumps(notebook))
    shutil.copy(ROOT / "tests" / "sanitize.cfg", work / "sanitize.cfg")
    nbval = [python, "-m", "pytest", "--nbval", "-q", "-p", "no:cacheprovider", "--rootdir", str(work)]
    nbval += ["--nbval-sanitize-with", "sanitize.cfg", "--nbval-cell-timeout=300", *SOLUTIONS_FROM_THE_WHEEL]
    done = _run(nbval, work, 900, env)
    assert " passed" in done.stdout and "failed" not in done.stdout, done.stdout[-2000:]
    assert sorted(p.name for p in work.iterdir() if p.suffix == ".ipynb") == SOLUTIONS_FROM_THE_WHEEL
