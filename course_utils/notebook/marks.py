"""The output rule's two markers: a value that differs from machine to machine, printed after one.

A stored notebook output holds only what every supported CPU, torch release and load reproduces.
A value that does not is printed after a marker, and ``tests/sanitize.cfg`` blanks the line from
the marker to its end before nbval compares a fresh run with the stored one: the value still shows,
and the cell's assert states the claim about it.

* ``varies("clock", text)``: ``"⏱ text"``, a time, a rate or a bandwidth;
* ``varies("machine", text)``: ``"⚙ text"``, any other machine-dependent value (a trained metric's
  last digits, a float difference, a device or backend name, an error text that changes between
  torch releases and builds).

Taught in chapter 00 (appendix 00a, section 6b: the first ``⏱`` line, spawn against fork).
"""

from __future__ import annotations

__all__ = ["MARKS", "varies"]

MARKS = {"clock": "\u23f1", "machine": "\u2699"}  #: ⏱ and ⚙, as tests/sanitize.cfg spells them


def varies(kind: str, text: str) -> str:
    """``text`` after the marker of ``kind`` (``"clock"``: ⏱, ``"machine"``: ⚙) and a space."""
    if kind not in MARKS:
        raise ValueError(f"kind must be one of {sorted(MARKS)}, got {kind!r}")
    return f"{MARKS[kind]} {text}"
