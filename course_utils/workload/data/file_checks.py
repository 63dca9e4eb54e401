"""One line, not a traceback, for a data file the loaders cannot use; for every reader of data.

    check_parquet_file(path)          a parquet file, or a ValueError saying what it is instead:
                                      a Criteo TSV (plain or gzipped) gets the from-criteo command
    check_same_tables(train, test)    the two files' tables have the same sizes, or a ValueError

The parquet loaders (``parquet_info``, ``open_parquet``, so ``read_parquet`` and
``ParquetBatches``) and ``python -m course_utils.workload.data info`` call the first; a job
that takes a training and a test file calls both before it builds anything.

Not taught in a chapter: the data layer's input checks.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["check_parquet_file", "check_same_tables", "from_criteo_command"]


def from_criteo_command(path: str | Path) -> str:
    """The shell command that converts Criteo file ``path`` next to it."""
    path = Path(path)
    stem = path.name[: -len(".gz")] if path.name.endswith(".gz") else path.name
    out = path.with_name(f"{Path(stem).stem}.parquet")
    return f"python -m course_utils.workload.data from-criteo {path} --out {out}"


def check_parquet_file(path: str | Path) -> Path:
    """``path`` as a Path if it is a parquet file; else a one-line error saying what it is.

    Missing: FileNotFoundError. A directory, an empty file, Criteo's text format (run
    from-criteo, with the command), any other file: ValueError."""
    from course_utils.workload.data.criteo_read import sniff

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such parquet file; write one with write_parquet or from-criteo.")
    if path.is_dir():
        raise ValueError(f"{path.name} is a directory; give one parquet file (write_parquet or from-criteo).")
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(4)
        f.seek(max(size - 4, 0))
        tail = f.read(4)
    if head == b"PAR1" and tail == b"PAR1":
        return path
    if size == 0:
        raise ValueError(f"{path.name} is empty, not a parquet file.")
    if head == b"PAR1":
        raise ValueError(
            f"{path.name} is a parquet file cut short (no footer): written by a job that stopped?"
        )
    kind, sample = sniff(path)
    first_line = sample.split(b"\n", 1)[0]
    if kind in ("gzip", "plain") and first_line.count(b"\t") >= 10:
        what = "gzipped Criteo text" if kind == "gzip" else "Criteo text (tab-separated)"
        raise ValueError(f"{path.name} is {what}, not parquet: convert it first: {from_criteo_command(path)}")
    what = "gzipped" if kind == "gzip" else "not parquet" if kind == "plain" else kind
    raise ValueError(f"{path.name} is {what}: the loaders read parquet (write_parquet or from-criteo).")


def check_same_tables(train: str | Path, test: str | Path) -> tuple:
    """The table sizes both files' metadata give, if they are equal; else a ValueError naming
    both (a model built for the training file's tables cannot look up the test file's ids)."""
    from course_utils.workload.data.parquet import parquet_info

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
                f"{len(c)} x {c[0]:,}"
                if len(set(c)) == 1
                else f"{len(c)} tables of {min(c):,} to {max(c):,} rows"
            )

        raise ValueError(
            f"{Path(test).name} was written for other tables ({sizes(test_cards)} rows) than "
            f"{Path(train).name} ({sizes(train_cards)}): convert both with the same --buckets "
            "(from-criteo TEST --like TRAIN)."
        )
    return tuple(train_cards)
