"""A commit message's subject: 72 characters or fewer, then a blank line before the body.

    python tools/commit_subject.py .git/COMMIT_EDITMSG     # what pre-commit's commit-msg hook runs
    python tools/commit_subject.py --since REV             # every commit after REV (git log)

Exits 1 naming each message that breaks the rule, so ``git log --oneline`` stays readable and
the details go in the body. Git's comment lines (``#``) are left out, as git leaves them out.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

LIMIT = 72


def problems(message: str) -> list[str]:
    """What is wrong with one commit message (empty: nothing)."""
    lines = [line for line in message.splitlines() if not line.startswith("#")]
    while lines and not lines[0].strip():
        lines.pop(0)
    if not lines:
        return ["the message is empty"]
    subject, found = lines[0], []
    if len(subject) > LIMIT:
        found.append(f"the subject has {len(subject)} characters, over {LIMIT}: move the details to the body")
    if len(lines) > 1 and lines[1].strip():
        found.append("the subject is followed by text: leave a blank line before the body")
    return found


def _since(rev: str) -> list[tuple[str, str]]:
    """(short hash, message) of each commit after ``rev``, oldest first."""
    out = subprocess.run(
        ["git", "log", "--reverse", "--format=%h%x00%B%x01", f"{rev}..HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return [tuple(entry.strip("\n").split("\0", 1)) for entry in out.split("\1") if entry.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("message_file", nargs="?", type=Path, help="a commit message (commit-msg hook)")
    parser.add_argument("--since", metavar="REV", help="check every commit after REV instead")
    args = parser.parse_args(argv)
    if (args.message_file is None) == (args.since is None):
        parser.error("give a message file or --since REV")
    messages = _since(args.since) if args.since else [("message", args.message_file.read_text())]
    bad = [(name, p) for name, text in messages for p in problems(text)]
    for name, problem in bad:
        print(f"commit {name}: {problem}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
