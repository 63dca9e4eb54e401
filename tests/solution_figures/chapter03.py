"""Where the numbers in chapter 03's worked solutions come from (see tests/test_solutions.py).

Every number in the solutions' markdown is either in the exercise's own text or an integer
below 10, so no exercise needs an entry.
"""

FIGURES: dict = {1: {}, 2: {}, 3: {}, 4: {}, 5: {}}
