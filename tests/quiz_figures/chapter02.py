"""Sources of the numbers in quiz 02's answer explanations (see tests/test_quiz_figures.py)."""


def _ring_share(numel, world_size):
    """Bytes each rank sends in the ring all-reduce, as a multiple of the tensor (float32)."""
    from course_utils.collectives import bytes_sent_per_rank

    return bytes_sent_per_rank(numel, 4, world_size) / (4 * numel)


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
        "20": InChapter("gloo's alpha, the fixed cost of one step, lies between 20 us"),
        "256": Computed(lambda: 1024 / 4),  # float32 values in 1 KB
    },
}
