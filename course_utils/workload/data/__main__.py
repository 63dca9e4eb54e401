"""Command line for click-log files::

    python -m course_utils.workload.data from-criteo SRC [SRC ...] --out OUT [--buckets N | --like FILE]
                                                     [--max-rows N] [--strict]
    python -m course_utils.workload.data info FILE
    python -m course_utils.workload.data repartition SRC DST ROW_GROUPS

``from-criteo`` converts Criteo's day files (plain or gzipped TSV) into the parquet the loaders and
``train_hybrid --data`` read (``criteo_convert.py``). A wrong input gets one line on stderr and
exit status 2.

Not taught in a chapter: the command line behind the README's data section.
"""

from __future__ import annotations

import argparse
import sys


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m course_utils.workload.data",
        description="Click-log files: convert, inspect, repartition.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    convert = commands.add_parser(
        "from-criteo",
        help="convert Criteo day files (plain or .gz TSV) into the course's parquet",
        description="Convert Criteo day files (plain or gzipped TSV: label, 13 integers, 26 hex ids) "
        "into one parquet file, streamed in bounded memory, with DLRM's preprocessing; bad lines are "
        "counted by kind and skipped.",
    )
    convert.add_argument("sources", nargs="+", metavar="SRC", help="Criteo files, converted in this order")
    convert.add_argument("--out", required=True, help="the parquet file to write")
    sizes = convert.add_mutually_exclusive_group()
    sizes.add_argument(
        "--buckets",
        type=int,
        help="rows per embedding table (ids are hashed into them); "
        "default: one per 32 input lines, a power of two from 1,024 to 1,048,576",
    )
    sizes.add_argument(
        "--like",
        help="a converted file whose table sizes to use (give the training file "
        "when converting the test file)",
    )
    convert.add_argument("--max-rows", type=int, help="stop after writing this many rows")
    convert.add_argument("--strict", action="store_true", help="refuse the input at its first bad line")
    info = commands.add_parser("info", help="rows, row groups and tables of a parquet file")
    info.add_argument("file")
    repartition = commands.add_parser(
        "repartition", help="rewrite a parquet file with another row-group count"
    )
    repartition.add_argument("src")
    repartition.add_argument("dst")
    repartition.add_argument("row_groups", type=int)
    return parser


def _info(path: str) -> str:
    from course_utils.workload.data.parquet import parquet_info

    info = parquet_info(path)
    lines = [f"{path}: {info['rows']:,} rows in {info['row_groups']} row groups"]
    if info["cardinalities"] is not None:
        cards = info["cardinalities"]
        same = len(set(cards)) == 1
        lines.append(f"tables: {len(cards)} x {cards[0]:,} rows" if same else f"tables: {list(cards)}")
    if info["preprocessing"] is not None:
        prep = info["preprocessing"]
        lines.append(
            f"from-criteo of {', '.join(prep.get('files', []))}: dense {prep['dense']}; ids {prep['sparse']}"
        )
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "from-criteo":
            from course_utils.workload.data.criteo_convert import from_criteo

            report = from_criteo(
                args.sources,
                args.out,
                buckets=args.buckets,
                like=args.like,
                max_rows=args.max_rows,
                strict=args.strict,
                progress=True,
            )
            print(report)
            print(f"{report.lines / max(report.seconds, 1e-9):,.0f} lines/s ({report.seconds:.1f} s)")
        elif args.command == "info":
            print(_info(args.file))
        else:
            from course_utils.workload.data.parquet import parquet_info, repartition

            out = repartition(args.src, args.dst, args.row_groups)
            print(f"{out}: {parquet_info(out)['row_groups']} row groups")
    except (ValueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: nothing was written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
