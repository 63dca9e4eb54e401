"""``ddp_canonical``, run so that each rank ends without Python's interpreter shutdown.

    torchrun --nproc-per-node 2 --standalone -m course_utils.scripts.ddp_canonical_os_exit --out DIR

The same ``main`` as ``python -m course_utils.scripts.ddp_canonical``; once it has returned
(files written, process group destroyed), ``rank_exit.run_without_interpreter_shutdown`` flushes
the output and ends the process with ``os._exit(0)``. Why: on CPUs (gloo) a rank that has
finished can still be killed by SIGABRT while Python shuts down, when a gloo worker thread,
releasing the last collective's tensors, asks for the GIL after the interpreter began to exit
(pytorch/pytorch#190489). On GPUs (NCCL) the canonical script needs no wrapper.

Still needed on every supported torch: ``rank_exit``'s docstring gives the runs that show it
("terminate called without an active exception", SIGABRT, with a plain exit).

Taught in chapter 04 (section 8, the footnote to PyTorch's canonical DDP script).
"""

from course_utils.scripts import ddp_canonical
from course_utils.scripts.rank_exit import run_without_interpreter_shutdown

if __name__ == "__main__":
    run_without_interpreter_shutdown(ddp_canonical.main)
