"""What a conversion of Criteo files did: lines, rows, tables, and the bad lines by kind.

    print(from_criteo("day_0", "train.parquet"))
    day_0: 100,000 lines read, 99,995 rows written to train.parquet in 24 row groups
    tables: 26 x 4,096 rows (the default for about 99,720 lines: ...)
    bad lines skipped: 5
              1  bytes that are not UTF-8                      first: day_0 line 37 (not UTF-8)
              ...

Also the default table size (``default_buckets``) and the error a bad line raises in strict mode.

Taught in chapter 01 (real files, converted).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from course_utils.workload.data.criteo_parse import BAD_KIND_TEXT, BAD_KINDS, N_DENSE

__all__ = ["BadLineError", "ConversionReport", "default_buckets", "describe_bad_row", "describe_fields"]

_LINES_PER_BUCKET, _FEWEST_BUCKETS, _MOST_BUCKETS = 32, 1 << 10, 1 << 20


class BadLineError(ValueError):
    """A bad line met with ``strict=True``: its file, line and kind are in the message."""


def default_buckets(lines: int) -> tuple[int, str]:
    """``(buckets, why)``: rows per table for an input of about ``lines`` lines: one per
    32 lines, as a power of two, between 1,024 and 1,048,576."""
    wanted = max(lines // _LINES_PER_BUCKET, 1)
    below = 1 << (wanted.bit_length() - 1)  # the power of two nearest to wanted, in integers only:
    nearest = 2 * below if wanted * wanted >= 2 * below * below else below  # above sqrt(2) * below
    buckets = min(max(nearest, _FEWEST_BUCKETS), _MOST_BUCKETS)
    return buckets, (
        f"the default for about {lines:,} lines: one row per {_LINES_PER_BUCKET} lines, a power of two "
        f"from {_FEWEST_BUCKETS:,} to {_MOST_BUCKETS:,}"
    )


@dataclass
class ConversionReport:
    """What a conversion did. ``str(report)`` is the report (no timings: they go in ``seconds``).

    bad: lines skipped, by kind (``criteo_parse.BAD_KINDS``); first_bad: per kind, the first one's
    ``(file name, line number, what was wrong)``.
    """

    sources: list[str]
    out: Path
    cardinalities: tuple
    buckets_note: str
    lines: int = 0
    rows: int = 0
    row_groups: int = 0
    group_note: str = ""
    bad: dict = field(default_factory=lambda: dict.fromkeys(BAD_KINDS, 0))
    first_bad: dict = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def bad_lines(self) -> int:
        return sum(self.bad.values())

    def __str__(self) -> str:
        names = ", ".join(self.sources)
        text = [
            f"{names}: {self.lines:,} lines read, {self.rows:,} rows written to {self.out.name} "
            f"in {self.row_groups} row groups{self.group_note}",
            f"tables: {len(self.cardinalities)} x {self.cardinalities[0]:,} rows ({self.buckets_note})"
            if len(set(self.cardinalities)) == 1
            else f"tables: {', '.join(f'{c:,}' for c in self.cardinalities)} rows ({self.buckets_note})",
        ]
        if not self.bad_lines:
            return "\n".join([*text, "bad lines: none"])
        text.append(f"bad lines skipped: {self.bad_lines:,}")
        for kind in BAD_KINDS:
            if self.bad[kind]:
                name, line, what = self.first_bad[kind]
                text.append(
                    f"  {self.bad[kind]:>9,}  {BAD_KIND_TEXT[kind]:<45} first: {name} line {line:,} ({what})"
                )
        return "\n".join(text)


def describe_bad_row(batch, kind: str, row: int, field_index: int) -> str:
    """A few words on what was wrong with row ``row`` of a block (``batch``, as the reader gave it):
    the field (``label``, ``I3``, ``C26``) and its value, or "not UTF-8"."""
    if kind == "utf8":
        return "not UTF-8"
    value = batch.column(field_index)[row].as_py()
    shown = "" if value is None else value.decode("utf-8", "backslashreplace")
    shown = shown if len(shown) <= 20 else shown[:17] + "..."
    name = (
        "label"
        if field_index == 0
        else f"I{field_index}"
        if field_index <= N_DENSE
        else f"C{field_index - N_DENSE}"
    )
    return f"{name} {shown!r}"


def describe_fields(n: int) -> str:
    """How many fields a skipped line had, in words."""
    return "an empty line" if n == 0 else f"{n} field" if n == 1 else f"{n} fields"
