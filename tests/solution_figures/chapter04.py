"""Sources of the numbers in solutions/chapter04.ipynb's prose (see tests/figure_sources.py)."""

FIGURES = {
    1: {"20": InChapter("largest weight difference after")},  # noqa: F821  section 4's 20 SGD steps
    2: {"7": Exempt("a section number of appendix 04a (section 7, Join)")},  # noqa: F821
    4: {"25": Exempt("torch DDP's default bucket_cap_mb, a documented constant")},  # noqa: F821
    5: {
        "30": InChapter("same lr"),  # noqa: F821  steps per epoch at w = 8 (section 12's table)
        "235": InChapter("same lr"),  # noqa: F821  steps per epoch on one rank
        "60": Computed(lambda: 2 * -(-60_000 // 2048)),  # noqa: F821  2 epochs at w = 8
        "470": Computed(lambda: 2 * -(-60_000 // 256)),  # noqa: F821  2 epochs on one rank
    },
}
