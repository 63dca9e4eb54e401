"""Re-execute chapters in place, top to bottom, so stored outputs match the code.

    python tools/regenerate.py                    # every chapter
    python tools/regenerate.py chapters/04_ddp.ipynb
    /path/to/torchrec-venv/bin/python tools/regenerate.py chapters/07a_torchrec.ipynb

The appendices in ``NEEDS_TORCHREC`` (07a, 07b) need TorchRec, which is not a course dependency:
run them with the python of an environment that has TorchRec (07a's section 1; .ci/run's part 5
builds one). With no notebooks named, they are left out where TorchRec does not import, with a note
saying so.

Uses the same kernel (``python3``) and working directory (the notebook's own
folder) that ``pytest --nbval`` uses, so what is stored is what the tests see.

Not taught in a chapter: authors' tooling (CONTRIBUTING.md, notebook rule 7).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from strip_metadata import strip  # tools/, beside this file

from course_utils.sharding.torchrec_dlrm import NEEDS_TORCHREC, torchrec_missing

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"  # a checkout's; not in a wheel install


def regenerate(path: Path, timeout: int = 600) -> float:
    """Execute one notebook in place; returns the seconds it took."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(
        nb,
        timeout=timeout,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        record_timing=False,
    ).execute()
    strip(nb)  # the Python version that ran it (tools/strip_metadata.py)
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "notebooks", nargs="*", type=Path, help="notebooks to run (default: every chapters/*.ipynb)"
    )
    parser.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    if not args.notebooks and not CHAPTERS.is_dir():  # e.g. the course installed as a wheel
        parser.error(
            f"no chapters folder at {CHAPTERS}: with no notebooks named, regenerate re-executes the "
            "chapters of a checkout (git clone the course, pip install -e . in it); or name the notebooks"
        )
    paths = args.notebooks or sorted(CHAPTERS.glob("*.ipynb"))
    needing = [p for p in paths if p.name in NEEDS_TORCHREC]
    missing = torchrec_missing() if needing else None
    if missing is not None:
        if args.notebooks:
            parser.error(
                f"{needing[0].name} needs torchrec, which does not import here ({missing}); run this "
                "with the python of an environment that has TorchRec (appendix 07a, section 1)"
            )
        for path in needing:
            print(
                f"{path.name}: left out, it needs torchrec ({missing}); regenerate it with a TorchRec "
                f"environment's python: <that python> tools/regenerate.py chapters/{path.name}"
            )
        paths = [p for p in paths if p.name not in NEEDS_TORCHREC]
    for path in paths:
        print(f"{path.name}: ", end="", flush=True)
        print(f"executed in {regenerate(path, args.timeout):.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
