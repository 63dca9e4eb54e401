"""A Criteo day file streamed in blocks of lines, plain or gzipped, with every line numbered.

    reader = CriteoReader("day_0.gz")          # refuses, in one line, what is not Criteo's format
    for batch in reader:                        # pyarrow RecordBatch: the 40 fields, binary, "" = null
        ...
    reader.line_of(row)                         # the file's line number of the row-th line delivered

The file is read by **pyarrow's streaming CSV reader** (``pyarrow.csv.open_csv``), one block of
``block_size`` bytes at a time: memory stays at a few blocks whatever the file's size. The reader
numbers lines itself only on one thread, so it runs on one (``use_threads=False``); the converter
does its own work on another. Three things the reader would otherwise get wrong are handled here:

* a line with the wrong number of fields is skipped and its line number kept (``skipped``);
* a line that is not valid UTF-8 is replaced, before the reader sees it, by a line whose label is
  ``NOT_UTF8_LABEL`` (pyarrow decodes a bad line's text as UTF-8 to report it, and would fail);
* an empty line, which the reader would turn into a row of empty fields (like a line of 39 tabs),
  is replaced by ``_EMPTY_LINE``, which it skips as a line of the wrong number of fields.

Taught in chapter 01 (real files, converted).
"""

from __future__ import annotations

import bisect
import gzip
import io
import threading
import zlib
from pathlib import Path

import numpy as np

from course_utils.workload.data.criteo_parse import N_FIELDS, NOT_UTF8_LABEL

__all__ = ["CriteoReader", "check_criteo_file", "sniff", "estimate_lines"]

BLOCK_BYTES = 1 << 20  # bigger blocks: the same speed, more memory (the reader reads ahead)
_SAMPLE_BYTES = 1 << 16
_OTHER_FORMATS = {
    b"PAR1": "a parquet file, not Criteo text: give it to the loaders (or --data) as it is",
    b"BZh": "bzip2-compressed: decompress it first (gzip is read as it is)",
    b"\xfd7zXZ\x00": "xz-compressed: decompress it first (gzip is read as it is)",
    b"\x28\xb5\x2f\xfd": "zstd-compressed: decompress it first (gzip is read as it is)",
    b"PK\x03\x04": "a zip archive: unzip it first (gzip is read as it is)",
}
_ANY = 1 << 62  # any field count, for bisecting (line, fields) pairs by line
_NOT_UTF8_LINE = NOT_UTF8_LABEL + b"\t" * (N_FIELDS - 1)
_EMPTY_LINE = "\x00\t"  # 2 fields: skipped, and told apart from a real line by its NUL


def _open_bytes(path: Path):
    """``(text stream, raw file)``: the raw file gives the position for progress."""
    raw = open(path, "rb")
    gzipped = raw.read(2) == b"\x1f\x8b"
    raw.seek(0)
    return (gzip.GzipFile(fileobj=raw, mode="rb") if gzipped else raw), raw


