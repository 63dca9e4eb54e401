"""Keep a one-machine job on the loopback interface, where no other machine can reach it.

``torch.distributed`` trusts whoever reaches its ports: a ``TCPStore`` has no authentication, and
torchrun's elastic agent unpickles the rendezvous state it reads from its store (pickle runs
code). Given a host name, the store's server listens on every interface anyway (torch 2.13:
``TCPStore("127.0.0.1", ...)`` binds ``::``, all of them); the name only says where clients
connect. What does bind to loopback only:

* a ``TCPStore`` given ``master_listen_fd=``, a socket this process bound to ``127.0.0.1``
  (``loopback_store``);
* gloo's and NCCL's own sockets, with ``GLOO_SOCKET_IFNAME`` / ``NCCL_SOCKET_IFNAME`` naming the
  loopback interface (``loopback_environment``);
* no socket at all: a ``FileStore`` (torchrun's c10d rendezvous with ``store_type=file``), which
  ``launch`` uses for its agent.

``host_rank_store_on_loopback`` runs in rank 0 of a ``launch`` before its process group starts:
it hosts the group's store itself, on loopback, with ``multi_tenant=True``, so that
``init_process_group`` (``env://``: the same port, also multi-tenant) reuses that server instead
of opening one on every interface, whether ``launch`` or the rank's own function starts the group.

What torch offers no way to confine: torchrun's own rendezvous store (``--standalone``,
``--rdzv-backend c10d`` over TCP) and the store rank 0 hosts under torchrun. Run those only where
the network is trusted (a cluster's private network, a host firewall, a container's own network).

Taught in chapter 00 (what ``launch`` listens on) and chapter 08 (what ``torch.distributed`` trusts).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

__all__ = [
    "LOOPBACK",
    "loopback_interface",
    "loopback_environment",
    "loopback_socket",
    "loopback_store",
    "host_rank_store_on_loopback",
]

LOOPBACK = "127.0.0.1"
_HELD: list = []  # the store rank 0 hosts lives as long as the rank


def loopback_interface() -> str | None:
    """The loopback interface's name: ``lo`` on Linux, ``lo0`` on macOS; None if there is none."""
    names = [name for _, name in socket.if_nameindex()]
    return next((n for n in ("lo", "lo0") if n in names), None)


def loopback_environment() -> dict[str, str]:
    """``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` naming the loopback interface, for
    ranks that all run on this machine; variables already set here are left as they are."""
    name = loopback_interface()
    if name is None:
        return {}
    return {k: os.environ.get(k, name) for k in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")}


def loopback_socket(port: int = 0) -> socket.socket:
    """A TCP socket listening on ``127.0.0.1:port`` (``port=0``: one the OS picks)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((LOOPBACK, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def loopback_store(port: int = 0, *, multi_tenant: bool = False, timeout: float = 300.0):
    """A ``TCPStore`` server that listens on ``127.0.0.1`` only (its port: ``store.port``)."""
    import torch.distributed as dist

    sock = loopback_socket(port)
    bound = sock.getsockname()[1]
    return dist.TCPStore(
        LOOPBACK,
        bound,
        is_master=True,
        wait_for_workers=False,
        multi_tenant=multi_tenant,
        timeout=timedelta(seconds=timeout),
        master_listen_fd=sock.detach(),
    )


def host_rank_store_on_loopback() -> None:
    """In a rank that ``launch`` started, before any process group: point gloo and NCCL at the
    loopback interface and, in rank 0, host the default group's store on loopback (see the module's
    docstring). Does nothing to the store when the ranks share the agent's store or meet elsewhere
    than on this machine's loopback address."""
    for name, value in loopback_environment().items():
        os.environ.setdefault(name, value)
    if os.environ.get("RANK") != "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        return
    if os.environ.get("MASTER_ADDR") not in (LOOPBACK, "localhost") or "MASTER_PORT" not in os.environ:
        return
    _HELD.append(loopback_store(int(os.environ["MASTER_PORT"]), multi_tenant=True))
