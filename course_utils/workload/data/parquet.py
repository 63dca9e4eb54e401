"""Click logs as parquet files whose row groups are the unit of sharding.

A rank reads whole row groups, never a slice of one, so the number of row
groups must be a multiple of the world size; :func:`repartition` rewrites a
file with another count. From a shell::

    python -m course_utils.workload.data repartition SRC DST ROW_GROUPS
    python -m course_utils.workload.data info FILE

A training file and its test file must index the same tables: :func:`check_same_tables`.

Taught in chapter 04 (row groups as partitions).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np

from course_utils.runtime.checks import check_whole
from course_utils.workload.data.file_checks import check_parquet_file
from course_utils.workload.data.logs import ClickLogs

__all__ = [
    "write_parquet",
    "write_row_groups",
    "read_parquet",
    "repartition",
    "row_groups_of_rank",
    "parquet_info",
    "open_parquet",
    "read_row_groups",
    "check_same_tables",
]

_META_KEY = b"course_utils.cardinalities"
_PREPROCESSING_KEY = b"course_utils.preprocessing"  # from-criteo's settings (criteo_convert.py)
PathLike = str | Path


def _check_row_groups(row_groups: int, n_rows: int) -> None:
    check_whole("row_groups", row_groups)
    if row_groups > max(n_rows, 1):
        raise ValueError(
            f"row_groups={row_groups} is more than the {n_rows} rows; every row group needs at least one row."
        )


def write_parquet(logs: ClickLogs, path: PathLike, row_groups: int) -> Path:
    """Write ``logs`` to ``path`` as exactly ``row_groups`` row groups of near-equal size
    (sizes differ by at most one row). Columns: ``label, prob, I1.., C1..``; the
    cardinalities travel in the file's metadata. Returns the path."""
    _check_row_groups(row_groups, len(logs))
    bounds = np.linspace(0, len(logs), row_groups + 1).round().astype(int)
    return write_row_groups((logs[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:], strict=False)), path)


