"""Criteo's text format -> the course's parquet (course_utils.workload.data, criteo_*.py): the
preprocessing against DLRM's formulas, exact round trips, bad lines counted by kind with their
first line numbers, --strict, files that are not Criteo's format, and the checks every reader of
data makes (a TSV where parquet belongs, train and test written for other tables)."""

import gzip
import math
import random
import threading
import time

import numpy as np
import pytest

from course_utils.workload import data
from course_utils.workload.data import __main__ as cli
from course_utils.workload.data import criteo_read
from course_utils.workload.data.criteo_convert import default_buckets
from course_utils.workload.data.criteo_parse import BAD_KINDS

pytestmark = pytest.mark.chapter(1)


def line(label, ints, cats) -> str:
    """One Criteo line: ``None`` writes an empty (missing) field."""
    return "\t".join(
        [str(label), *("" if v is None else str(v) for v in ints), *("" if v is None else v for v in cats)]
    )


GOOD = line(1, [1] * 13, ["68fd1e64"] * 26)


def test_preprocessing_is_dlrms_log1p_and_hex_ids_modulo_the_buckets(tmp_path):
    """Each value against the reference formulas (dlrm data_utils.py): empty -> 0, x < 0 -> 0,
    log(x + 1); a categorical int(hex, 16) % buckets, empty -> 0."""
    ints = [[1, None, 5, -1, 0, 7, 100000, 3, None, 12, 0, -3, 9], [None] * 13]
    cats = [["68fd1e64", "80e26c9b", None] + ["0B153874"] * 23, [None] * 25 + ["fffffffe"]]
    path = tmp_path / "day.tsv"
    path.write_text("\n".join(line(lbl, i, c) for lbl, i, c in zip([1, 0], ints, cats, strict=True)) + "\n")
    report = data.from_criteo(path, tmp_path / "day.parquet", buckets=1000)
    logs = data.read_parquet(tmp_path / "day.parquet")
    assert (report.lines, report.rows, report.bad_lines) == (2, 2, 0)
    np.testing.assert_array_equal(logs.label, [1, 0])
    for row in range(2):
        expected = [math.log1p(max(v or 0, 0)) for v in ints[row]]
        np.testing.assert_allclose(logs.dense[row], expected, rtol=1e-7)
        np.testing.assert_array_equal(logs.sparse[row], [int(c or "0", 16) % 1000 for c in cats[row]])
    assert logs.cardinalities == (1000,) * 26 and np.isnan(logs.prob).all()
    assert data.parquet_info(tmp_path / "day.parquet")["preprocessing"]["buckets"] == [1000] * 26
    per_table = data.read_criteo_tsv(path, buckets=list(range(2, 28)))  # 26 sizes, one per table
    assert per_table.cardinalities == tuple(range(2, 28))
    np.testing.assert_array_equal(
        per_table.sparse[0], [int(c or "0", 16) % b for c, b in zip(cats[0], range(2, 28), strict=True)]
    )


@pytest.mark.parametrize("name", ["clicks.tsv", "clicks.tsv.gz"])
def test_synthetic_logs_written_in_criteo_format_come_back_exactly(tmp_path, name):
    """Ids written as themselves (hashed_ids=False) and hashed into more buckets than any table has:
    the same ids, labels and counts (dense within float32 rounding), plain or gzipped."""
    logs = data.make_click_logs(20_000, seed=5)
    data.write_criteo_tsv(logs, tmp_path / name, hashed_ids=False)
    if name.endswith(".gz"):
        assert (tmp_path / name).read_bytes()[:2] == b"\x1f\x8b"
    report = data.from_criteo(tmp_path / name, tmp_path / "out.parquet", buckets=16384)
    back = data.read_parquet(tmp_path / "out.parquet")
    assert report.rows == report.lines == 20_000
    np.testing.assert_array_equal(back.sparse, logs.sparse)
    np.testing.assert_array_equal(back.label, logs.label)
    np.testing.assert_allclose(back.dense, logs.dense, rtol=2e-7, atol=0)


