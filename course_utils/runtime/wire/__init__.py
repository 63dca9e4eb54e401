"""A modeled interconnect under the real collectives: gloo moves the bytes, the wire sets the time.

* ``Wire``, ``PRESETS``, ``preset``, ``collective_seconds``: the alpha-beta model (``model``);
* ``WireGroup``: the process group that applies it (``group``);
* ``time_scale``: this machine against a GPU, measured once (``calibrate``);
* ``install(wire)`` / ``backend_from_env(default)``: how a rank starts its group on a wire.
  ``launch(fn, wire=...)`` does it for you; a torchrun script calls
  ``dist.init_process_group(backend_from_env("gloo"))`` and runs under ``COURSE_WIRE``.

It is off unless asked for, and results are bit-identical with and without it: only time changes.

Taught in chapter 02 (the wire, its model and its presets) and chapter 04 (DDP under a wire).
"""

from __future__ import annotations

import os

from course_utils.runtime.wire.model import PRESETS, Wire, collective_seconds, preset

__all__ = ["Wire", "PRESETS", "preset", "collective_seconds", "install", "backend_from_env", "ENV"]

ENV = "COURSE_WIRE"  #: the environment variable that carries a Wire (as JSON) to the ranks
BACKEND = "wire"


def _create(options, backend_options=None):
    """``register_backend``'s creator (extended API): one ``WireGroup`` per process group."""
    from course_utils.runtime.wire.group import WireGroup

    text = os.environ.get(ENV)
    if not text:
        raise RuntimeError(
            f"a process group with backend 'wire' needs {ENV} (a Wire as JSON): call "
            "course_utils.runtime.wire.install(wire) first, or launch(fn, wire=...)"
        )
    ranks = list(options.global_ranks_in_group) or list(range(options.group_size))
    return WireGroup(
        options.store, options.group_rank, options.group_size, options.timeout, Wire.from_json(text), ranks
    )


def install(wire: Wire) -> str:
    """Make ``wire`` the network of the process groups this process starts; returns "wire".

    Pass the result to ``dist.init_process_group``. CPU tensors only: on GPUs, NCCL's own
    network is the real thing.
    """
    import torch.distributed as dist

    if not isinstance(wire, Wire):
        raise TypeError(f"install needs a course_utils.Wire, got {type(wire).__name__}")
    os.environ[ENV] = wire.to_json()
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create, extended_api=True, devices=["cpu"])
    return BACKEND


def backend_from_env(default: str) -> str:
    """``"wire"`` (installed) when ``COURSE_WIRE`` holds a Wire, else ``default``."""
    text = os.environ.get(ENV)
    return install(Wire.from_json(text)) if text else default
