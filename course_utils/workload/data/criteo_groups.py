"""Rows arriving block by block, written as parquet row groups whose count ranks can share.

A rank reads whole row groups (``parquet.row_groups_of_rank``), so the count must be a multiple
of the number of ranks; but a stream does not know how many rows are coming. So
:class:`RowGroupWriter` writes full row groups of ``rows_per_group`` rows as they fill, always
holding the last one back, and at :meth:`~RowGroupWriter.close` cuts what it held into as many
near-equal groups (1 to ``multiple``) as make the count a multiple of ``multiple``: 24 by
default, so that 1, 2, 3, 4, 6, 8, 12 or 24 ranks can share the file. Memory: at most two row
groups and a block.

The file is written as ``NAME.partial`` and renamed when complete; :meth:`~RowGroupWriter.abort`
removes it.

Taught in chapter 01 (real files, converted).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["RowGroupWriter", "ROWS_PER_GROUP", "ROW_GROUP_MULTIPLE"]

ROWS_PER_GROUP = 1 << 17  # about 35 MB in memory with Criteo's 40 columns
ROW_GROUP_MULTIPLE = 24


class RowGroupWriter:
    """Append ``pyarrow.Table`` s of one schema; ``close()`` finishes ``path`` (see the module).

    groups / rows: written so far; ``close()`` returns a note on the count ("" if it is a
    multiple of ``multiple``, else why not: fewer rows than groups needed).
    """

    def __init__(
        self,
        path: str | Path,
        schema,
        rows_per_group: int = ROWS_PER_GROUP,
        multiple: int = ROW_GROUP_MULTIPLE,
    ):
        import pyarrow.parquet as pq

        if rows_per_group < 1 or multiple < 1:
            raise ValueError(
                f"rows_per_group and multiple must be >= 1, got {rows_per_group} and {multiple}."
            )
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.partial = self.path.with_name(self.path.name + ".partial")
        self.rows_per_group, self.multiple = rows_per_group, multiple
        self._writer = pq.ParquetWriter(self.partial, schema, compression="snappy")
        self._held: list = []
        self.held_rows = self.groups = self.rows = 0

    def append(self, table) -> None:
        if len(table):
            self._held.append(table)
            self.held_rows += len(table)
        while self.held_rows >= 2 * self.rows_per_group:  # one full group always stays held
            self._write(self.rows_per_group)

    def _write(self, n: int) -> None:
        import pyarrow as pa

        held = pa.concat_tables(self._held) if len(self._held) > 1 else self._held[0]
        self._writer.write_table(held.slice(0, n), row_group_size=n)
        rest = held.slice(n)
        self._held = [rest] if len(rest) else []
        self.held_rows -= n
        self.groups += 1
        self.rows += n

    def close(self) -> str:
        """Write the held rows as the last groups, finish the file, rename it. Returns the note."""
        wanted = (-self.groups) % self.multiple or self.multiple
        last = min(wanted, self.held_rows)
        note = (
            ""
            if (self.groups + last) % self.multiple == 0
            else f" (not a multiple of {self.multiple}: too few rows; repartition for more ranks)"
        )
        sizes = np.diff(np.linspace(0, self.held_rows, last + 1).round().astype(int))
        for size in sizes:
            self._write(int(size))
        self._writer.close()
        self.partial.replace(self.path)
        return note

    def abort(self) -> None:
        """Stop and remove the partial file."""
        try:
            self._writer.close()
        finally:
            self.partial.unlink(missing_ok=True)