def write_row_groups(parts: Iterable[ClickLogs], path: PathLike) -> Path:
    """Write each :class:`ClickLogs` of ``parts`` (same cardinalities) as one row group of ``path``,
    holding one part at a time: a file larger than memory can be written part by part."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    writer = None
    try:
        for part in parts:
            table = pa.Table.from_pandas(part.to_pandas(), preserve_index=False, nthreads=1)
            if writer is None:
                meta = dict(table.schema.metadata or {})
                meta[_META_KEY] = json.dumps(list(part.cardinalities)).encode()
                writer, cards = pq.ParquetWriter(path, table.schema.with_metadata(meta)), part.cardinalities
            if part.cardinalities != cards:
                raise ValueError(
                    f"write_row_groups: a part has cardinalities {part.cardinalities[:4]}..., "
                    f"the first had {cards[:4]}..."
                )
            writer.write_table(table, row_group_size=max(len(part), 1))
    finally:
        if writer is not None:
            writer.close()
    return path


def parquet_info(path: PathLike) -> dict:
    """Rows, row groups, rows per row group, the tables' cardinalities (None if the file was
    written by neither ``write_parquet`` nor ``from-criteo``) and, from ``from-criteo``, its
    preprocessing (else None) of a parquet file: its metadata only, no rows read. A file that is
    not parquet gets a one-line error (``check_parquet_file``)."""
    import pyarrow.parquet as pq

    pf = pq.ParquetFile(check_parquet_file(path))
    md, meta = pf.metadata, pf.schema_arrow.metadata or {}
    return {
        "rows": md.num_rows,
        "row_groups": md.num_row_groups,
        "rows_per_group": [md.row_group(i).num_rows for i in range(md.num_row_groups)],
        "cardinalities": tuple(json.loads(meta[_META_KEY])) if _META_KEY in meta else None,
        "preprocessing": json.loads(meta[_PREPROCESSING_KEY]) if _PREPROCESSING_KEY in meta else None,
    }


def row_groups_of_rank(n_row_groups: int, rank: int, world_size: int, path: PathLike = "FILE") -> list[int]:
    """Row groups that ``rank`` of ``world_size`` reads: ``rank, rank + world_size, ...``.

    Raises a ValueError with the exact repartition call when ``n_row_groups`` is
    not a multiple of ``world_size`` (ranks would get unequal work, and
    data-parallel ranks must take the same number of steps)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"need 0 <= rank < world_size, got rank={rank}, world_size={world_size}.")
    if n_row_groups % world_size:
        fixed = -(-n_row_groups // world_size) * world_size
        name = Path(path).name
        dst = f"{Path(name).stem}_{fixed}rg{Path(name).suffix}"
        raise ValueError(
            f"{name} has {n_row_groups} row groups, which is not a multiple of world_size={world_size}: "
            f"each rank must read the same number of whole row groups. Repartition it, e.g. to {fixed}:\n"
            f"    course_utils.workload.data.repartition({str(path)!r}, {str(Path(path).with_name(dst))!r}, "
            f"row_groups={fixed})\n"
            f"or from a shell:\n"
            f"    python -m course_utils.workload.data repartition {path} {Path(path).with_name(dst)} {fixed}"
        )
    return list(range(rank, n_row_groups, world_size))


def open_parquet(path: PathLike):
    """``(pyarrow.parquet.ParquetFile, cardinalities)`` of a file written by :func:`write_parquet`."""
    import pyarrow.parquet as pq

    path = check_parquet_file(path)
    pf = pq.ParquetFile(path)
    meta = pf.schema_arrow.metadata or {}
    if _META_KEY not in meta:
        raise ValueError(
            f"{path.name} was written by neither write_parquet nor from-criteo "
            "(no cardinalities in its metadata)."
        )
    return pf, tuple(json.loads(meta[_META_KEY]))


def read_row_groups(pf, groups: list[int], cardinalities) -> ClickLogs:
    """Row groups ``groups`` of an open parquet file, in that order, as :class:`ClickLogs`."""
    # One thread: a rank reads a small share, and ranks are often forked processes,
    # so Arrow's thread pool stays out of the way. Columns go straight to numpy.
    table = pf.read_row_groups(groups, use_threads=False)
    names = table.column_names
    dcols = [c for c in names if c.startswith("I") and c[1:].isdigit()]

    def column(name, dtype):  # writable: torch warns on tensors made from read-only arrays
        return np.require(table.column(name).to_numpy(), dtype, ["W"])

    dense = (
        np.stack([column(c, np.float32) for c in dcols], axis=1)
        if dcols
        else np.zeros((table.num_rows, 0), np.float32)
    )
    sparse = np.stack([column(f"C{t + 1}", np.int64) for t in range(len(cardinalities))], axis=1)
    return ClickLogs(dense, sparse, column("label", np.float32), column("prob", np.float32), cardinalities)


def read_parquet(path: PathLike, rank: int = 0, world_size: int = 1) -> ClickLogs:
    """Read the share of ``rank`` (its whole row groups, see :func:`row_groups_of_rank`).

    With the defaults, reads the whole file. Returns :class:`ClickLogs`.
    """
    path = Path(path)
    pf, cards = open_parquet(path)
    return read_row_groups(pf, row_groups_of_rank(pf.metadata.num_row_groups, rank, world_size, path), cards)


def repartition(src: PathLike, dst: PathLike, row_groups: int) -> Path:
    """Rewrite parquet ``src`` as ``dst`` with ``row_groups`` near-equal row groups (same rows, order)."""
    if Path(src).resolve() == Path(dst).resolve():
        raise ValueError("repartition: dst must differ from src (write a new file, then rename it).")
    return write_parquet(read_parquet(src), dst, row_groups)


def check_same_tables(train: str | Path, test: str | Path) -> tuple:
    """The table sizes both files' metadata give, if they are equal; else a ValueError naming
    both (a model built for the training file's tables cannot look up the test file's ids)."""
    cards = {name: parquet_info(name)["cardinalities"] for name in (train, test)}
    train_cards, test_cards = cards[train], cards[test]
    if None in (train_cards, test_cards):
        missing = Path(train if train_cards is None else test).name
        raise ValueError(
            f"{missing} has no table sizes in its metadata; write it with write_parquet or from-criteo."
        )
    if tuple(train_cards) != tuple(test_cards):

        def sizes(c) -> str:
            return (
                f"{len(c)} x {c[0]:,} rows"
                if len(set(c)) == 1
                else f"{len(c)} tables of {min(c):,} to {max(c):,} rows"
            )

        raise ValueError(
            f"{Path(test).name} was written for other tables ({sizes(test_cards)}) than "
            f"{Path(train).name} ({sizes(train_cards)}): convert both with the same --buckets "
            "(from-criteo TEST --like TRAIN)."
        )
    return tuple(train_cards)
