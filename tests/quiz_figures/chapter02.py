"""Sources of the numbers in quiz 02's answer explanations (see tests/test_quiz_figures.py)."""


def _ring_share(numel, world_size):
    """Bytes each rank sends in the ring all-reduce, as a multiple of the tensor (float32)."""
    from course_utils.collectives import bytes_sent_per_rank

    return bytes_sent_per_rank(numel, 4, world_size) / (4 * numel)


def _nvlink():
    """The chapter's 8xH100 node's network (the modeled cluster's nvlink preset)."""
    from course_utils.runtime.cluster import NETWORKS

    return NETWORKS["nvlink"]


FIGURES = {
    2: {
        "16": Computed(lambda: 64 / 4),
        "0.75": Computed(lambda: 3 / 4),  # (w - 1) / w for 4 ranks
        "1.5": Computed(lambda: _ring_share(16 << 20, 4)),
    },
    3: {
        "67.1": Computed(lambda: 64 * 2**20 / 1e6),
        "1.5": Computed(lambda: _ring_share(16 << 20, 4)),
    },
    6: {
        "450": Computed(lambda: _nvlink().bandwidth_Bps / 1e9),
        "14": Computed(lambda: 2 * (8 - 1)),  # the ring's steps on 8 ranks
        "70": Computed(lambda: 2 * (8 - 1) * _nvlink().latency_s * 1e6),  # us of latency
        "70.002": InChapter("512 B"),  # the chapter's modeled sweep, 8xH100 node
        "70.008": InChapter("2 KiB"),
        "32": Computed(lambda: 1024 / 4 / 8),  # float32 values in one step's chunk of 1 KB
        "512": InChapter("512 B"),  # the sweep's smallest size
    },
}