def test_training_on_converted_criteo_files_matches_training_on_the_same_logs_within_0_02_auc(tmp_path):
    """The planted-model logs (tables of Criteo's shape / 4000, up to 2,533 ids), written in
    Criteo's format with ids hashed as Criteo's look, converted into 8,192 buckets per table and
    trained on for one epoch; and the same logs trained on directly by a model with the same table
    sizes (a table's size sets its initial scale): the test AUCs agree within 0.02."""
    from course_utils.data_parallel.gil import one_torch_thread
    from course_utils.workload.models import DLRM
    from course_utils.workload.train import train

    logs = data.make_click_logs(80_000, seed=0, cardinalities=data.criteo_cardinalities(1 / 4000))
    train_logs, test_logs = logs[:60_000], logs[60_000:]  # seeds 0-2 differed by 0.002-0.005
    data.write_criteo_tsv(train_logs, tmp_path / "day_0")
    data.write_criteo_tsv(test_logs, tmp_path / "day_1.gz")
    data.from_criteo(tmp_path / "day_0", tmp_path / "train.parquet", buckets=8192)
    data.from_criteo(tmp_path / "day_1.gz", tmp_path / "test.parquet", like=tmp_path / "train.parquet")

    def same_tables(part):
        return data.ClickLogs(part.dense, part.sparse, part.label, part.prob, (8192,) * 26)

    aucs = {}
    for name, (fit_on, test_on) in {
        "direct": (same_tables(train_logs), same_tables(test_logs)),
        "converted": (
            data.read_parquet(tmp_path / "train.parquet"),
            data.read_parquet(tmp_path / "test.parquet"),
        ),
    }.items():
        model = DLRM(fit_on.cardinalities, embedding_dim=16, seed=0)
        with one_torch_thread():  # as a rank trains; several threads crawl on a busy machine
            history = train(
                model,
                fit_on,
                epochs=1,
                batch_size=2048,
                lr=0.005,
                optimizer="adam",
                seed=0,
                eval_data=test_on,
            )
        aucs[name] = history.final["auc"]
    assert abs(aucs["direct"] - aucs["converted"]) < 0.02, aucs
    assert aucs["converted"] > 0.72, aucs  # it learned: guessing is 0.5, the Bayes-optimal AUC 0.84


def test_hashed_ids_look_like_criteos_and_keep_distinct_ids_distinct():
    ids = np.arange(100_000)
    written = data.criteo_write.criteo_hex_ids(ids, table=3)
    assert written.dtype == "S8" and all(c in b"0123456789abcdef" for c in written[17])
    assert len(set(written.tolist())) == len(ids)  # a bijection: no two ids share a string
    assert set(written.tolist()).isdisjoint(data.criteo_write.criteo_hex_ids(ids[:1000], table=4).tolist())


def spoiled_file(path, n_lines: int = 120_000, seed: int = 0) -> dict:
    """A Criteo file of synthetic rows with bad lines of every kind at random places; returns, per
    kind, the line numbers (1-based) of its bad lines. Also an empty line, a non-UTF-8 line with the
    wrong number of fields, and a last line without a newline."""
    data.write_criteo_tsv(data.make_click_logs(n_lines, seed=seed), path)
    lines = path.read_bytes().split(b"\n")[:-1]
    rng = random.Random(seed)
    bad = {kind: [] for kind in BAD_KINDS}
    for pos in sorted(rng.sample(range(1, n_lines - 1), 400)):
        kind, fields = rng.choice(BAD_KINDS), lines[pos].split(b"\t")
        if kind == "utf8":
            fields[rng.randrange(40)] = b"\xff\xfe"
        elif kind == "fields":
            fields = rng.choice([fields[:30], fields + [b"7"], [b""], fields[:39]])
        elif kind == "label":
            fields[0] = rng.choice([b"2", b"", b"yes", b"01", b"-1"])
        elif kind == "integer":
            fields[1 + rng.randrange(13)] = rng.choice(
                [b"abc", b"1.5", b"+3", b"1e3", b"99999999999999999999"]
            )
        else:
            fields[14 + rng.randrange(26)] = rng.choice([b"zzzzzzzz", "café".encode(), b"0x12", b"1" * 17])
        lines[pos] = b"\t".join(fields)
        bad[kind].append(pos + 1)
    lines[0] = b"\xff\t1"  # not UTF-8 and 2 fields: a UTF-8 problem first
    bad["utf8"].insert(0, 1)
    lines[-1] += b"\t5"  # 41 fields, no newline after it
    bad["fields"].append(n_lines)
    path.write_bytes(b"\n".join(lines))
    return bad


