"""Lines per second while a conversion runs: a bar on a terminal, a line every 30 s in a log.

    from-criteo [#########...........]  45% of 2 files | 88,123,456 lines | 1.21 M lines/s

The share is of the input's bytes on disk (compressed bytes for a gzipped file). In a notebook it
is the course's progress line, emptied at the end (``notebook.progress.Progress``).

Not taught in a chapter: support code (the converter's progress line).
"""

from __future__ import annotations

import sys
import time

from course_utils.notebook.progress import Progress

__all__ = ["ConvertProgress"]

_LOG_EVERY_S = 30.0


class ConvertProgress(Progress):
    """``update(reader, lines)`` after each block: ``reader`` is the file being read (its
    ``position()`` and ``size``), ``lines`` the lines done in all. ``enabled=False``: silent."""

    def __init__(self, readers: list, enabled: bool = True):
        self.sizes = {id(r): r.size for r in readers}
        self.done_before: dict = {}
        super().__init__(
            total=sum(self.sizes.values()),
            desc="from-criteo",
            every_s=0.5,
            mode=None if enabled else "nowhere",
        )
        self.log = enabled and self.mode == "nowhere"  # stderr is a file or a pipe: a line now and then
        self.start, self.lines, self.files = time.monotonic(), 0, len(readers)
        self._last_log = self.start

    @property
    def text(self) -> str:
        share = self.done / max(self.total, 1)
        rate = self.lines / max(time.monotonic() - self.start, 1e-9)
        bar = "#" * round(20 * share) + "." * (20 - round(20 * share))
        files = f"{self.files} files" if self.files > 1 else "1 file"
        return (
            f"{self.desc} [{bar}] {share:4.0%} of {files} | {self.lines:,} lines | {rate / 1e6:.2f} M lines/s"
        )

    def update(self, reader, lines: int) -> None:  # noqa: D102 - see the class
        key = id(reader)
        if key not in self.done_before:
            self.done_before[key] = sum(size for k, size in self.sizes.items() if k in self.done_before)
        self.lines, self.done = lines, self.done_before[key] + reader.position()
        now = time.monotonic()
        if now - self._last_draw >= self.every_s:  # the reader reads ahead: 100% comes early, so no
            self._last_draw = now  # redraw just for reaching it (Progress.update would)
            self._draw(self.text)
        if self.log and now - self._last_log >= _LOG_EVERY_S:
            self._last_log = now
            print(self.text, file=sys.stderr, flush=True)
