"""Where the numbers in chapter 03's worked solutions come from (see tests/test_solutions.py).

Every number in the solutions' markdown is in the exercise's own text, an integer below 10, or a
bound the exercise's cell asserts (CPU time, which other programs cannot raise).
"""

FIGURES: dict = {
    1: {},
    2: {},
    3: {
        "60": Exempt("a bound the cell asserts: the one-row share of the CPU time on 8 rows, in %"),  # noqa: F821
        "30": Exempt("a bound the cell asserts: the one-row share of the CPU time on 2048 rows, in %"),  # noqa: F821
        "1.6": Exempt("a bound the cell asserts: the cores two threads keep busy on 8 rows"),  # noqa: F821
    },
    4: {},
    5: {},
}
