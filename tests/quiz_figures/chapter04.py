"""Sources of the numbers in quiz 04's answers (see tests/test_quiz_figures.py)."""


def _eval_shares():
    """Question 7: what DistributedSampler(shuffle=False) gives each of 4 ranks of a 10-row set."""
    from torch.utils.data import DistributedSampler

    return [list(DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False)) for r in range(4)]


def _repeats_the_first_rows() -> bool:
    read = [i for share in _eval_shares() for i in share]
    twice = sorted(i for i in set(read) if read.count(i) == 2)
    return [len(s) for s in _eval_shares()] == [3] * 4 and set(read) == set(range(10)) and twice == [0, 1]


def _same_order_without_set_epoch() -> bool:
    """Question 6: without set_epoch, epoch 1 visits epoch 0's (shuffled) order."""
    from course_utils.workload.data.loaders import sampler_indices

    unset, epoch_0 = sampler_indices(100, 0, 2, epoch=1, set_epoch=False), sampler_indices(100, 0, 2, epoch=0)
    return unset == epoch_0 != sampler_indices(100, 0, 2, epoch=1) and unset != sorted(unset)


FIGURES = {
    4: {  # the chapter's bucket-size sweep on two modeled T4s
        "16": InChapter("16 MiB buckets"),
        "1,175.5": InChapter("16 MiB buckets"),
        "256": InChapter("256 KiB buckets"),
        "620.9": InChapter("256 KiB buckets"),
        "726.0": InChapter("1 KiB buckets"),
        "27": InChapter("1 KiB buckets"),
    },
    7: {"12": Computed(lambda: sum(len(share) for share in _eval_shares()))},
    8: {
        "0.08": Computed(lambda: 0.02 * 4),  # linear scaling: 4 times the global batch
        "0.04": Computed(lambda: 0.02 * 4**0.5),  # square-root scaling of 0.02 for 4 ranks
    },
}

CLAIMS = {
    6: (Claim("Every epoch visits the rows in the same order", _same_order_without_set_epoch),),
    7: (Claim("every rank gets 3, 2 of them repeats of the first rows", _repeats_the_first_rows),),
}
