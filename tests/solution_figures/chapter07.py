"""Sources of the numbers written in solutions/chapter07.ipynb (see tests/figure_sources.py)."""


def _row_wise_embedding_growth():
    """Row-wise pooled-embedding bytes on 64 ranks over those on 8 (4,096 rows, 26 tables, dim 128)."""
    from course_utils import sharding

    def embeddings(w):
        return sharding.formula("row_wise", 4096, 26, 128, w, routed=[[4096 * 26 // w] * w] * w)["embeddings"]

    return embeddings(64) / embeddings(8)


FIGURES = {
    3: {"72": Computed(_row_wise_embedding_growth)},  # noqa: F821 (provided when the spec is executed)
}
