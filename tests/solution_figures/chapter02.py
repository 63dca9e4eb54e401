"""Sources of the numbers in the worked solutions of chapter 02 (see tests/test_solutions.py)."""

FIGURES = {
    4: {
        "25": Exempt("DDP's default bucket size, bucket_cap_mb=25, a PyTorch default named in the chapter"),
    },
}
