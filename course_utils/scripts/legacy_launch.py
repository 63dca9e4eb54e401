"""A script written for the deprecated ``python -m torch.distributed.launch``.

    python -m torch.distributed.launch --nproc-per-node 2 -m course_utils.scripts.legacy_launch --out DIR

The old launcher passes ``--local-rank=N`` on each rank's command line (unless
``--use-env``); torchrun passes nothing and sets ``LOCAL_RANK`` instead. This
script accepts both spellings of the argument and records what it received
in ``DIR/rank<R>.json``, next to the ``LOCAL_RANK`` variable. With
``--old-spelling`` it accepts only ``--local_rank``, as scripts written for
PyTorch 1.x did: since PyTorch 2.0 the launcher writes ``--local-rank``, and
argparse rejects it.

Taught in chapter 02 (appendix 02a, section 4: the deprecated ``torch.distributed.launch``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    old_spelling = "--old-spelling" in argv
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for rank<R>.json")
    parser.add_argument(
        "--old-spelling",
        action="store_true",
        help="accept only --local_rank, as scripts written before PyTorch 2.0 did",
    )
    spellings = ["--local_rank"] if old_spelling else ["--local-rank", "--local_rank"]
    parser.add_argument(
        *spellings,
        dest="local_rank",
        type=int,
        default=None,
        help="given by torch.distributed.launch; torchrun sets LOCAL_RANK instead",
    )
    args = parser.parse_args(argv)
    local_rank = args.local_rank if args.local_rank is not None else int(os.environ["LOCAL_RANK"])
    record = {
        "rank": int(os.environ["RANK"]),
        "argument": args.local_rank,
        "LOCAL_RANK": os.environ.get("LOCAL_RANK"),
        "local_rank used": local_rank,
        "extra arguments": [a for a in argv if a.startswith("--local")],
    }
    (args.out / f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