def test_bad_lines_are_counted_by_kind_with_the_first_line_of_each(tmp_path, monkeypatch):
    monkeypatch.setattr(criteo_read, "BLOCK_BYTES", 1 << 18)  # many blocks: line numbers across them
    bad = spoiled_file(tmp_path / "day_0")
    report = data.from_criteo(tmp_path / "day_0", tmp_path / "day_0.parquet")
    assert report.bad == {kind: len(lines) for kind, lines in bad.items()}
    assert {kind: first[:2] for kind, first in report.first_bad.items()} == {
        kind: ("day_0", lines[0]) for kind, lines in bad.items()
    }
    n_bad = sum(map(len, bad.values()))
    assert report.lines == 120_000 and report.rows == 120_000 - n_bad
    assert data.parquet_info(tmp_path / "day_0.parquet")["rows"] == report.rows
    text = str(report)
    assert f"bad lines skipped: {n_bad}" in text and f"first: day_0 line {bad['label'][0]:,}" in text
    # the good lines are all there, in order: the labels of every line that was not spoiled
    spoiled = {n for lines in bad.values() for n in lines}
    labels = [
        int(x.split(b"\t", 1)[0])
        for i, x in enumerate((tmp_path / "day_0").read_bytes().split(b"\n"))
        if i + 1 not in spoiled
    ]
    np.testing.assert_array_equal(data.read_parquet(tmp_path / "day_0.parquet").label, labels)


def test_strict_stops_at_the_first_bad_line_and_writes_nothing(tmp_path):
    bad = spoiled_file(tmp_path / "day_1", n_lines=30_000, seed=1)
    (tmp_path / "day_1").write_bytes((tmp_path / "day_1").read_bytes().split(b"\n", 1)[1])  # drop line 1
    first = min(n for lines in bad.values() for n in lines if n > 1) - 1
    kind = next(k for k, lines in bad.items() if first + 1 in lines)
    with pytest.raises(data.BadLineError, match=f"^day_1 line {first:,}: ") as refused:
        data.from_criteo(tmp_path / "day_1", tmp_path / "out.parquet", strict=True)
    assert data.criteo_parse.BAD_KIND_TEXT[kind] in str(refused.value) and "\n" not in str(refused.value)
    assert list(tmp_path.iterdir()) == [tmp_path / "day_1"]  # no output, no partial file
    with pytest.raises(data.BadLineError, match="line 2: a label"):
        (tmp_path / "two.tsv").write_text(GOOD + "\n" + GOOD.replace("1", "2", 1) + "\n")
        data.read_criteo_tsv(tmp_path / "two.tsv")  # in memory: strict by default


