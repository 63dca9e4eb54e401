"""One value of the version matrix (``[tool.course.matrix]`` in pyproject.toml), for shell.

    python3 tools/matrix.py course.torch     # 2.13.0: the course's torch
    python3 tools/matrix.py floor.env        # a list prints as words: ATEN_CPU_CAPABILITY=default ...
    python3 tools/matrix.py                  # every key, one per line

.ci/run and tools/other_torch.sh read their pins here, noxfile.py reads the same table, and
tests/test_packaging.py checks every other pin in the repository against it. The standard library
only (tomllib, Python 3.11+; tomli where an older Python has it), since .ci/run starts from a bare
Python. A key that is not there is one line on stderr naming the keys that are, and exit status 2.

Not taught in a chapter: the maintainers' tooling (CONTRIBUTING.md, "What CI runs").
"""

from __future__ import annotations

import sys
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def load(path: Path = PYPROJECT) -> dict:
    """The ``[tool.course.matrix]`` table of ``path``, as nested dicts."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    return tomllib.loads(path.read_text())["tool"]["course"]["matrix"]


def keys(table: dict, prefix: str = "") -> list[str]:
    """Every leaf's dotted key (``floor.torch``), in the table's order."""
    found = []
    for name, value in table.items():
        if isinstance(value, dict):
            found += keys(value, f"{prefix}{name}.")
        else:
            found.append(f"{prefix}{name}")
    return found


def value(table: dict, key: str) -> str:
    """The value at dotted ``key`` as shell reads it (a list as words); KeyError naming the key."""
    found = table
    for part in key.split("."):
        if not isinstance(found, dict) or part not in found:
            raise KeyError(key)
        found = found[part]
    if isinstance(found, dict):
        raise KeyError(key)
    return " ".join(found) if isinstance(found, list) else str(found)


def main(argv: list[str]) -> int:
    try:
        table = load()
    except ModuleNotFoundError:
        print("tools/matrix.py: needs Python 3.11 or newer (tomllib), or tomli installed", file=sys.stderr)
        return 2
    if len(argv) > 1:
        print("tools/matrix.py: one key at a time (tools/matrix.py lists them all)", file=sys.stderr)
        return 2
    if not argv:
        print("\n".join(f"{k} = {value(table, k)}" for k in keys(table)))
        return 0
    try:
        print(value(table, argv[0]))
    except KeyError:
        print(
            f"tools/matrix.py: no key {argv[0]!r} in pyproject.toml's [tool.course.matrix]; "
            f"the keys are {', '.join(keys(table))}",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
