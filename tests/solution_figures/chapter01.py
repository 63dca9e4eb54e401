"""Sources of the numbers in solutions/chapter01.ipynb (see tests/test_solutions.py).

``Computed`` and ``Exempt`` are provided when the test executes this file.
"""

DEVICES, BUDGET = 4, 80e9


def _table_bytes(optimizer: str) -> list[int]:
    """Training bytes of each MLPerf DLRM table (D = 128), largest table first."""
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig, memory_report

    tables = sorted(data.CRITEO_1TB_CARDINALITIES, reverse=True)
    return [
        memory_report(DLRMConfig((rows,), embedding_dim=128), optimizer).loc["embeddings", "training_total"]
        for rows in tables
    ]


def _fullest_gb(optimizer: str) -> float:
    """GB on the fullest of 4 devices when whole tables go, largest first, onto the emptiest."""
    devices = [0] * DEVICES
    for size in _table_bytes(optimizer):
        devices[devices.index(min(devices))] += size
    return max(devices) / 1e9


def _even_gb(optimizer: str) -> float:
    return sum(_table_bytes(optimizer)) / DEVICES / 1e9


def _largest_tables_in_millions(k: int) -> float:
    from course_utils.workload import data

    return sorted(data.CRITEO_1TB_CARDINALITIES, reverse=True)[k] / 1e6


def _bytes_per_parameter(optimizer: str) -> float:
    """Training bytes per embedding parameter (weights, a dense gradient, the optimizer's state)."""
    from course_utils.workload.models import DLRMConfig, memory_report

    row = memory_report(DLRMConfig((1000,), embedding_dim=128), optimizer).loc["embeddings"]
    return row["training_total"] / row["parameters"]


FIGURES = {
    1: {
        "16": Computed(lambda: 64 / 4),
        "150,000": Exempt("the number of training rows this solution uses, to run in under a minute"),
    },
    2: {"100,000": Computed(lambda: 300_000 / 3)},
    3: {
        "65.7": Computed(lambda: _fullest_gb("sgd")),
        "98.6": Computed(lambda: _fullest_gb("adagrad")),
        "72.1": Computed(lambda: _even_gb("adagrad")),
        "131.4": Computed(lambda: _fullest_gb("adam")),
        "96.1": Computed(lambda: _even_gb("adam")),
        "40": Computed(lambda: _largest_tables_in_millions(3), rel=0.05),
        "25.6": Computed(lambda: _largest_tables_in_millions(4)),
        "12": Computed(lambda: _bytes_per_parameter("adagrad")),
    },
    4: {  # the stored (blanked) run
        "1.31": InChapter("machine      as it is: 1 thread"),  # noqa: F821
        "0.62": InChapter("machine one core busy: 1 thread"),  # noqa: F821
    },
    5: {"300,000": Exempt("the number of training rows this solution uses, to run in under a minute")},
}