def test_row_groups_come_in_a_multiple_of_24_and_hold_every_row_in_order(tmp_path):
    logs = data.make_click_logs(10_007, seed=2)
    data.write_criteo_tsv(logs, tmp_path / "d.tsv", hashed_ids=False)
    report = data.from_criteo(tmp_path / "d.tsv", tmp_path / "d.parquet", buckets=16384, rows_per_group=1000)
    info = data.parquet_info(tmp_path / "d.parquet")
    assert info["row_groups"] == report.row_groups == 24 and report.group_note == ""
    assert info["rows_per_group"][:8] == [1000] * 8 and sum(info["rows_per_group"]) == 10_007
    np.testing.assert_array_equal(data.read_parquet(tmp_path / "d.parquet").sparse, logs.sparse)
    tiny = data.from_criteo(tmp_path / "d.tsv", tmp_path / "tiny.parquet", buckets=16384, max_rows=5)
    assert (tiny.rows, tiny.row_groups, tiny.lines) == (5, 5, 5) and "not a multiple of 24" in tiny.group_note


def test_train_and_test_with_the_same_settings_get_the_same_tables(tmp_path):
    for name, rows in (("train", 40_000), ("test", 2_000)):
        data.write_criteo_tsv(data.make_click_logs(rows, seed=rows), tmp_path / f"{name}.tsv")
    train = data.from_criteo(tmp_path / "train.tsv", tmp_path / "train.parquet")
    assert train.cardinalities == (default_buckets(40_000)[0],) * 26 == (1024,) * 26
    assert "the default for about" in str(train) and "--like train.parquet" in str(train)
    test = data.from_criteo(tmp_path / "test.tsv", tmp_path / "test.parquet", like=tmp_path / "train.parquet")
    assert test.cardinalities == train.cardinalities
    assert (
        data.check_same_tables(tmp_path / "train.parquet", tmp_path / "test.parquet") == train.cardinalities
    )
    data.from_criteo(tmp_path / "test.tsv", tmp_path / "other.parquet", buckets=4096)
    with pytest.raises(
        ValueError,
        match=r"other.parquet was written for other tables \(26 x 4,096 rows\) than "
        r"train.parquet \(26 x 1,024 rows\).*--like",
    ):
        data.check_same_tables(tmp_path / "train.parquet", tmp_path / "other.parquet")


class _SlowToClose:
    """A raw file whose ``close()`` takes a while and which records a ``tell()`` made during it."""

    def __init__(self, raw):
        self.raw, self.closing, self.told_while_closing = raw, threading.Event(), False

    def read(self, size=-1):
        return self.raw.read(size)

    @property
    def closed(self):
        return self.raw.closed

    def tell(self):
        self.told_while_closing |= self.closing.is_set() and not self.raw.closed
        return self.raw.tell()

    def close(self):
        self.closing.set()
        time.sleep(0.3)  # the window in which another thread's tell() would race the close
        self.raw.close()


def test_progress_read_from_another_thread_never_races_the_readers_close(tmp_path, monkeypatch):
    """The converter reads on a thread of its own and the progress bar asks ``position()`` from the
    main one: a ``tell()`` while the reading thread closes the file can fail with EBADF (it did, on
    CI) or read another file's position. ``position()`` waits for the close and gives the size."""
    path = tmp_path / "day.tsv"
    data.write_criteo_tsv(data.make_click_logs(200, seed=0), path)
    opened, is_open = [], threading.Event()

    def open_slow(p):
        opened.append(_SlowToClose(open(p, "rb")))
        is_open.set()
        return opened[-1], opened[-1]

    reader = criteo_read.CriteoReader(path)  # it opens the file once to check its format
    monkeypatch.setattr(criteo_read, "_open_bytes", open_slow)
    thread = threading.Thread(target=lambda: list(reader))
    thread.start()
    assert is_open.wait(10) and opened[0].closing.wait(10), "the reader did not reach its close"
    assert reader.position() == reader.size
    thread.join(10)
    assert not opened[0].told_while_closing, (
        "position() asked tell() while the reading thread closed the file"
    )


