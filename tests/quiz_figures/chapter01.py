"""Sources of the numbers in quiz/chapter01-answers.md (see tests/test_quiz_figures.py).

``Computed`` is provided when tests/test_quiz_figures.py executes this file.
"""

GiB = 2**30


def _mlperf(optimizer: str):
    """memory_report of the MLPerf DLRM on Criteo 1TB, as chapter 01 configures it."""
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig, memory_report

    tables, mlps = data.CRITEO_1TB_CARDINALITIES, dict(bottom_mlp=(512, 256), top_mlp=(1024, 1024, 512, 256))
    return memory_report(DLRMConfig(tables, embedding_dim=128, **mlps), optimizer)


def _share_in_embeddings() -> float:
    report = _mlperf("sgd")
    return 100 * report.loc["embeddings", "parameters"] / report.loc["total", "parameters"]


def _rows_1tb() -> int:
    from course_utils.workload import data

    return data.CRITEO_1TB_ROWS


FIGURES = {
    1: {
        "358": Computed(lambda: _mlperf("adam").loc["total", "training_total"] / GiB),
        "89.5": Computed(lambda: _mlperf("sgd").loc["total", "weights"] / GiB),
        "80": InChapter("fits in 80 GB?"),
    },
    2: {"99.99": Computed(_share_in_embeddings)},
    3: {
        "2.56": Computed(lambda: 10_000_000 * 64 * 4 / 1e9),  # the weights, in GB
        "10.24": Computed(lambda: 4 * 10_000_000 * 64 * 4 / 1e9),  # weights, gradients, two moments
    },
    4: {
        "4,373,472,329": Computed(_rows_1tb),
        "87,500": Computed(lambda: _rows_1tb() / 50_000, rel=0.001),
        "24.3": Computed(lambda: _rows_1tb() / 50_000 / 3600),
        "1.2": Computed(lambda: _rows_1tb() / 3600 / 1e6),
    },
}
