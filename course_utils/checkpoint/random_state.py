"""Each rank's random state, saved and restored: CPU torch, every CUDA device, NumPy, Python.

Ranks draw different random numbers (dropout masks, negative samples, their own shuffles),
so each rank's generators are saved under a key of its own, ``rng/rank<R>``, and restored on
that rank only. Saving rank 0's state and setting it everywhere makes every rank draw rank
0's numbers after a resume. After a resize (another number of ranks) a rank without a saved
state has no past to continue: it is seeded afresh (``seed + rank``), and the run is a new
one from there on, as it is for data order.

The state travels as one pickled ``bytes`` value: DCP saves a non-tensor value with
``torch.save`` into the writing rank's file and gives it back unchanged.

Taught in chapter 08 (the production job's checkpoint).
"""

from __future__ import annotations

import pickle
import random

import numpy as np
import torch

__all__ = ["capture", "restore", "seed_all", "key_of"]


def key_of(rank: int) -> str:
    """The checkpoint key of rank ``rank``'s random state."""
    return f"rng/rank{rank}"


def capture() -> bytes:
    """This process's random state: torch's CPU generator, each CUDA device's (if any),
    NumPy's global one and Python's ``random``, pickled."""
    state = {
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
        "numpy": np.random.get_state(),
        "python": random.getstate(),
    }
    return pickle.dumps(state)


def restore(saved: bytes) -> None:
    """Set every generator :func:`capture` saved. A CUDA state saved on more devices than
    this process sees is refused (a resume on other hardware is a new random stream)."""
    state = pickle.loads(saved)
    torch.set_rng_state(state["torch"])
    if state["cuda"]:
        if len(state["cuda"]) != torch.cuda.device_count():
            raise RuntimeError(
                f"the checkpoint holds the random state of {len(state['cuda'])} CUDA devices, but this "
                f"process sees {torch.cuda.device_count()}; resume with the same devices visible per rank"
            )
        torch.cuda.set_rng_state_all(state["cuda"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def seed_all(seed: int) -> None:
    """Seed torch (CPU and CUDA), NumPy's global generator and Python's ``random`` with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
