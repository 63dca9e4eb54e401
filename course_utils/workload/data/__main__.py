"""Command line for click-log parquet files::

    python -m course_utils.workload.data repartition SRC DST ROW_GROUPS
    python -m course_utils.workload.data info FILE

Not taught in a chapter: the command line behind the README's data helpers.
"""

import sys

from course_utils.workload.data.parquet import parquet_info, repartition


def main(argv: list[str]) -> int:
    if len(argv) == 4 and argv[0] == "repartition":
        out = repartition(argv[1], argv[2], int(argv[3]))
        print(f"{out}: {parquet_info(out)['row_groups']} row groups")
        return 0
    if len(argv) == 2 and argv[0] == "info":
        info = parquet_info(argv[1])
        print(f"{argv[1]}: {info['rows']} rows in {info['row_groups']} row groups")
        return 0
    print(__doc__.strip(), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
