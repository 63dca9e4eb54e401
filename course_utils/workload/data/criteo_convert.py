"""Criteo day files -> the course's parquet, streamed, in bounded memory, with every bad line counted.

    python -m course_utils.workload.data from-criteo day_0.gz day_1.gz --out train.parquet
    python -m course_utils.workload.data from-criteo day_23.gz --out test.parquet --like train.parquet

    report = from_criteo(["day_0.gz"], "train.parquet")   # the same, from Python
    print(report)                                          # lines, rows, bad lines by kind

Each file is read block by block (``criteo_read.CriteoReader``, pyarrow's streaming CSV reader on
a thread of its own), checked and preprocessed (``criteo_parse.parse_block``: DLRM's transforms,
ids hashed into ``buckets`` rows per table), and appended to ``OUT`` in row groups of
``ROWS_PER_GROUP`` rows (``criteo_groups.RowGroupWriter``). Memory holds a few blocks and two
row groups, whatever the input's size. ``OUT`` is written under a temporary name and renamed at
the end, so an interrupted or refused conversion leaves no half file.

Bad lines (``criteo_parse.BAD_KINDS``) are skipped and counted by kind, with the file and line
of the first of each kind; ``strict=True`` refuses the input at the first one instead.

The file's metadata holds the table sizes (what the loaders and ``train_hybrid`` build the model
from) and the preprocessing; a test file must be converted with the same ``buckets``
(``like=TRAIN``) so that its ids index the same tables.

Taught in chapter 01 (real files, converted).
"""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from course_utils.workload.data.criteo_groups import RowGroupWriter
from course_utils.workload.data.criteo_parse import BAD_KIND_TEXT, BAD_KINDS, N_SPARSE, parse_block
from course_utils.workload.data.criteo_read import CriteoReader, estimate_lines
from course_utils.workload.data.criteo_report import (
    BadLineError,
    ConversionReport,
    default_buckets,
    describe_bad_row,
    describe_fields,
)

__all__ = ["from_criteo", "convert", "ConversionReport", "BadLineError", "default_buckets", "PREPROCESSING"]

#: What the converted file's metadata says about how it was made (with the buckets added).
PREPROCESSING = {
    "source": "Criteo TSV: label, I1..I13, C1..C26",
    "label": "0/1 -> float32",
    "dense": "missing -> 0, negative -> 0, log1p -> float32 (facebookresearch/dlrm data_utils.py)",
    "sparse": "missing -> 0, int(hex, 16) % buckets -> int32 (dlrm --max-ind-range, torchrec hashes)",
}


def _blocks(reader: CriteoReader, depth: int = 2):
    """The reader's blocks, read ahead on a thread of its own (pyarrow parses without the GIL).
    The thread ends with the generator, however it ends: a bad line refused, Ctrl-C, an error."""
    blocks: queue.Queue = queue.Queue(maxsize=depth)
    done, stop = object(), threading.Event()

    def hand_over(item) -> bool:
        while not stop.is_set():
            try:
                blocks.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for batch in reader:
                if not hand_over(batch):
                    return
            hand_over(done)
        except BaseException as exc:  # raised in the consumer
            hand_over(exc)

    thread = threading.Thread(target=produce, name=f"read {reader.path.name}", daemon=True)
    thread.start()
    try:
        while (item := blocks.get()) is not done:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        stop.set()
        thread.join()


def _schema(cardinalities: tuple, preprocessing: dict):
    import pyarrow as pa

    from course_utils.workload.data.parquet import _META_KEY, _PREPROCESSING_KEY

    fields = [pa.field("label", pa.float32()), pa.field("prob", pa.float32())]
    fields += [pa.field(f"I{j + 1}", pa.float32()) for j in range(13)]
    fields += [pa.field(f"C{t + 1}", pa.int32()) for t in range(N_SPARSE)]
    return pa.schema(fields).with_metadata(
        {_META_KEY: json.dumps(list(cardinalities)), _PREPROCESSING_KEY: json.dumps(preprocessing)}
    )


def _table(parsed, schema):
    import pyarrow as pa

    n = len(parsed.label)
    columns = [parsed.label, np.full(n, np.nan, np.float32)]
    columns += list(parsed.dense) + list(parsed.sparse)  # [13, n] and [26, n]: a row per column
    return pa.Table.from_arrays([pa.array(c) for c in columns], schema=schema)


def _table_sizes(sources: list[Path], buckets, like, max_rows, out: Path) -> tuple[tuple, str]:
    from course_utils.workload.data.parquet import parquet_info

    if like is not None:
        if buckets is not None:
            raise ValueError(
                "give either buckets or like (a converted file whose table sizes to copy), not both."
            )
        cards = parquet_info(like)["cardinalities"]
        if cards is None or len(cards) != N_SPARSE:
            raise ValueError(
                f"{Path(like).name} has no {N_SPARSE} table sizes in its metadata; convert it first."
            )
        return tuple(cards), f"as in {Path(like).name}"
    if buckets is None:
        lines = sum(estimate_lines(path) for path in sources)
        size, why = default_buckets(lines if max_rows is None else min(lines, max_rows))
        return (size,) * N_SPARSE, f"{why}; convert the test file with --buckets {size} or --like {out.name}"
    sizes = [int(buckets)] * N_SPARSE if np.isscalar(buckets) else [int(b) for b in buckets]
    if len(sizes) != N_SPARSE or not all(2 <= b < 2**31 for b in sizes):
        raise ValueError(
            f"buckets must be one whole number in [2, 2**31) or {N_SPARSE} of them, got {buckets!r}."
        )
    return tuple(sizes), "as asked"


