"""A free TCP port for the ranks to meet at: the OS picks one.

Used by the launcher's runners (torchrun, the SLURM stand-in) and by ``init_group``.

Taught in chapter 02 (section 2: ``tcp://127.0.0.1:{free_port()}``).
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
