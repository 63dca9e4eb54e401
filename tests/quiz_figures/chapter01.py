"""Sources of the numbers in quiz/chapter01-answers.md (see tests/test_quiz_figures.py).

``Computed`` and ``Claim`` are provided when tests/test_quiz_figures.py executes this file.
"""

from functools import cache

GiB = 2**30


@cache
def _mlperf(optimizer: str):
    """memory_report of the MLPerf DLRM on Criteo 1TB, as chapter 01 configures it."""
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig, memory_report

    tables, mlps = data.CRITEO_1TB_CARDINALITIES, dict(bottom_mlp=(512, 256), top_mlp=(1024, 1024, 512, 256))
    return memory_report(DLRMConfig(tables, embedding_dim=128, **mlps), optimizer)


def _share_in_embeddings() -> float:
    report = _mlperf("sgd")
    return 100 * report.loc["embeddings", "parameters"] / report.loc["total", "parameters"]


def _table(optimizer: str, column: str) -> float:
    """One table of 10,000,000 rows x 64 (question 3), in GB."""
    from course_utils.workload.models import DLRMConfig, memory_report

    report = memory_report(DLRMConfig((10_000_000,), embedding_dim=64), optimizer=optimizer)
    return report.loc["embeddings", column] / 1e9


def _rows_1tb() -> int:
    from course_utils.workload import data

    return data.CRITEO_1TB_ROWS


def _only_used_rows_get_a_gradient() -> bool:
    import torch

    bag = torch.nn.EmbeddingBag(1000, 4, mode="sum", sparse=True)
    bag(torch.tensor([[3], [7], [3]])).sum().backward()
    return bag.weight.grad.is_sparse and sorted(bag.weight.grad.coalesce().indices()[0].tolist()) == [3, 7]


FIGURES = {
    1: {
        "358": Computed(lambda: _mlperf("adam").loc["total", "training_total"] / GiB),
        "89.5": Computed(lambda: _mlperf("sgd").loc["total", "weights"] / GiB),
        "80": InChapter("fits in 80 GB?"),
    },
    2: {"99.99": Computed(_share_in_embeddings)},
    3: {
        "10.2": Computed(lambda: _table("adam", "training_total")),
        "10.24": Computed(lambda: _table("adam", "training_total")),
        "2.56": Computed(lambda: _table("adam", "weights")),
        "2.6": Computed(lambda: _table("adam", "weights")),  # B: the weights only
        "5.1": Computed(lambda: _table("sgd", "training_total")),  # C: no optimizer state
    },
    4: {
        "4.37": Computed(lambda: _rows_1tb() / 1e9),
        "4,373,472,329": Computed(_rows_1tb),
        "87,500": Computed(lambda: _rows_1tb() / 50_000, rel=0.001),
        "24.3": Computed(lambda: _rows_1tb() / 50_000 / 3600),
        "1.2": Computed(lambda: _rows_1tb() / 3600 / 1e6),
    },
}

CLAIMS = {
    1: (
        Claim(  # the chapter's largest GPU: 192 GB (B200, MI300X)
            "more than any single GPU of the chapter",
            lambda: _mlperf("adam").loc["total", "training_total"] > 192e9,
        ),
    ),
    2: (Claim("The embedding tables", lambda: _share_in_embeddings() > 99.9),),
    6: (Claim("Only the rows the batch used get a gradient", _only_used_rows_get_a_gradient),),
}
