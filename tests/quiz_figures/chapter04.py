"""Sources of the numbers in quiz 04's answer explanations (see tests/test_quiz_figures.py)."""

FIGURES = {
    8: {"0.04": Computed(lambda: 0.02 * 4**0.5)},  # noqa: F821  square-root scaling of 0.02 for 4 ranks
}
