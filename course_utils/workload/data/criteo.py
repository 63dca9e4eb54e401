"""Facts about the real Criteo click logs, and a reader for their TSV format.

Nothing here downloads anything: point :func:`read_criteo_tsv` at a file you
already have (Kaggle's ``train.txt`` or a 1TB ``day_N`` file, decompressed).

The format: one row per line, tab-separated, 40 fields::

    label <TAB> I1 .. I13 <TAB> C1 .. C26

``label`` is 0/1, ``I1..I13`` integers (mostly counts, some negative), ``C1..C26``
32-bit hashes written as 8 hex characters; a missing value is an empty field.

Taught in chapter 01 (real Criteo files, read from a path you give).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from course_utils.workload.data.logs import ClickLogs, dense_columns, sparse_columns

__all__ = [
    "CRITEO_KAGGLE_CARDINALITIES",
    "CRITEO_1TB_CARDINALITIES",
    "CRITEO_KAGGLE_ROWS",
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
CRITEO_KAGGLE_ROWS = 45_840_617

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

_N_DENSE, _N_SPARSE = 13, 26
_FNV_OFFSET, _FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


def _hash_strings(values: np.ndarray) -> np.ndarray:
    """FNV-1a 64-bit hash of each string, vectorised: ``[N]`` object -> ``[N]`` uint64."""
    raw = values.astype(bytes)  # fixed-width 'S<k>', padded with zero bytes
    width = raw.dtype.itemsize
    codes = raw.view(np.uint8).reshape(len(raw), width)
    h = np.full(len(raw), _FNV_OFFSET, dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(width):
            h = (h ^ codes[:, j].astype(np.uint64)) * _FNV_PRIME
    return h


def read_criteo_tsv(
    path: str | Path, *, max_rows: int | None = None, buckets: int | Sequence[int] = 2**17
) -> ClickLogs:
    """Read a Criteo TSV file (label, 13 integers, 26 hex categoricals) into :class:`ClickLogs`.

    Dense: a missing integer becomes 0, a negative one 0 too, then ``log1p``
    (what the DLRM reference code does). Categorical: each string is hashed into
    ``buckets[t]`` rows of table ``t``; id 0 is reserved for "missing", so a
    present value gets ``1 + hash % (buckets[t] - 1)``. Equal strings get equal
    ids; different strings may collide (the price of a bounded table).

    buckets: one size for every column, or 26 sizes (each at least 2).
    max_rows: read only the first rows (the files hold tens of millions).
    Returns ClickLogs with ``dense [N, 13] float32``, ``sparse [N, 26] int64``,
    ``label [N] float32`` and ``prob`` all NaN (the true probability is unknown).
    """
    import pandas as pd

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"{path.name}: no such file. This course never downloads Criteo; "
            "get it from Criteo's site or Kaggle, decompress, and pass its path."
        )
    sizes = [int(buckets)] * _N_SPARSE if np.isscalar(buckets) else [int(b) for b in buckets]
    if len(sizes) != _N_SPARSE or min(sizes) < 2:
        raise ValueError(f"buckets must be one int >= 2 or {_N_SPARSE} of them, got {buckets!r}.")
    names = ["label", *dense_columns(_N_DENSE), *sparse_columns(_N_SPARSE)]
    not_criteo = (
        f"{path.name} does not look like Criteo TSV: expected {len(names)} tab-separated "
        "fields per line with a 0/1 label first"
    )
    with open(path, encoding="utf-8", errors="replace") as f:
        fields = f.readline().rstrip("\r\n").count("\t") + 1
    if fields != len(names):  # read_csv with names= would drop or pad the extra fields silently
        raise ValueError(f"{not_criteo}; its first line has {fields}.")
    try:
        df = pd.read_csv(
            path,
            sep="\t",
            header=None,
            names=names,
            nrows=max_rows,
            dtype={
                **{c: "float64" for c in names[: 1 + _N_DENSE]},
                **{c: "object" for c in names[1 + _N_DENSE :]},
            },
            keep_default_na=False,
            na_values={c: [""] for c in names[: 1 + _N_DENSE]},
            quoting=3,
            engine="c",
        )
    except (
        pd.errors.ParserError,
        ValueError,
    ) as exc:  # a later line with too many fields, or text in a number
        raise ValueError(f"{not_criteo} ({str(exc).strip()})") from None
    if df["label"].isna().any():
        raise ValueError(f"{not_criteo}.")
    counts = df[dense_columns(_N_DENSE)].to_numpy(np.float64)
    dense = np.log1p(np.clip(np.nan_to_num(counts, nan=0.0), 0.0, None)).astype(np.float32)
    sparse = np.empty((len(df), _N_SPARSE), dtype=np.int64)
    for t, col in enumerate(sparse_columns(_N_SPARSE)):
        values = df[col].fillna("").to_numpy(dtype=object)
        present = values != ""
        ids = np.zeros(len(values), dtype=np.uint64)
        if present.any():
            ids[present] = np.uint64(1) + _hash_strings(values[present]) % np.uint64(sizes[t] - 1)
        sparse[:, t] = ids.astype(np.int64)
    label = df["label"].to_numpy(np.float32)
    return ClickLogs(dense, sparse, label, np.full(len(df), np.nan, np.float32), tuple(sizes))
