"""course_utils: the runnable code behind the course's notebooks.

Every technique the chapters teach lives here, small and readable, so a notebook
can show it (``show_source``) and the tests can check it against PyTorch.

The names most chapters use are importable from the top level::

    from course_utils import launch, devices, show_source, quiz, Cluster, modeled_time

The tree is layered; a package imports only its own layer and lower ones (CONTRIBUTING.md draws
the tree; ``lint-imports`` checks it, with the contracts in ``pyproject.toml``):

0. ``runtime``: starting ranks (``launch``, torchrun, SLURM stand-in), the machine, torch's
   private APIs (``compat``) and what differs between torch releases (``versions``);
1. ``notebook``: ``show_source`` / ``show_diff``, progress lines, quizzes, widgets;
2. ``workload``: the click-log data, the DLRM, its metrics, one training loop;
3. one package per topic, in chapter order (a chapter's package imports only earlier chapters'):
   ``collectives``, ``data_parallel``, ``ddp``, ``model_parallel``, ``pipeline``, ``sharding``,
   ``checkpoint``; each one's ``__init__`` is its public API;
4. ``explorers`` (interactive figures), ``exercises`` (the checkers of the "build it" exercises)
   and ``scripts`` (what ``python -m`` and torchrun start).

The top-level names are imported on first use, so a script that torchrun starts
as ``python -m course_utils.scripts.<name>`` pays only for what it uses.

Taught in chapter 00 (the top-level names: ``launch``, ``devices``, ``show_source`` ...).
"""

from __future__ import annotations

import importlib
import os
import re
import sys
from importlib import metadata

TORCH_FLOOR = (2, 9)  # the oldest torch the course is tested on (.ci/run); requirements.txt says the same


def torch_floor_note(version: str) -> str | None:
    """One line saying that torch ``version`` is older than ``TORCH_FLOOR``, or None if it is not."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found is None or tuple(map(int, found.groups())) >= TORCH_FLOOR:
        return None
    floor = ".".join(map(str, TORCH_FLOOR))
    return (
        f"course_utils: torch {version} is older than {floor}, the oldest release this course is "
        f"tested on; some cells may fail (install torch>={floor} in a fresh environment)."
    )


def _check_torch_version() -> None:
    try:
        note = torch_floor_note(metadata.version("torch"))
    except metadata.PackageNotFoundError:
        note = None
    if note:
        print(note, file=sys.stderr)


_check_torch_version()

# With this set, torch.cuda.is_available() counts GPUs through NVML instead of initialising
# CUDA, so a notebook that asks it can still fork ranks that use their GPU (see hardware.py).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

_HOME = {
    "launch": "runtime.launcher",
    "LaunchError": "runtime.launcher",
    "LaunchTimeoutError": "runtime.launcher",
    "RankFailedError": "runtime.launcher",
    "Wire": "runtime.cluster",
    "Cluster": "runtime.cluster",
    "modeled_time": "runtime.cluster",
    "devices": "runtime.hardware",
    "gpu_count": "runtime.hardware",
    "gpu_names": "runtime.hardware",
    "pick_backend": "runtime.hardware",
    "rank_device": "runtime.hardware",
    "environment": "notebook.show",
    "show_source": "notebook.show",
    "show_diff": "notebook.show",
    "varies": "notebook.marks",
    "quiz": "notebook",  # the module course_utils.notebook.quiz, as every chapter's last cell uses it
}
__all__ = list(_HOME)


def __getattr__(name):
    if name not in _HOME:
        raise AttributeError(f"module 'course_utils' has no attribute {name!r}")
    home = importlib.import_module(f".{_HOME[name]}", __name__)
    value = getattr(home, name, None)
    if value is None:  # a module of the package: course_utils.notebook.quiz
        value = importlib.import_module(f".{_HOME[name]}.{name}", __name__)
    globals()[name] = value  # later look-ups find it directly
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
