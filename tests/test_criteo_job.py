"""Criteo files into the production job: `from-criteo` from a shell on a training and a test file,
then `torchrun ... train_hybrid --data --test-data` trains on them and prints its AUC; a Criteo
file given to `--data` is refused with the from-criteo command. Starts processes throughout."""

import os
import subprocess
import sys

import pytest

from course_utils.workload import data

pytestmark = [pytest.mark.chapter(1, 8), pytest.mark.launches]


def shell(*args: str, cwd, timeout: float = 240) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def job(*args: str, cwd) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc-per-node 2 -m course_utils.scripts.train_hybrid ARGS``."""
    torchrun = ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    return shell(*torchrun, "-m", "course_utils.scripts.train_hybrid", *args, cwd=cwd)


@pytest.fixture(scope="module")
def criteo_files(tmp_path_factory):
    """A day of 50,000 lines and a gzipped test day of 10,000 in Criteo's format, with a few bad
    lines; both converted with the command line (the test file --like the training file)."""
    folder = tmp_path_factory.mktemp("criteo")
    logs = data.make_click_logs(60_000, seed=0)
    data.write_criteo_tsv(logs[:50_000], folder / "day_0")
    data.write_criteo_tsv(logs[50_000:], folder / "day_1.gz")
    with open(folder / "day_0", "ab") as f:
        f.write(b"2\t1\n" + b"\t".join([b"1"] * 14 + [b"zzzzzzzz"] * 26) + b"\n")  # 2 fields; not hex
    convert = ("-m", "course_utils.workload.data", "from-criteo")
    train = shell(*convert, "day_0", "--out", "train.parquet", cwd=folder)
    test = shell(*convert, "day_1.gz", "--out", "test.parquet", "--like", "train.parquet", cwd=folder)
    return folder, train, test


def test_from_criteo_from_a_shell_reports_what_it_did(criteo_files):
    folder, train, test = criteo_files
    assert train.returncode == 0 and test.returncode == 0, train.stderr + test.stderr
    assert "50,002 lines read, 50,000 rows written to train.parquet in 24 row groups" in train.stdout
    assert (
        "day_0 line 50,001 (2 fields)" in train.stdout and "day_0 line 50,002 (C1 'zzzzzzzz')" in train.stdout
    )
    assert "tables: 26 x 2,048 rows (as in train.parquet)" in test.stdout
    assert "lines/s" in train.stdout and train.stderr == ""  # no progress lines: stderr is not a terminal


def test_train_hybrid_trains_on_converted_criteo_files_and_prints_its_auc(criteo_files):
    folder = criteo_files[0]
    run = job(
        "--data",
        "train.parquet",
        "--test-data",
        "test.parquet",
        "--steps",
        "20",
        "--checkpoint-dir",
        "ck",
        cwd=folder,
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    auc = float(next(line for line in run.stdout.splitlines() if line.startswith("auc ")).split()[1])
    assert 0.55 < auc < 0.85, auc  # learned something in 20 steps; below the Bayes-optimal 0.85


def test_a_criteo_file_given_to_data_is_refused_naming_from_criteo(criteo_files):
    """The message each rank raises; the job's one-line report of it is train_hybrid's part."""
    folder = criteo_files[0]
    run = job(
        "--data",
        "day_0",
        "--test-data",
        "test.parquet",
        "--steps",
        "2",
        "--checkpoint-dir",
        "ck2",
        cwd=folder,
    )
    assert run.returncode != 0
    expected = (
        "day_0 is Criteo text (tab-separated), not parquet: convert it first: "
        "python -m course_utils.workload.data from-criteo day_0 --out day_0.parquet"
    )
    assert expected in run.stdout + run.stderr
