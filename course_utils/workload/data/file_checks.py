"""One line, not a traceback, for a data file the loaders cannot use; for every reader of data.

    check_parquet_file(path)          a parquet file, or a ValueError saying what it is instead:
                                      a Criteo TSV (plain or gzipped) gets the from-criteo command

The parquet loaders (``parquet_info``, ``open_parquet``, so ``read_parquet`` and
``ParquetBatches``) and ``python -m course_utils.workload.data info`` call it; a job that takes
a training and a test file calls it, then ``parquet.check_same_tables``, before it builds anything.

Not taught in a chapter: the data layer's input checks.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["check_parquet_file", "from_criteo_command"]


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
