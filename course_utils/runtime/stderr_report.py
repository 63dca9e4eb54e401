"""What a failed launcher's stderr says, in a few lines: the end of it, and a hint.

torchrun ends a failure with its own summary, which can push a rank's exception out of the last
lines; ``stderr_tail`` keeps the last lines, puts the first exception line before them when it fell
out, and drops c10's log prefix. ``port_hint`` names a rendezvous port already in use.
``runner.run_together`` builds its ``LauncherError`` message from both.

Taught in chapter 02 (section 5, torchrun; appendix 02a, section 4, the other launchers).
"""

from __future__ import annotations

import re

__all__ = ["C10_PREFIX", "port_hint", "stderr_tail"]

#: c10's log prefix, as in "W1122 15:30:01.1 pid file.py:12]"
C10_PREFIX = re.compile(r"^[WIE]\d{4} [\d:.]+ \d+ [^\]]*\] ?")
# a Python exception ("ValueError: ...") or C++'s std::terminate ("terminate called after throwing ...")
_EXCEPTION_LINE = re.compile(r"^(?:(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception): |terminate called )")


def port_hint(stderr: str) -> str:
    """ " because its rendezvous port is already in use (...)" when ``stderr`` says so, else ""."""
    if "EADDRINUSE" in stderr or "ddress already in use" in stderr:
        return " because its rendezvous port is already in use (choose another port, or --standalone)"
    return ""


def stderr_tail(text: str, lines: int = 15) -> str:
    """The last ``lines`` lines of a launcher's stderr, without c10's log prefix and blank lines.

    torchrun ends with its own summary of the failure, which can push a rank's exception out of
    the last lines; the first exception line (``ValueError: ...``, or C++'s ``terminate called
    ...`` before a rank's SIGABRT) is then put first.
    """
    kept = [C10_PREFIX.sub("", ln) for ln in text.splitlines()]
    kept = [ln for ln in kept if ln.strip(" *")]
    tail = kept[-lines:]
    first_error = next((ln for ln in kept if _EXCEPTION_LINE.match(ln.strip())), None)
    if first_error is not None and first_error not in tail:
        tail = [f"(first error) {first_error.strip()}", "...", *tail]
    return "\n".join(tail)