def test_default_buckets_follow_the_input_size():
    assert default_buckets(20_000)[0] == 1024  # at least 1,024
    assert default_buckets(1_000_000)[0] == 32768  # one per 32 lines, a power of two
    assert default_buckets(195_000_000)[0] == 1 << 20  # at most 1,048,576 (a 1TB day)


def write(path, content: bytes):
    path.write_bytes(content)
    return path


@pytest.mark.parametrize(
    "content, says",
    [
        (b"", "is empty"),
        (b"1,2,3\n0,4,5\n", "not tab-separated: its first line has no tab but 2 commas"),
        ("\t".join(["1"] * 39).encode() + b"\n", "most have 39) (Kaggle's test.txt"),
        (b"PAR1....PAR1", "a parquet file, not Criteo text"),
        (b"BZh91AY&SY", "bzip2-compressed: decompress it first"),
        (b"PK\x03\x04rest", "a zip archive"),
        (gzip.compress(b"", mtime=0), "is empty"),
        ("cut gzip", "is not a whole gzip file (Compressed file ended before the end-of-stream marker"),
    ],
)
def test_a_file_that_is_not_criteos_format_gets_one_line(tmp_path, content, says):
    if content == "cut gzip":  # a download cut short: its start reads well, its end is missing
        data.write_criteo_tsv(data.make_click_logs(5000, seed=0), tmp_path / "whole.gz")
        content = (tmp_path / "whole.gz").read_bytes()
        content = content[: len(content) // 2]
    path = write(tmp_path / "day_5", content)
    with pytest.raises(ValueError) as refused:
        data.from_criteo(path, tmp_path / "out.parquet")
    message = str(refused.value)
    assert says in message and message.startswith("day_5 ") and "\n" not in message
    assert not list(tmp_path.glob("out.parquet*"))  # no output, no partial file


def test_a_directory_or_a_missing_file_gets_one_line(tmp_path):
    with pytest.raises(ValueError, match="is a directory: give the day files in it"):
        data.from_criteo(tmp_path, tmp_path / "out.parquet")
    with pytest.raises(FileNotFoundError, match="no such file. This course never downloads Criteo"):
        data.from_criteo(tmp_path / "day_9.gz", tmp_path / "out.parquet")


def test_a_criteo_file_where_parquet_belongs_names_from_criteo(tmp_path):
    """The loaders, the job's data files and `data info` get the command that converts it."""
    tsv = write(tmp_path / "day_0.txt", ((GOOD + "\n") * 10).encode())
    gz = write(tmp_path / "day_0.gz", gzip.compress(tsv.read_bytes()))
    for path in (tsv, gz):
        with pytest.raises(ValueError) as refused:
            data.check_parquet_file(path)
        message = str(refused.value)
        assert (
            f"python -m course_utils.workload.data from-criteo {path} --out {tmp_path / 'day_0.parquet'}"
            in message
        )
        assert "\n" not in message
        for reader in (data.parquet_info, data.read_parquet, lambda p: data.ParquetBatches(p, 4)):
            with pytest.raises(ValueError, match="from-criteo"):
                reader(path)
    with pytest.raises(ValueError, match="is empty, not a parquet file"):
        data.check_parquet_file(write(tmp_path / "x.parquet", b""))


def test_the_data_command_line_says_one_line_and_exits_2(tmp_path, capsys):
    tsv = write(tmp_path / "day_0.txt", ((GOOD + "\n") * 10).encode())
    assert cli.main(["info", str(tsv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "from-criteo" in err
    assert cli.main(["from-criteo", str(tsv), "--out", str(tmp_path / "d.parquet"), "--buckets", "64"]) == 0
    out = capsys.readouterr().out
    assert "10 lines read, 10 rows written to d.parquet" in out and "lines/s" in out
    assert cli.main(["info", str(tmp_path / "d.parquet")]) == 0
    assert "tables: 26 x 64 rows" in capsys.readouterr().out
    assert cli.main(["from-criteo", str(tmp_path), "--out", str(tmp_path / "e.parquet")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
