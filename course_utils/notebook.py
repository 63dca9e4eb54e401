"""Small helpers for the notebooks: where we run, and showing the package's code.

Taught in chapter 00 (``environment``, ``show_source``).
"""
from __future__ import annotations

import inspect
import multiprocessing
import os
import sys


def environment() -> str:
    """Where this Python runs: ``"colab"``, ``"kaggle"``, ``"jupyter"`` or ``"script"``."""
    if "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG"):
        return "colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return "kaggle"
    if "ipykernel" in sys.modules:
        return "jupyter"
    return "script"


def in_kernel() -> bool:
    """Whether this is a notebook kernel's own process, the one that may display in the notebook.

    A rank forked from the kernel by ``launch`` inherits the kernel object but must
    not talk to the notebook, so it answers False.
    """
    ipython = sys.modules.get("IPython")  # imported in every notebook kernel
    kernel = ipython is not None and getattr(ipython.get_ipython(), "kernel", None) is not None
    return kernel and multiprocessing.parent_process() is None


def show_source(obj) -> None:
    """Print the source of a function, class or module from course_utils.

    Notebooks call this instead of pasting a copy, so the text a learner reads
    is the code that runs.
    """
    print(inspect.getsource(obj).rstrip())
