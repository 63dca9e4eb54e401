"""course_utils: the runnable code behind the course's notebooks.

Every technique the chapters teach lives here, small and readable, so a notebook
can show it (``show_source``) and the tests can check it against PyTorch.

The names most chapters use are importable from the top level::

    from course_utils import launch, devices

Chapter-specific code lives in submodules (``course_utils.data``,
``course_utils.models``, ``course_utils.metrics``, ``course_utils.quiz`` ...).
"""
from .devices import devices, gpu_count, pick_backend
from .launcher import LaunchError, LaunchTimeoutError, RankFailedError, launch
from .notebook import environment, show_source

__all__ = ["launch", "devices", "gpu_count", "pick_backend", "LaunchError", "LaunchTimeoutError",
           "RankFailedError", "environment", "show_source"]
