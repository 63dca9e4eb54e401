"""Sources of the numbers in solutions/chapter00.ipynb (see tests/test_solutions.py).

``Computed`` is provided when the test executes this file.
"""

FIGURES = {
    4: {"10": Computed(lambda: sum(rank + 1 for rank in range(4)))},  # the sum of 1..4 over 4 ranks
}
