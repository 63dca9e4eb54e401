"""Where the numbers in quiz 03's answers come from (see tests/test_quiz_figures.py)."""


def _same_total_bytes() -> bool:
    """Question 7: broadcast-and-reduce (DataParallel) and the ring (DDP) send the same total bytes."""
    from course_utils.data_parallel.traffic import SCHEMES, bytes_sent_per_step

    return len({sum(bytes_sent_per_step(4096, 4, scheme)) for scheme in SCHEMES}) == 1


FIGURES = {
    5: {"703": Exempt("the number of the Python Enhancement Proposal for free-threaded CPython")},
}

CLAIMS = {
    7: (Claim("send about the same total bytes per step", _same_total_bytes),),  # the question's premise
}