def from_criteo(
    sources: str | Path | Sequence[str | Path],
    out: str | Path,
    *,
    buckets: int | Sequence[int] | None = None,
    like: str | Path | None = None,
    max_rows: int | None = None,
    strict: bool = False,
    rows_per_group: int | None = None,
    progress: bool = False,
) -> ConversionReport:
    """Convert Criteo TSV files (plain or gzipped), in order, into one parquet file ``out``.

    buckets: rows per table, one number or 26 (default: ``default_buckets`` of the input's
        estimated lines); like: a converted file whose table sizes to use instead (train's, for test).
    max_rows: stop after writing this many rows. strict: a bad line raises :class:`BadLineError`
        (nothing is written) instead of being skipped and counted.
    rows_per_group: rows per full row group (default ``criteo_groups.ROWS_PER_GROUP``).
    progress: show lines per second while it runs (a bar on a terminal, a line every 30 s in a log).
    Returns the :class:`ConversionReport`.
    """
    from course_utils.workload.data.criteo_groups import ROWS_PER_GROUP

    def open_sink(schema):
        return RowGroupWriter(out, schema, rows_per_group or ROWS_PER_GROUP)

    return convert(
        sources,
        open_sink,
        Path(out),
        buckets=buckets,
        like=like,
        max_rows=max_rows,
        strict=strict,
        progress=progress,
    )


def convert(
    sources, open_sink, out: Path, *, buckets=None, like=None, max_rows=None, strict=False, progress=False
) -> ConversionReport:
    """What :func:`from_criteo` does, into ``open_sink(schema)``: anything with ``append(table)``,
    ``close() -> note``, ``abort()`` and ``groups`` (``read_criteo_tsv`` collects in memory)."""
    from course_utils.workload.data.criteo_progress import ConvertProgress

    paths = [Path(sources)] if isinstance(sources, (str, Path)) else [Path(s) for s in sources]
    if not paths:
        raise ValueError("from_criteo needs at least one Criteo file.")
    if max_rows is not None and max_rows < 1:
        raise ValueError(f"max_rows must be at least 1, got {max_rows}.")
    readers = [CriteoReader(path) for path in paths]  # checks every file before writing anything
    cards, note = _table_sizes(paths, buckets, like, max_rows, out)
    schema = _schema(cards, {**PREPROCESSING, "buckets": list(cards), "files": [p.name for p in paths]})
    report = ConversionReport([p.name for p in paths], out, cards, note)
    sink, start, bucket_array = open_sink(schema), time.monotonic(), np.asarray(cards, np.uint64)
    bar = ConvertProgress(readers, enabled=progress)
    try:
        for reader in readers:
            if not _convert_file(reader, bucket_array, schema, sink, report, max_rows, strict, bar):
                break
        if report.rows == 0:
            kinds = ", ".join(f"{n:,} {kind}" for kind, n in report.bad.items() if n)
            raise ValueError(
                f"no good lines in {', '.join(report.sources)}: {report.lines:,} lines read, all bad "
                f"({kinds}; criteo_parse.BAD_KIND_TEXT says what each means); nothing written."
            )
        report.group_note = sink.close()
        report.row_groups = sink.groups
    except BaseException:
        sink.abort()
        raise
    finally:
        bar.close()
    report.seconds = time.monotonic() - start
    return report


def _convert_file(reader, buckets, schema, writer, report, max_rows, strict, bar) -> bool:
    """Convert one file into ``writer`` (anything with ``append(pyarrow.Table)``), counting into
    ``report``. False once ``max_rows`` is reached."""
    name, delivered, lines = reader.path.name, 0, 0  # rows handed over by the reader; lines judged

    def judge(events: list) -> None:
        """Bad lines ``(line, kind, what)``: refuse the first (strict) or remember each kind's first."""
        for line, kind, what in sorted(events):
            if strict:
                raise BadLineError(
                    f"{name} line {line:,}: {BAD_KIND_TEXT[kind]} ({what}). Refused at the first bad line "
                    "(strict); without --strict (strict=False), bad lines are skipped and counted."
                )
            report.first_bad.setdefault(kind, (name, line, what))

    for batch in _blocks(reader):
        parsed = parse_block(batch, buckets)
        n_rows, keep = batch.num_rows, len(parsed.label)
        room = None if max_rows is None else max_rows - report.rows
        last_block = room is not None and keep >= room
        if last_block:  # cut the block after the row that fills max_rows
            good_rows = np.setdiff1d(np.arange(n_rows), parsed.bad_rows, assume_unique=True)
            n_rows, keep = int(good_rows[room - 1]) + 1, room
        lines, events = reader.line_of(delivered + n_rows - 1), []
        kinds = parsed.bad_kinds[parsed.bad_rows < n_rows]
        for k, kind in enumerate(BAD_KINDS):
            count = int((kinds == k).sum())
            report.bad[kind] += count
            if count and (strict or kind not in report.first_bad):  # the block's first of this kind
                at = int(np.argmax(kinds == k))
                row, field_index = int(parsed.bad_rows[at]), int(parsed.bad_fields[at])
                events.append(
                    (reader.line_of(delivered + row), kind, describe_bad_row(batch, kind, row, field_index))
                )
        skipped = reader.take_skipped(lines + 1)  # after line_of: it forgets them
        events += [(line, "fields", describe_fields(n)) for line, n in skipped]
        report.bad["fields"] += len(skipped)
        judge(events)
        writer.append(_table(parsed, schema).slice(0, keep))
        report.rows += keep
        delivered += batch.num_rows
        bar.update(reader, report.lines + lines)
        if last_block:
            report.lines += lines
            return False
    skipped = reader.take_skipped()  # lines with the wrong number of fields after the last good one
    judge([(line, "fields", describe_fields(n)) for line, n in skipped])
    report.bad["fields"] += len(skipped)
    report.lines += max([lines] + [line for line, _ in skipped])
    return True