def sniff(path: str | Path) -> tuple[str, bytes]:
    """``(kind, first bytes)`` of a file: kind ``"gzip"`` or ``"plain"``, or a sentence saying
    what else it is (a directory, parquet, another compression); the bytes are the first 64 KiB
    of its text (decompressed). Raises FileNotFoundError for a missing path."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"{path.name}: no such file. This course never downloads Criteo; get it from Criteo's "
            "site or Kaggle and pass its path (plain or .gz)."
        )
    if path.is_dir():
        return "a directory: give the day files in it (e.g. its day_0 day_1 ...), not the directory", b""
    with open(path, "rb") as f:
        head = f.read(8)
    for magic, what in _OTHER_FORMATS.items():
        if head.startswith(magic):
            return what, b""
    stream, raw = _open_bytes(path)
    try:
        sample = stream.read(_SAMPLE_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        return f"gzipped but not readable as gzip ({exc})", b""
    finally:
        raw.close()
    return ("gzip" if head.startswith(b"\x1f\x8b") else "plain"), sample


def check_criteo_file(path: str | Path) -> str:
    """``"gzip"`` or ``"plain"`` for a file that looks like Criteo's format; else a ValueError in
    one line saying what the file is instead (empty, a directory, not tab-separated, ...)."""
    kind, sample = sniff(path)
    name = Path(path).name
    if kind not in ("gzip", "plain"):
        raise ValueError(f"{name} is {kind}.")
    if not sample:
        raise ValueError(f"{name} is empty: there are no lines to convert.")
    lines = sample.split(b"\n")
    lines = lines[:-1] if len(lines) > 1 else lines  # the last piece may be cut by the sample
    first = next((line for line in lines if line.strip()), lines[0])
    if b"\t" not in first:
        commas = first.count(b",")
        guess = f" but {commas} commas (comma-separated?)" if commas else ""
        raise ValueError(
            f"{name} is not tab-separated: its first line has no tab{guess}; Criteo's files have "
            f"{N_FIELDS} tab-separated fields per line."
        )
    counts = [line.rstrip(b"\r").count(b"\t") + 1 for line in lines]
    if N_FIELDS not in counts:
        most = max(set(counts), key=counts.count)
        hint = " (Kaggle's test.txt has 39: no label, so nothing to train or test on)" if most == 39 else ""
        raise ValueError(
            f"{name} does not look like Criteo's format: none of its first {len(lines):,} lines has "
            f"{N_FIELDS} tab-separated fields (most have {most}){hint}."
        )
    return kind


def _has_empty_line(data: bytes) -> bool:
    """Whether whole lines ``data`` hold an empty one (``\\n`` or ``\\r\\n`` alone). With numpy:
    ``b"\\n\\n" in data`` is slow where every line is short of a match by one byte."""
    ends = np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n"))  # [lines]
    starts = np.concatenate([[0], ends[:-1] + 1])
    lengths = ends - starts
    if not (lengths <= 1).any():
        return False
    short = starts[lengths == 1]
    return bool((lengths == 0).any() or (np.frombuffer(data, np.uint8)[short] == ord("\r")).any())


class _Utf8Lines(io.RawIOBase):
    """The bytes of ``stream`` in whole lines, except that a line that is not valid UTF-8 becomes
    ``_NOT_UTF8_LINE`` and an empty one ``_EMPTY_LINE`` (the same number of lines). A block of
    ASCII text without an empty line, the usual case, passes through as it is."""

    def __init__(self, stream):
        self.stream, self.tail, self.out, self.error = stream, b"", b"", None

    def readable(self) -> bool:
        return True

    def _clean(self, data: bytes) -> bytes:
        """Whole lines in, the same number of lines out."""
        if data.isascii() and not _has_empty_line(data):
            return data
        lines = data.split(b"\n")
        whole = lines[:-1] if data.endswith(b"\n") else lines  # a last piece after the end is no line
        for i, line in enumerate(whole):
            if line in (b"", b"\r"):
                lines[i] = _EMPTY_LINE.encode()
            elif not line.isascii():
                try:
                    line.decode("utf-8")
                except UnicodeDecodeError:
                    lines[i] = _NOT_UTF8_LINE
        return b"\n".join(lines)

    def read(self, size: int = -1) -> bytes:
        """At most ``size`` bytes, ending at a line's end where there is one (the rest waits)."""
        size = size if size > 0 else BLOCK_BYTES
        if not self.out and self.stream is not None:
            try:
                chunk = self.stream.read(max(size - len(self.tail), 1))
            except (OSError, EOFError, zlib.error) as exc:  # a cut or corrupt gzip stream
                self.error, chunk = exc, b""
            if not chunk:
                self.stream, data, self.tail = None, self.tail, b""
            else:
                cut = chunk.rfind(b"\n") + 1
                if cut == 0:  # no line end in this chunk: keep reading (the reader refuses huge lines)
                    cut = len(chunk)
                data, self.tail = self.tail + chunk[:cut], chunk[cut:]
            self.out = self._clean(data)  # longer than size only if a line was replaced
        if len(self.out) <= size:
            piece, self.out = self.out, b""
        else:
            piece, self.out = self.out[:size], self.out[size:]
        return piece


