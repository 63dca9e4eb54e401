"""Sources of the numbers in the worked solutions of chapter 02 (see tests/test_solutions.py).

The solutions time everything on the chapter's modeled 8xH100 node (alpha 5 us, beta 450 GB/s);
the figures here are the cluster's prices written out: whole nanoseconds per message and per
kernel, as the cluster counts them.
"""
# ruff: noqa: F821  (Computed, InChapter and Exempt are provided when this file is executed)


def _network():
    from course_utils.runtime.cluster import NETWORKS

    return NETWORKS["nvlink"]


def _all_reduce_ns(nbytes, ranks):
    """One all-reduce as the cluster times it: the ring's formula, rounded to whole ns."""
    from course_utils.runtime.cluster import collective_seconds

    net = _network()
    return round(collective_seconds("all_reduce", nbytes, ranks, net.latency_s, net.bandwidth_Bps) * 1e9)


def _busbw_8gib(ranks):
    """Bus bandwidth (GB/s) of the modeled 8 GiB all-reduce on ``ranks`` ranks."""
    n = 8 << 30
    return 2 * (ranks - 1) / ranks * n / (_all_reduce_ns(n, ranks) / 1e9) / 1e9


def _message_ns(nbytes):
    """One point-to-point message: alpha + n / beta, whole ns."""
    net = _network()
    return round((net.latency_s + nbytes / net.bandwidth_Bps) * 1e9)


def _kernel_ns(moved_bytes):
    """One element-wise kernel on the H100: its bytes at the achieved bandwidth, plus the launch."""
    from course_utils.runtime.cluster import DEVICES

    gpu = DEVICES["h100"]
    return round((moved_bytes / gpu.bytes_per_second + gpu.launch_s) * 1e9)


def _messages_ns(algorithm, nbytes):
    """The explorer's alpha-beta time of the algorithm's messages on 4 ranks, whole ns."""
    from course_utils.explorers.allreduce import allreduce_seconds

    net = _network()
    return round(allreduce_seconds(algorithm, nbytes, 4, net.latency_s, net.bandwidth_Bps) * 1e9)


def _modeled_ns(algorithm, nbytes):
    """Exercise 5's hand-written all-reduces on 4 ranks, until the last rank has the sum.

    tree: 4 messages of the whole tensor on its critical path (3 -> 1, 1 -> 0, 0 -> 1, 1 -> 3) and
    three additions (rank 1 once, rank 0 twice), each reading two tensors and writing one;
    ring: 6 steps of a quarter of the tensor, 3 additions and 3 copies (read one, write one).
    """
    if algorithm == "tree":
        return 4 * _message_ns(nbytes) + 3 * _kernel_ns(3 * nbytes)
    chunk = nbytes // 4
    return 6 * _message_ns(chunk) + 3 * _kernel_ns(3 * chunk) + 3 * _kernel_ns(2 * chunk)


KIB, MIB = 1 << 10, 16 << 20

FIGURES = {
    3: {
        "450": Computed(lambda: _network().bandwidth_Bps / 1e9),
        "10.002": Computed(lambda: _all_reduce_ns(1 << 10, 2) / 1e3),
        "30.003": Computed(lambda: _all_reduce_ns(1 << 10, 4) / 1e3),
        "70.004": Computed(lambda: _all_reduce_ns(1 << 10, 8) / 1e3),
        "449.764": Computed(lambda: _busbw_8gib(2)),
        "449.529": Computed(lambda: _busbw_8gib(4)),
        "449.059": Computed(lambda: _busbw_8gib(8)),
        "0.25": Exempt("the bound the cell asserts: every 8 GiB bus bandwidth above 0.9975 beta"),
    },
    4: {
        "7.004": Computed(lambda: 100 * _all_reduce_ns(10 << 10, 8) / 1e6),  # ms
        "94.5": Computed(lambda: 100 * _all_reduce_ns(10 << 10, 8) / _all_reduce_ns(1 << 20, 8)),
        "74.078": Computed(lambda: _all_reduce_ns(1 << 20, 8) / 1e3),  # us
        "14": Computed(lambda: 2 * (8 - 1)),  # the ring's steps on 8 ranks
        "70": Computed(lambda: 2 * (8 - 1) * _network().latency_s * 1e6),  # us of latency
        "128": Computed(lambda: (1 << 20) / 8 / 1024),  # KiB per step
        "450": Computed(lambda: _network().bandwidth_Bps / 1e9),
        "4.1": Computed(lambda: 2 * (8 - 1) / 8 * (1 << 20) / _network().bandwidth_Bps * 1e6),  # us
        "25": Exempt("DDP's default bucket size, bucket_cap_mb=25, a PyTorch default named in the chapter"),
    },
    5: {
        "32.011": Computed(lambda: _modeled_ns("tree", KIB) / 1e3),
        "54.006": Computed(lambda: _modeled_ns("ring", KIB) / 1e3),
        "133.401": Computed(lambda: _modeled_ns("ring", MIB) / 1e3),
        "237.472": Computed(lambda: _modeled_ns("tree", MIB) / 1e3),
        "12.002": Computed(lambda: (_modeled_ns("tree", KIB) - _messages_ns("tree", KIB)) / 1e3),
        "24.003": Computed(lambda: (_modeled_ns("ring", KIB) - _messages_ns("ring", KIB)) / 1e3),
        "68.341": Computed(lambda: (_modeled_ns("tree", MIB) - _messages_ns("tree", MIB)) / 1e3),
        "47.477": Computed(lambda: (_modeled_ns("ring", MIB) - _messages_ns("ring", MIB)) / 1e3),
    },
}
