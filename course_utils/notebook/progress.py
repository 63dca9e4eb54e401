"""A progress line for training loops that leaves nothing behind in a stored notebook.

The chapters are tested with strict nbval, which compares every output a cell
produced with the stored one; a progress bar that prints changing numbers
would break that. So ``Progress`` works like this:

* **In a notebook** it shows one line, ``desc: 40/156 steps | loss 0.4721``,
  in a display that it updates in place while the loop runs and **empties when
  the loop ends**. The stored notebook keeps only that empty display, the same
  on every run, and nbval (which sees the display as it was first shown, empty
  too) passes. Print a run's result yourself, rounded, after the loop.
* **In a terminal** (stderr is a TTY) it redraws one line with ``\\r`` and ends it.
* **Anywhere else** (pytest, a log file, the ranks of ``launch``, whose output is
  collected and shown afterwards) it prints nothing.

    with Progress(total=len(batches), desc="train") as bar:
        for batch in batches:
            loss = train_step(model, opt, batch)
            bar.update(loss=loss)

Not taught in a chapter: support code (the training loops' progress line).
"""

from __future__ import annotations

import sys
import time

from course_utils.notebook.show import in_kernel

__all__ = ["Progress", "where_progress_shows"]


def where_progress_shows() -> str:
    """``"notebook"``, ``"terminal"`` or ``"nowhere"``: how a ``Progress`` made here would show."""
    if in_kernel():
        return "notebook"
    if getattr(sys.stderr, "isatty", lambda: False)():
        return "terminal"
    return "nowhere"


class Progress:
    """A live ``desc: n/total steps | name value ...`` line, cleared at the end.

    total: number of steps expected. every_s: least seconds between redraws.
    update(n=1, **metrics): count ``n`` steps done and remember the latest metrics
        (floats are shown with 4 decimals).
    text: the current line; ``close()`` (or leaving the ``with`` block) clears it.
    """

    def __init__(self, total: int, desc: str = "", every_s: float = 0.25, mode: str | None = None):
        if total < 0:
            raise ValueError(f"total must be >= 0 steps, got {total}")
        self.total, self.desc, self.every_s = int(total), desc, every_s
        self.mode = mode or where_progress_shows()
        if self.mode not in ("notebook", "terminal", "nowhere"):
            raise ValueError(f"mode must be 'notebook', 'terminal' or 'nowhere', got {mode!r}")
        self.done, self.metrics = 0, {}
        self._last_draw = float("-inf")
        self._handle = None
        if self.mode == "notebook":
            from IPython.display import display

            self._handle = display({"text/plain": ""}, raw=True, display_id=True)

    @property
    def text(self) -> str:
        parts = [f"{self.desc + ': ' if self.desc else ''}{self.done}/{self.total} steps"]
        parts += [f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in self.metrics.items()]
        return " | ".join(parts)

    def update(self, n: int = 1, **metrics) -> None:
        self.done += n
        self.metrics.update(metrics)
        now = time.monotonic()
        if now - self._last_draw >= self.every_s or self.done >= self.total:
            self._last_draw = now
            self._draw(self.text)

    def _draw(self, line: str) -> None:
        if self.mode == "notebook":
            self._handle.update({"text/plain": line}, raw=True)
        elif self.mode == "terminal":
            sys.stderr.write("\r" + line.ljust(79))
            sys.stderr.flush()

    def close(self) -> None:
        """Remove the line (notebook) or end it (terminal)."""
        if self.mode == "notebook":
            self._handle.update({"text/plain": ""}, raw=True)
            self._handle = None
        elif self.mode == "terminal":
            sys.stderr.write("\n")
            sys.stderr.flush()
        self.mode = "nowhere"

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
