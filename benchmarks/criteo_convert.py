"""Criteo text -> parquet: `from-criteo` (pyarrow's streaming CSV reader) against pandas' chunked
`read_csv` doing the same preprocessing; lines per second and peak resident memory.

    python benchmarks/criteo_convert.py [--lines 10000000] [--gzip] [--keep FOLDER]

The input: ``--lines`` lines of the course's synthetic click logs (``data.make_click_logs``, seed 0)
written in Criteo's format by ``data.write_criteo_tsv`` (40 tab-separated fields, ids as 8 hex
digits, about 270 bytes a line, no missing fields), made by a child process, gzipped with
``--gzip``. Each converter then runs in a fresh child process of its own, one after the other,
and writes the same parquet (26 tables of 2**18 rows, row groups of 131,072 rows, snappy):

* ``from-criteo``: ``data.from_criteo(src, out, buckets=2**18)``: pyarrow's ``open_csv`` in
  blocks of 1 MiB on a reading thread, every field checked, bad lines counted;
* ``pandas``: ``pandas.read_csv(src, sep="\\t", header=None, chunksize=1_000_000, engine="c",
  quoting=QUOTE_NONE, dtype=float64 for the label and I1..I13, object for C1..C26, only ""
  as missing)``; per chunk, the same transforms (missing and negative integers -> 0, ``log1p``
  in float64 -> float32; ids ``int(hex, 16) % 2**18`` -> int32 with the converter's own vectorised
  decoder, ``criteo_parse._hex_ids``, on each column handed to Arrow as binary); then the same
  ``pyarrow.parquet.ParquetWriter``. It checks nothing: a bad line would raise or pass.

lines/s: input lines / the child's wall time of the conversion (its imports excluded); its CPU
time (all threads) is shown too: on a shared machine it moves less than wall time.
Peak RSS: the child's ``ru_maxrss`` at the end (the interpreter and its imports included).
Both outputs are compared: the same rows, equal values.

Exits 1 unless from-criteo's peak RSS is under 1 GB, it converts faster than pandas, and the two
files hold the same numbers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

BUCKETS = 1 << 18
CHUNK_LINES = 1_000_000

_MAKE = """
import sys
from pathlib import Path
from course_utils.workload import data
out, lines = Path(sys.argv[1]), int(sys.argv[2])
step = 1 << 20
parts = []
for start in range(0, lines, step):
    part = out.with_name(f"part{start}" + out.suffix)
    data.write_criteo_tsv(data.make_click_logs(min(step, lines - start), seed=0, first_row=start), part)
    parts.append(part)
with open(out, "wb") as whole:  # gzip members may follow each other: still one gzip file
    for part in parts:
        whole.write(part.read_bytes())
        part.unlink()
"""

_FROM_CRITEO = """
import json, resource, sys, time
from course_utils.workload import data
start, cpu = time.monotonic(), time.process_time()
report = data.from_criteo(sys.argv[1], sys.argv[2], buckets=int(sys.argv[3]))
seconds, cpu = time.monotonic() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"lines": report.lines, "seconds": seconds, "cpu": cpu, "peak_rss": peak}))
"""

_PANDAS = """
import csv, json, resource, sys, time
import numpy as np, pandas as pd, pyarrow as pa, pyarrow.parquet as pq
from course_utils.workload.data import criteo_convert, criteo_parse
src, out, buckets, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
names = ["label"] + [f"I{j}" for j in range(1, 14)] + [f"C{t}" for t in range(1, 27)]
schema = criteo_convert._schema((buckets,) * 26, {})
start, cpu, lines = time.monotonic(), time.process_time(), 0
with pq.ParquetWriter(out, schema, compression="snappy") as writer:
    for df in pd.read_csv(src, sep="\\t", header=None, names=names, chunksize=chunk, engine="c",
                          quoting=csv.QUOTE_NONE, keep_default_na=False, na_values=[""],
                          dtype={**{c: "float64" for c in names[:14]}, **{c: "object" for c in names[14:]}}):
        n = len(df)
        columns = [df["label"].to_numpy(np.float32), np.full(n, np.nan, np.float32)]
        for j in range(1, 14):
            counts = np.nan_to_num(df[f"I{j}"].to_numpy(np.float64), nan=0.0)
            columns.append(np.log1p(np.maximum(counts, 0.0)).astype(np.float32))
        for t in range(1, 27):
            ids, _ = criteo_parse._hex_ids(pa.array(df[f"C{t}"].to_numpy(), pa.binary()))
            columns.append((ids % np.uint64(buckets)).astype(np.int32))
        table = pa.Table.from_arrays([pa.array(c) for c in columns], schema=schema)
        for begin in range(0, n, 1 << 17):
            writer.write_table(table.slice(begin, 1 << 17), row_group_size=1 << 17)
        lines += n
seconds, cpu = time.monotonic() - start, time.process_time() - cpu
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
print(json.dumps({"lines": lines, "seconds": seconds, "cpu": cpu, "peak_rss": peak}))
"""

_SAME = """
import sys
import numpy as np, pyarrow.parquet as pq
a, b = pq.ParquetFile(sys.argv[1]), pq.ParquetFile(sys.argv[2])
assert a.metadata.num_rows == b.metadata.num_rows, (a.metadata.num_rows, b.metadata.num_rows)
for column in a.schema_arrow.names:
    it = zip(a.iter_batches(columns=[column], batch_size=1 << 20),
             b.iter_batches(columns=[column], batch_size=1 << 20), strict=True)
    for x, y in it:
        np.testing.assert_array_equal(x.column(0).to_numpy(), y.column(0).to_numpy(), err_msg=column)
print("same")
"""


def child(code: str, *args) -> dict | str:
    out = subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"a child failed:\n{out.stderr[-3000:]}")
    text = (out.stdout.strip().splitlines() or [""])[-1]
    return json.loads(text) if text.startswith("{") else text


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=10_000_000)
    parser.add_argument("--gzip", action="store_true", help="convert a gzipped file")
    parser.add_argument("--keep", type=Path, help="make (or reuse) the input in this folder")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="criteo_bench_") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        src = folder / f"day_{args.lines}{'.gz' if args.gzip else ''}"
        if not src.exists():
            started = time.monotonic()
            child(_MAKE, src, args.lines)
            print(
                f"made {src.name}: {args.lines:,} lines, {src.stat().st_size / 1e9:.2f} GB "
                f"in {time.monotonic() - started:.0f} s"
            )
        print(
            f"converting {src.name} into 26 tables of {BUCKETS:,} rows; "
            f"pandas in chunks of {CHUNK_LINES:,} lines"
        )
        results = {
            "from-criteo": child(_FROM_CRITEO, src, Path(tmp) / "course.parquet", BUCKETS),
            "pandas": child(_PANDAS, src, Path(tmp) / "pandas.parquet", BUCKETS, CHUNK_LINES),
        }
        same = child(_SAME, Path(tmp) / "course.parquet", Path(tmp) / "pandas.parquet") == "same"
    for name, r in results.items():
        print(
            f"{name:>12}: {r['lines'] / r['seconds']:>12,.0f} lines/s ({r['seconds']:.1f} s, "
            f"{r['cpu']:.1f} s of CPU), peak RSS {r['peak_rss'] / 2**20:,.0f} MiB"
        )
    ratio = results["pandas"]["seconds"] / results["from-criteo"]["seconds"]
    print(
        f"from-criteo is {ratio:.2f}x pandas' speed; "
        f"the two files hold the same numbers: {'yes' if same else 'NO'}"
    )
    ok = results["from-criteo"]["peak_rss"] < 1e9 and ratio > 1 and same
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
