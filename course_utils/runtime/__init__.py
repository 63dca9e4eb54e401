"""The runtime layer: starting ranks and reading the machine, under every lesson.

* ``launcher``: ``launch`` (a function on ``world_size`` ranks, from a notebook) and its errors;
* ``runner`` (torchrun as a subprocess), ``elastic_run`` (an elastic job, ranks killed on
  purpose), ``slurm_local`` (SLURM's ``srun`` stood in for on one machine), ``ports``;
* ``process_tree`` (stopping a launcher and everything it started), ``loopback`` (keeping a
  one-machine job where no other machine can reach it);
* ``hardware`` (devices, backends), ``nvml`` (GPU memory without initialising CUDA);
* ``compat`` (every private torch API), ``versions`` (what differs between supported torch
  releases), ``checks`` (input checks), ``timing`` (wall time that waits for the device),
  ``examples`` (rank functions to launch).

Layer 0 of CONTRIBUTING.md's tree: nothing here imports a higher layer (``notebook``, ``workload``,
the topic packages); ``lint-imports`` checks it. Nothing is imported eagerly: a torchrun script pays only
for the modules it uses.

Taught in chapter 00 (launching ranks; the machine).
"""
