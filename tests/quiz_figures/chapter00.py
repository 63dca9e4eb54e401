"""Sources of the numbers in quiz/chapter00-answers.md (see tests/test_quiz_figures.py)."""


def _gloo_default_timeout_minutes() -> float:
    import torch.distributed.constants as constants

    return constants.default_pg_timeout.total_seconds() / 60


FIGURES = {
    6: {
        "30": Computed(_gloo_default_timeout_minutes),
        "10": Exempt(
            "NCCL's default timeout, torch.distributed.constants.default_pg_nccl_timeout: 10 minutes "
            "in a build with NCCL, None in the CPU build the tests run on"
        ),
    },
    # all_reduce sums 1 + 2 + 3 + 4 on every rank, then four tens (a closed form: the demo needs ranks)
    7: {"40": Computed(lambda: 4 * sum(rank + 1.0 for rank in range(4)))},
}