class CriteoReader:
    """Blocks of one Criteo file (see the module's docstring). Iterate once.

    skipped: ``(line number, fields)`` of each line with the wrong number of fields, in line order
    (1-based), until ``take_skipped`` takes them.
    size / position(): bytes of the file on disk and how far it has been read (for progress).
    """

    def __init__(self, path: str | Path, block_size: int | None = None):
        self.path, self.block_size = Path(path), block_size or BLOCK_BYTES
        check_criteo_file(self.path)
        self.size = self.path.stat().st_size
        self.skipped: list[tuple[int, int]] = []  # appended by the reading thread, in line order
        self.forgotten = 0  # skipped lines before the first one still listed
        self._raw = None
        self._closing = threading.Lock()  # the file is closed by the thread that reads it

    def position(self) -> int:
        """Bytes read so far; the file's size once it is closed. Safe from another thread than the
        reading one: a ``tell()`` racing the reading thread's ``close()`` would ask the OS about a
        file descriptor that is gone, or already another file's."""
        with self._closing:
            return self._raw.tell() if self._raw is not None and not self._raw.closed else self.size

    def _skip(self, row) -> str:
        fields = 0 if row.text == _EMPTY_LINE else row.actual_columns  # 0: an empty line
        self.skipped.append((row.number, fields))  # one append: safe across threads
        return "skip"

    def __iter__(self):
        import pyarrow as pa
        import pyarrow.csv as csv

        names = [f"f{i}" for i in range(N_FIELDS)]
        stream, self._raw = _open_bytes(self.path)
        source = _Utf8Lines(stream)
        try:
            reader = csv.open_csv(
                source,
                read_options=csv.ReadOptions(
                    column_names=names, block_size=self.block_size, use_threads=False
                ),
                parse_options=csv.ParseOptions(
                    delimiter="\t",
                    quote_char=False,
                    escape_char=False,
                    double_quote=False,
                    ignore_empty_lines=False,
                    invalid_row_handler=self._skip,
                ),
                convert_options=csv.ConvertOptions(
                    column_types={name: pa.binary() for name in names},
                    strings_can_be_null=True,
                    null_values=[""],
                    quoted_strings_can_be_null=False,
                ),
            )
            yield from reader
        except pa.ArrowInvalid as exc:
            if source.error is None:
                raise ValueError(
                    f"{self.path.name} stopped being readable as Criteo's format: {exc}"
                ) from None
        finally:
            with self._closing:
                self._raw.close()
        if source.error is not None:
            raise ValueError(
                f"{self.path.name} is not a whole gzip file ({source.error}): a download cut short? "
                "Download it again."
            )

    def line_of(self, row: int) -> int:
        """The line number (1-based) of the ``row``-th (0-based) line delivered in a block."""
        skipped_before = self.forgotten
        while True:  # the row's line is row + 1 + the skipped lines before it: a fixed point
            line = row + 1 + skipped_before
            now = self.forgotten + bisect.bisect_right(self.skipped, (line, _ANY))
            if now == skipped_before:
                return line
            skipped_before = now

    def take_skipped(self, before: int | None = None) -> list[tuple[int, int]]:
        """``(line, fields)`` of the skipped lines before line ``before`` (all: None), and forget
        them (``line_of`` still counts them)."""
        cut = len(self.skipped) if before is None else bisect.bisect_left(self.skipped, (before, -1))
        taken = self.skipped[:cut]
        self.forgotten += cut
        del self.skipped[:cut]
        return taken


def estimate_lines(path: str | Path) -> int:
    """About how many lines a Criteo file has, from its size and its first 64 KiB (for gzip, the
    compression ratio of its first MiB). For the default table size, not for counting."""
    kind, sample = sniff(path)
    lines_in_sample = max(sample.count(b"\n"), 1)
    text_bytes = Path(path).stat().st_size
    if kind == "gzip":
        with open(path, "rb") as f:
            compressed = f.read(1 << 20)
        inflate = zlib.decompressobj(wbits=31)
        text = inflate.decompress(compressed, 1 << 24)
        used = len(compressed) - len(inflate.unused_data) - len(inflate.unconsumed_tail)
        text_bytes = text_bytes * len(text) / max(used, 1)
    return max(1, round(text_bytes * lines_in_sample / max(len(sample), 1)))
