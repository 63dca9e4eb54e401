"""Small helpers for the notebooks: where we run, and showing the package's code.

Taught in chapter 00 (``environment``, ``show_source``); ``show_diff`` in chapters 04, 06, 07 and 08.
"""

from __future__ import annotations

import difflib
import inspect
import multiprocessing
import os
import sys
import textwrap
from pathlib import Path


def environment() -> str:
    """Where this Python runs: ``"colab"``, ``"kaggle"``, ``"jupyter"`` or ``"script"``."""
    if "google.colab" in sys.modules or os.environ.get("COLAB_RELEASE_TAG"):
        return "colab"
    if os.environ.get("KAGGLE_KERNEL_RUN_TYPE"):
        return "kaggle"
    if "ipykernel" in sys.modules:
        return "jupyter"
    return "script"


def in_kernel() -> bool:
    """Whether this is a notebook kernel's own process, the one that may display in the notebook.

    A rank forked from the kernel by ``launch`` inherits the kernel object but must
    not talk to the notebook, so it answers False.
    """
    ipython = sys.modules.get("IPython")  # imported in every notebook kernel
    kernel = ipython is not None and getattr(ipython.get_ipython(), "kernel", None) is not None
    return kernel and multiprocessing.parent_process() is None


def source_of(obj) -> tuple[str, str]:
    """``(header, source)`` of a function, class, method or module: the header names its file
    (relative to the package's parent) and its qualified name; the source is dedented, so a
    method reads like a function."""
    import course_utils

    path = Path(inspect.getsourcefile(inspect.unwrap(obj))).resolve()  # a decorated method's own file
    try:  # relative to the checkout, or to site-packages in a wheel install
        where = path.relative_to(Path(course_utils.__file__).resolve().parents[1])
    except ValueError:
        where = path
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", ""))
    header = f"# {where.as_posix()}" + (f"  {name}" if name else "")  # no line number: it shifts with edits
    return header, textwrap.dedent(inspect.getsource(obj)).rstrip()


def show_source(obj, brief: bool = False) -> None:
    """Print the source of a function, class, method or module from course_utils, headed by
    the file and name it comes from.

    Notebooks call this instead of pasting a copy, so the text a learner reads
    is the code that runs. ``brief=True`` prints the reading version: every block
    between a ``# details: <what it does>`` line and its ``# end details`` line is
    folded into one ``# ... <what it does>`` line, so the idea shows first and the
    machinery (signal handling, cleanup, platform cases) stays one call away.
    """
    header, source = source_of(obj)
    print(header)
    print(fold_details(source) if brief else source)


def fold_details(source: str) -> str:
    """``source`` with each ``# details: x`` ... ``# end details`` block replaced by ``# ... x``.

    Blocks may not nest; an unclosed block raises ``ValueError`` naming its line.
    """
    out, folding = [], None
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith("# details:"):
            if folding is not None:
                raise ValueError(f"line {number}: '# details:' inside the block opened at line {folding}")
            folding = number
            indent = line[: len(line) - len(line.lstrip())]
            out.append(f"{indent}# ... {stripped[len('# details:') :].strip()}")
        elif stripped == "# end details":
            if folding is None:
                raise ValueError(f"line {number}: '# end details' without a '# details:' line")
            folding = None
        elif folding is None:
            out.append(line)
    if folding is not None:
        raise ValueError(f"line {folding}: '# details:' block has no '# end details' line")
    return "\n".join(out)


def show_diff(before, after, context: int = 3, brief: bool = False) -> None:
    """Print what changes from ``before``'s source to ``after``'s, as a unified diff
    (lines starting ``-`` go, ``+`` come): each step of the course as a small change of
    the last, e.g. ``show_diff(NaiveDDP, BucketedDDP)``. ``brief=True`` diffs the reading
    versions (``fold_details`` on both sides), as ``show_source(..., brief=True)`` prints them."""
    (head_a, a), (head_b, b) = source_of(before), source_of(after)
    if brief:
        a, b = fold_details(a), fold_details(b)
    lines = difflib.unified_diff(
        a.splitlines(), b.splitlines(), fromfile=head_a[2:], tofile=head_b[2:], n=context, lineterm=""
    )
    print("\n".join(lines))
