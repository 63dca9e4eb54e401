"""Click-log data: synthetic Criteo-shaped logs, parquet shards, and the real Criteo format.

    from course_utils.workload import data
    logs = data.make_click_logs(100_000, seed=0)   # ClickLogs: dense, sparse, label, prob
    train, test = logs.split(0.8)
    print(test.bayes_auc())                       # the best AUC any model can reach
    for batch in train.batches(1024, shuffle=True, seed=0): ...

The loaders the training loop iterates (``loaders.py``; ``ParquetBatches`` streams parquet row
groups, ``stream.py``) need torch: they are imported on first use, so that ``python -m
course_utils.workload.data`` and code that only makes data stay light.

Real Criteo files are converted to the same parquet by ``python -m course_utils.workload.data
from-criteo`` (``from_criteo``, ``criteo_convert.py``).

Taught in chapters 01 (synthetic logs, Criteo files converted) and 04 (parquet partitions, streaming).
"""

from course_utils.workload.data.criteo import (
    CRITEO_1TB_CARDINALITIES,
    CRITEO_1TB_ROWS,
    CRITEO_1TB_ROWS_PER_DAY,
    CRITEO_1TB_TRAIN_ROWS,
    CRITEO_KAGGLE_CARDINALITIES,
    read_criteo_tsv,
)
from course_utils.workload.data.criteo_convert import BadLineError, ConversionReport, from_criteo
from course_utils.workload.data.criteo_write import write_criteo_tsv
from course_utils.workload.data.file_checks import check_parquet_file
from course_utils.workload.data.logs import Batch, ClickLogs, batches, dense_columns, sparse_columns
from course_utils.workload.data.parquet import (
    check_same_tables,
    parquet_info,
    read_parquet,
    repartition,
    row_groups_of_rank,
    write_parquet,
    write_row_groups,
)
from course_utils.workload.data.synthetic import (
    BLOCK_ROWS,
    PlantedClickModel,
    criteo_cardinalities,
    make_click_logs,
)


def bayes_auc(logs: ClickLogs) -> float:
    """AUC of the true click probability against the labels (see ClickLogs.bayes_auc)."""
    return logs.bayes_auc()


__all__ = [
    "ClickLogs",
    "Batch",
    "batches",
    "make_click_logs",
    "PlantedClickModel",
    "criteo_cardinalities",
    "bayes_auc",
    "write_parquet",
    "write_row_groups",
    "read_parquet",
    "repartition",
    "row_groups_of_rank",
    "parquet_info",
    "read_criteo_tsv",
    "write_criteo_tsv",
    "from_criteo",
    "ConversionReport",
    "BadLineError",
    "check_parquet_file",
    "check_same_tables",
    "dense_columns",
    "sparse_columns",
    "BLOCK_ROWS",
    "CRITEO_KAGGLE_CARDINALITIES",
    "CRITEO_1TB_CARDINALITIES",
    "CRITEO_1TB_ROWS",
    "CRITEO_1TB_ROWS_PER_DAY",
    "CRITEO_1TB_TRAIN_ROWS",
]

_LOADERS = (
    "InMemoryBatches",
    "SampledBatches",
    "ParquetBatches",
    "GlobalBatches",
    "MapBatches",
    "rank_loader",
    "sampler_indices",
)
__all__ += list(_LOADERS)


def __getattr__(name: str):
    if name in _LOADERS:
        from course_utils.workload.data import loaders

        return getattr(loaders, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
