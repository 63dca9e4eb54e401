"""Small helpers for the notebooks: where we run, and showing the package's code."""
from __future__ import annotations

import inspect
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


def show_source(obj) -> None:
    """Print the source of a function, class or module from course_utils.

    Notebooks call this instead of pasting a copy, so the text a learner reads
    is the code that runs.
    """
    print(inspect.getsource(obj).rstrip())
