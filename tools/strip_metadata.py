"""Strip execution metadata from notebooks, keeping their outputs.

    python tools/strip_metadata.py chapters/*.ipynb solutions/*.ipynb           # strip in place
    python tools/strip_metadata.py --check chapters/*.ipynb solutions/*.ipynb   # exit 1 if any has it

What goes: each cell's ``metadata.execution`` (nbclient's timestamps of when the cell ran) and
the notebook's ``language_info.version`` (the Python that last ran it). Both change on every
regeneration and say nothing to a learner; a diff of a regenerated chapter then shows only
what changed in its sources and outputs. Outputs and execution counts stay: nbval compares them.
``tools/regenerate.py`` calls ``strip``; .pre-commit-config.yaml runs this with ``--check``.

Not taught in a chapter: authors' tooling (CONTRIBUTING.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def strip(nb: dict) -> bool:
    """Remove the execution metadata from a notebook's JSON (``nbformat`` node or dict), in place;
    whether anything was removed."""
    changed = nb.get("metadata", {}).get("language_info", {}).pop("version", None) is not None
    for cell in nb.get("cells", []):
        changed |= cell.get("metadata", {}).pop("execution", None) is not None
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path)
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a notebook has any")
    args = parser.parse_args(argv)
    found = []
    for path in args.notebooks:
        text = path.read_text()
        nb = json.loads(text)
        if strip(nb):
            found.append(str(path))
            if not args.check:  # nbformat's own layout: one-space indent, a final newline
                path.write_text(json.dumps(nb, indent=1, ensure_ascii=False, sort_keys=True) + "\n")
    if found:
        print(("has execution metadata: " if args.check else "stripped: ") + ", ".join(found))
    return 1 if found and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
