"""Each rank's random state, saved and restored: CPU torch, every CUDA device, NumPy, Python.

Ranks draw different random numbers (dropout masks, negative samples, their own shuffles),
so each rank's generators are saved under keys of its own, ``rng/rank<R>/...``, and restored on
that rank only. Saving rank 0's state and setting it everywhere makes every rank draw rank
0's numbers after a resume. After a resize (another number of ranks) a rank without a saved
state has no past to continue: it is seeded afresh (``seed + rank``), and the run is a new
one from there on, as it is for data order.

The states travel as tensors, not as a pickled object: DCP reads tensors with
``weights_only=True``, while a pickled value would be unpickled on load, and unpickling a
file someone else could write runs their code (``checkpoint.safe_load``). Each generator's
state is numbers already: torch's a ``uint8`` tensor, NumPy's Mersenne Twister 624 words, a
position and a cached Gaussian, Python's 625 words and its cached Gaussian.

Taught in chapter 08 (the production job's checkpoint).
"""

from __future__ import annotations

import math
import random

import numpy as np
import torch

__all__ = ["capture", "restore", "seed_all", "key_of"]


def key_of(rank: int) -> str:
    """The prefix of rank ``rank``'s random-state entries in a checkpoint (``rng/rank<R>/``)."""
    return f"rng/rank{rank}/"


def capture() -> dict[str, torch.Tensor]:
    """This process's random state as tensors: ``torch`` (CPU generator, ``uint8``), ``cuda``
    (``[devices, state]`` ``uint8``, only where CUDA is available), NumPy's global generator
    (``numpy_keys`` ``[624]``, ``numpy_pos_gauss`` ``[2]``, ``numpy_cached`` ``[1]``) and Python's
    ``random`` (``python`` ``[625]``, ``python_gauss`` ``[1]``, NaN when none is cached)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    if kind != "MT19937":
        raise ValueError(f"NumPy's global generator is {kind}, not MT19937; this module saves MT19937 only")
    version, words, gauss = random.getstate()
    state = {
        "torch": torch.get_rng_state(),
        "numpy_keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
        "numpy_pos_gauss": torch.tensor([pos, has_gauss], dtype=torch.int64),
        "numpy_cached": torch.tensor([cached], dtype=torch.float64),
        "python": torch.tensor(words, dtype=torch.int64),
        "python_gauss": torch.tensor([math.nan if gauss is None else gauss], dtype=torch.float64),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.stack(torch.cuda.get_rng_state_all())
    return state


def restore(state: dict[str, torch.Tensor]) -> None:
    """Set every generator :func:`capture` saved. A CUDA state saved on more devices than
    this process sees is refused (a resume on other hardware is a new random stream)."""
    torch.set_rng_state(state["torch"].to(torch.uint8))
    if "cuda" in state:
        devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if len(state["cuda"]) != devices:
            raise RuntimeError(
                f"the checkpoint holds the random state of {len(state['cuda'])} CUDA devices, but this "
                f"process sees {devices}; resume with the same devices visible per rank"
            )
        torch.cuda.set_rng_state_all(list(state["cuda"]))
    pos, has_gauss = (int(v) for v in state["numpy_pos_gauss"])
    keys = state["numpy_keys"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, pos, has_gauss, float(state["numpy_cached"][0])))
    gauss = float(state["python_gauss"][0])
    random.setstate(
        (random.Random.VERSION, tuple(int(w) for w in state["python"]), None if math.isnan(gauss) else gauss)
    )


def seed_all(seed: int) -> None:
    """Seed torch (CPU and CUDA), NumPy's global generator and Python's ``random`` with ``seed``."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
