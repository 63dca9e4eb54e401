"""``launch``: run a function on N ranks from a notebook, on torchrun's own engine.

Taught in chapter 00 (``launch``) and appendix 00a (how it starts ranks, ``run_rank``);
chapter 02 puts it beside ``torchrun``.

    from course_utils import launch
    results = launch(fn, *args, world_size=2, timeout=60)    # fn(*args) on every rank, in rank order

Modules, in the order a launch uses them:

* ``api``: ``launch`` itself; it drives ``elastic_launch``, the engine behind ``torchrun``
  (as ``torch.distributed.launcher.api`` does for the command line);
* ``rank_entry``: ``run_rank``, what each rank runs first, inside the process the engine starts
  (signals, threads, device, process group, then the function; its result sent back on the CPU);
* ``output``: the notebook's side while the ranks run: the engine's logs kept quiet, standard
  streams and signal handlers lent and given back, each rank's output shown grouped by rank;
* ``errors``: ``LaunchError`` and its kinds, and how the rank to blame is found.
"""

from course_utils.runtime.launcher.api import launch
from course_utils.runtime.launcher.errors import LaunchError, LaunchTimeoutError, RankFailedError
from course_utils.runtime.launcher.rank_entry import run_rank

__all__ = ["launch", "run_rank", "LaunchError", "LaunchTimeoutError", "RankFailedError"]
