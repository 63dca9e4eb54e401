"""Sources of the numbers in quiz 02's answer explanations (see tests/test_quiz_figures.py)."""


def _ring_share(numel, world_size):
    """Bytes each rank sends in the ring all-reduce, as a multiple of the tensor (float32)."""
    from course_utils.collectives import bytes_sent_per_rank

    return bytes_sent_per_rank(numel, 4, world_size) / (4 * numel)


FIGURES = {
    2: {
        "16": Computed(lambda: 64 / 4),
        "1.5": Computed(lambda: _ring_share(16 << 20, 4)),
    },
    3: {
        "1.5": Computed(lambda: _ring_share(16 << 20, 4)),
    },
    6: {
        "20": InChapter("gloo's alpha, the fixed cost of one step, lies between 20 us"),
    },
}
