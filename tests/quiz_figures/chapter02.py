"""Sources of the numbers in quiz 02's answers (see tests/test_quiz_figures.py)."""

MiB = 2**20
RANKS = "all_to_all needs ranks: test_collectives.py::test_all_to_all_transposes_the_pieces_as_quiz_02_says"


def _ring_share(numel, world_size):
    """Bytes each rank sends in the ring all-reduce, as a multiple of the tensor (float32)."""
    from course_utils.collectives import bytes_sent_per_rank

    return bytes_sent_per_rank(numel, 4, world_size) / (4 * numel)


def _nvlink():
    """The chapter's 8xH100 node's network (the modeled cluster's nvlink preset)."""
    from course_utils.runtime.cluster import NETWORKS

    return NETWORKS["nvlink"]


def _all_reduce_us(nbytes):
    """An all-reduce of ``nbytes`` on the 8xH100 node's 8 ranks as the cluster times it (whole ns), in us."""
    from course_utils.runtime.cluster import collective_seconds

    net = _nvlink()
    return round(collective_seconds("all_reduce", nbytes, 8, net.latency_s, net.bandwidth_Bps) * 1e9) / 1e3


def _bandwidth(kind):
    """Question 3: a 64 MiB all-reduce in 0.1 s on 4 ranks, in GB/s."""
    from course_utils.collectives import bandwidth

    if kind == "bus":
        return bandwidth.bus_bandwidth(64 * MiB, 0.1, 4) / 1e9
    return bandwidth.algorithm_bandwidth(64 * MiB, 0.1) / 1e9


def _latency_bound() -> bool:
    """Question 6: on the chapter's node, latency is over 99% of a 1 KB all-reduce's time."""
    from course_utils.collectives import bandwidth

    node = bandwidth.AlphaBeta(alpha=_nvlink().latency_s, beta=_nvlink().bandwidth_Bps, world_size=8)
    return node.latency_share(1 << 10) > 0.99


def _gloo_serves_more_ranks_than_gpus() -> bool:
    """Question 8: on a machine with 2 GPUs (and NCCL), 4 ranks get gloo; NCCL refuses them."""
    from unittest import mock

    from course_utils.runtime import hardware

    with mock.patch.object(hardware, "gpu_count", lambda: 2):
        with mock.patch.object(hardware.dist, "is_nccl_available", lambda: True):
            try:
                hardware.pick_backend(4, "nccl")
            except ValueError as e:
                refused = "needs one GPU per rank" in str(e)
            else:
                refused = False
            return refused and hardware.pick_backend(4) == "gloo" and hardware.pick_backend(2) == "nccl"


def _nccl_waits_on_the_stream() -> bool:
    """Question 5: torch's own docstring of Work.wait (the one a learner reads with help())."""
    import torch.distributed  # noqa: F401 -- registers torch._C._distributed_c10d

    doc = " ".join(torch._C._distributed_c10d.Work.wait.__doc__.split())
    return "calling wait() is the same as calling synchronize()" in doc and (
        "Letting the current stream block on the completion of the NCCL work" in doc
    )


FIGURES = {
    # the collective starts at the last rank's arrival and lasts the modeled 100 us (a closed form:
    # the modeled cluster's group needs ranks)
    1: {"350": Computed(lambda: max(100, 250) + 100)},
    2: {
        "96": Computed(lambda: _ring_share((64 * MiB) // 4, 4) * 64),  # MB of a 64 MB tensor
        "16": Computed(lambda: 64 / 4),
        "0.75": Computed(lambda: 3 / 4),  # (w - 1) / w for 4 ranks
        "1.5": Computed(lambda: _ring_share(16 << 20, 4)),
    },
    3: {
        "1.0": Computed(lambda: _bandwidth("bus")),
        "0.67": Computed(lambda: _bandwidth("algorithm")),
        "67.1": Computed(lambda: 64 * MiB / 1e6),
        "1.5": Computed(lambda: _ring_share(16 << 20, 4)),
    },
    4: {"21": Exempt(RANKS), "31": Exempt(RANKS)},
    6: {
        "450": Computed(lambda: _nvlink().bandwidth_Bps / 1e9),
        "14": Computed(lambda: 2 * (8 - 1)),  # the ring's steps on 8 ranks
        "70": Computed(lambda: 2 * (8 - 1) * _nvlink().latency_s * 1e6),  # us of latency
        # appendix 02b's modeled sweep, 8xH100 node (the chapter's own outputs no longer hold it)
        "70.002": Computed(lambda: _all_reduce_us(512)),
        "70.008": Computed(lambda: _all_reduce_us(2 << 10)),
        "32": Computed(lambda: 1024 / 4 / 8),  # float32 values in one step's chunk of 1 KB
        "512": Exempt("a message size: the smallest of appendix 02b's sweep, not a measured figure"),
    },
}

CLAIMS = {
    5: (
        Claim(
            "letting the current stream block on the completion of the NCCL work", _nccl_waits_on_the_stream
        ),
    ),
    6: (Claim("Latency: the `2 (w - 1) * alpha` term", _latency_bound),),
    8: (Claim("`gloo`", _gloo_serves_more_ranks_than_gpus),),
}
