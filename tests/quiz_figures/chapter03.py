"""Where the numbers in quiz 03's answer explanations come from (see tests/test_quiz_figures.py)."""

FIGURES = {
    5: {"703": Exempt("the number of the Python Enhancement Proposal for free-threaded CPython")},  # noqa: F821
}
