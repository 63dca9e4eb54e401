"""Facts about the real Criteo click logs, and a reader for their TSV format.

Nothing here downloads anything: point :func:`read_criteo_tsv` (a small file, into memory) or
``python -m course_utils.workload.data from-criteo`` (any size, into parquet: ``criteo_convert``)
at a file you already have (Kaggle's ``train.txt``, a 1TB ``day_N`` or ``day_N.gz`` file).

The format: one row per line, tab-separated, 40 fields::

    label <TAB> I1 .. I13 <TAB> C1 .. C26

``label`` is 0/1, ``I1..I13`` integers (mostly counts, some negative), ``C1..C26``
32-bit hashes written as 8 hex characters; a missing value is an empty field.

Taught in chapter 01 (real Criteo files, converted from a path you give).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from course_utils.workload.data.logs import ClickLogs

__all__ = [
    "CRITEO_KAGGLE_CARDINALITIES",
    "CRITEO_1TB_CARDINALITIES",
    "CRITEO_1TB_ROWS",
    "CRITEO_1TB_ROWS_PER_DAY",
    "CRITEO_1TB_TRAIN_ROWS",
    "read_criteo_tsv",
]

#: Distinct ids per categorical column in Kaggle's Display Advertising Challenge
#: train set (7 days, 45,840,617 rows), as used by the DLRM reference code.
CRITEO_KAGGLE_CARDINALITIES = (
    1460,
    583,
    10131227,
    2202608,
    305,
    24,
    12517,
    633,
    3,
    93145,
    5683,
    8351593,
    3194,
    27,
    14992,
    5461306,
    10,
    5652,
    2173,
    4,
    7046547,
    18,
    15,
    286181,
    105,
    142572,
)

#: Table sizes of the MLPerf DLRM benchmark on the Criteo 1TB logs
#: (ids of each column hashed to at most 40 million).
CRITEO_1TB_CARDINALITIES = (
    39884406,
    39043,
    17289,
    7420,
    20263,
    3,
    7120,
    1543,
    63,
    38532951,
    2953546,
    403346,
    10,
    2208,
    11938,
    155,
    4,
    976,
    14,
    39979771,
    25641295,
    39664984,
    585935,
    12972,
    108,
    36,
)
#: Rows per day (day_0 .. day_23) of the Criteo 1TB click logs.
CRITEO_1TB_ROWS_PER_DAY = (
    195841983,
    199563535,
    196792019,
    181115208,
    152115810,
    172548507,
    204846845,
    200801003,
    193772492,
    198424372,
    185778055,
    153588700,
    169003364,
    194216520,
    194081279,
    187154596,
    177984934,
    163382602,
    142061091,
    156534237,
    193627464,
    192215183,
    189747893,
    178274637,
)
CRITEO_1TB_ROWS = sum(CRITEO_1TB_ROWS_PER_DAY)  # 4,373,472,329 rows in 24 days
CRITEO_1TB_TRAIN_ROWS = sum(CRITEO_1TB_ROWS_PER_DAY[:-1])  # 4,195,197,692: MLPerf's train split


class _InMemory:
    """A sink for ``criteo_convert.convert`` that keeps the tables (small files only)."""

    def __init__(self, schema):
        self.tables, self.groups = [], 1

    def append(self, table) -> None:
        self.tables.append(table)

    def close(self) -> str:
        return ""

    def abort(self) -> None:
        self.tables = []


def read_criteo_tsv(
    path: str | Path,
    *,
    max_rows: int | None = None,
    buckets: int | Sequence[int] | None = None,
    strict: bool = True,
) -> ClickLogs:
    """Read a small Criteo file (label, 13 integers, 26 hex categoricals; plain or gzipped) into
    :class:`ClickLogs`, in memory, with the converter's preprocessing (``criteo_parse``): dense
    ``log1p(max(x, 0))``, missing 0; categorical ``int(hex, 16) % buckets[t]``, missing 0.

    For files larger than memory, convert with ``from-criteo`` instead and read the parquet.
    buckets: one size for every column, or 26 (default: ``criteo_convert.default_buckets``).
    max_rows: only the first rows. strict: a bad line raises ``BadLineError`` naming its line
    (``strict=False``: skipped; ``from_criteo`` counts them in its report).
    Returns ClickLogs with ``dense [N, 13] float32``, ``sparse [N, 26] int64``,
    ``label [N] float32`` and ``prob`` all NaN (the true probability is unknown).
    """
    from course_utils.workload.data.criteo_convert import convert

    sinks = []

    def open_sink(schema):
        sinks.append(_InMemory(schema))
        return sinks[0]

    import pyarrow as pa

    report = convert(path, open_sink, Path(path), buckets=buckets, max_rows=max_rows, strict=strict)
    return ClickLogs.from_pandas(pa.concat_tables(sinks[0].tables).to_pandas(), report.cardinalities)
