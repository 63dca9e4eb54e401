"""Bad input to the production job gets one line, once, exit code 2: a table of bad inputs, each run
through the job's own ``main`` (the checks come before any process group), then two of them under
the real torchrun (one line from rank 0, torchrun's summary naming it) and one without torchrun.
A checkpoint holding a pickled object, or a ``.metadata`` naming foreign code, is refused on load,
and nothing in it runs."""

from __future__ import annotations

import gzip
import os
import pickle
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from course_utils.checkpoint import safe_load
from course_utils.runtime import elastic_run, runner, stderr_report
from course_utils.workload import data

pytestmark = pytest.mark.chapter(8)

ROWS = 960  # 8 row groups of 120 rows


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Small data files, good and bad."""
    root = tmp_path_factory.mktemp("bad_input")
    logs = data.make_click_logs(ROWS, seed=0)
    data.write_parquet(logs, root / "train.parquet", 8)
    data.write_parquet(logs[:480], root / "test.parquet", 4)
    data.write_parquet(logs, root / "three.parquet", 3)
    data.write_parquet(logs[:480], root / "one.parquet", 1)
    other = data.make_click_logs(480, seed=1, cardinalities=[c + 1 for c in logs.cardinalities])
    data.write_parquet(other, root / "other_tables.parquet", 4)
    (root / "day_0.txt").write_text("\t".join(["1"] + ["5"] * 13 + ["68fd1e64"] * 26) + "\n")
    (root / "day_0.gz").write_bytes(gzip.compress((root / "day_0.txt").read_bytes()))
    (root / "empty.parquet").write_bytes(b"")
    pq.write_table(pa.table({"x": [1, 2]}), root / "foreign.parquet")  # parquet, not write_parquet's
    (root / "a_file").write_text("not a folder")
    (root / "folder.parquet").mkdir()
    return root


def _checkpoint(folder: Path, entries: dict) -> Path:
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        dcp.save(entries, checkpoint_id=str(folder / "step_000010"))
    return folder


class _Canary:
    """Unpickled, it creates ``path``: the proof that loading ran code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


@pytest.fixture(scope="module")
def checkpoints(files, tmp_path_factory):
    """Checkpoint folders the job must refuse: another job's tables, a pickled value, foreign metadata."""
    root = tmp_path_factory.mktemp("ckpts")
    cards = data.parquet_info(files / "train.parquet")["cardinalities"]
    tables = {f"model/embeddings.table{t}": torch.zeros(n, 16) for t, n in enumerate(cards)}
    other = len(tables["model/embeddings.table0"]) + 1
    _checkpoint(root / "other_job", {**tables, "model/embeddings.table0": torch.zeros(other, 16)})
    _checkpoint(root / "pickled", {**tables, "rng/rank0": _Canary(root / "ran")})
    foreign = _checkpoint(root / "foreign_metadata", tables) / "step_000010" / ".metadata"
    foreign.write_bytes(pickle.dumps(_Canary(root / "ran")))
    return root


# (what is wrong, the job's arguments, the text its one line must hold); {f}: the files, {c}: checkpoints
BAD_INPUTS = [
    (
        "a batch the ranks cannot share",
        "--batch-size 513",
        "cannot be split equally over 2 ranks; use a multiple of 2",
    ),
    ("no steps", "--steps 0", "--steps must be at least 1, got 0"),
    ("an unknown sharding", "--sharding rowwise", "invalid choice: 'rowwise'"),
    ("a number that is not one", "--batch-size many", "argument --batch-size: invalid int value: 'many'"),
    ("an unknown option", "--epochs 3", "unrecognized arguments: --epochs 3"),
    ("no checkpoint folder", "!--steps 2", "the following arguments are required: --checkpoint-dir"),
    ("a learning rate of 0", "--lr 0", "--lr must be a positive learning rate, got 0.0"),
    ("too few synthetic rows", "--synthetic-rows 10", "--synthetic-rows must be at least 96, got 10"),
    (
        "a rank to kill that does not exist",
        "--kill-rank 5 --kill-at-step 3",
        "--kill-rank 5 is not a rank of this job",
    ),
    ("data without test data", "--data {f}/train.parquet", "--data needs --test-data too"),
    (
        "a missing --data",
        "--data {f}/nope.parquet --test-data {f}/test.parquet",
        "nope.parquet: no such parquet file; write one with write_parquet or from-criteo",
    ),
    (
        "a folder as --data",
        "--data {f}/folder.parquet --test-data {f}/test.parquet",
        "--data: folder.parquet is a directory",
    ),
    (
        "an empty --data",
        "--data {f}/empty.parquet --test-data {f}/test.parquet",
        "--data: empty.parquet is empty, not a parquet file",
    ),
    (
        "Criteo's TSV as --data",
        "--data {f}/day_0.txt --test-data {f}/test.parquet",
        "--data: day_0.txt is Criteo text (tab-separated), not parquet: convert it first: "
        "python -m course_utils.workload.data from-criteo",
    ),
    (
        "a gzipped file as --data",
        "--data {f}/day_0.gz --test-data {f}/test.parquet",
        "--data: day_0.gz is gzipped Criteo text, not parquet: convert it first: "
        "python -m course_utils.workload.data from-criteo",
    ),
    (
        "another program's parquet",
        "--data {f}/foreign.parquet --test-data {f}/test.parquet",
        "--data: foreign.parquet has no table sizes in its metadata",
    ),
    (
        "row groups the ranks cannot share",
        "--data {f}/three.parquet --test-data {f}/test.parquet",
        "three.parquet has 3 row groups, not a multiple of the 2 ranks (each reads whole row groups); "
        "repartition it: python -m course_utils.workload.data repartition",
    ),
    (
        "a test file of one row group",
        "--data {f}/train.parquet --test-data {f}/one.parquet",
        "one.parquet has 1 row group, not a multiple of the 2 ranks",
    ),
    (
        "train and test tables of other sizes",
        "--data {f}/train.parquet --test-data {f}/other_tables.parquet",
        "--data and --test-data: other_tables.parquet was written for other tables",
    ),
    (
        "a batch larger than a rank's data",
        "--data {f}/train.parquet --test-data {f}/test.parquet --batch-size 2048",
        "--batch-size 2048 needs 1024 rows per rank per step, and a rank's share of --data",
    ),
    ("a file as --checkpoint-dir", "!--checkpoint-dir {f}/a_file", "a_file is a file, not a folder"),
    (
        "a checkpoint URL of a scheme fsspec does not know",
        "--checkpoint-url nosuch://x/job",
        "--checkpoint-url nosuch://x/job: Protocol not known: nosuch; pass a URL fsspec knows",
    ),
    ("a local path as --checkpoint-url", "--checkpoint-url ck2", "--checkpoint-url ck2 is not a URL"),
    ("a folder under a file", "!--checkpoint-dir {f}/a_file/ck", "a_file is a file, not a folder"),
    (
        "another job's checkpoints",
        "!--checkpoint-dir {c}/other_job --data {f}/train.parquet --test-data {f}/test.parquet",
        "holds checkpoints of another job (step_000010: table 0 ",
    ),
    (
        "a checkpoint with a pickled object",
        "!--checkpoint-dir {c}/pickled --data {f}/train.parquet --test-data {f}/test.parquet",
        "holds 1 pickled value(s) (rng/rank0), which this job never writes",
    ),
    (
        "a checkpoint naming foreign code",
        "!--checkpoint-dir {c}/foreign_metadata --data {f}/train.parquet --test-data {f}/test.parquet",
        "Path.touch, which DCP's metadata never holds",  # pathlib._local.Path on Python 3.13
    ),
]


def _argv(spec: str, files: Path, checkpoints: Path, tmp_path: Path) -> list[str]:
    own = spec.startswith("!")  # the case gives its own --checkpoint-dir (or none)
    words = spec.lstrip("!").format(f=files, c=checkpoints).split()
    return words if own else ["--checkpoint-dir", str(tmp_path / "ck"), *words]


@pytest.mark.parametrize("what, spec, said", BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_each_bad_input_gets_one_line_once_and_exit_code_2(
    what, spec, said, files, checkpoints, tmp_path, job_main, capsys
):
    code = job_main(_argv(spec, files, checkpoints, tmp_path), rank=0)
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("train_hybrid: ") and said in err, err
    assert not (checkpoints / "ran").exists()  # nothing in a checkpoint ran
    assert job_main(_argv(spec, files, checkpoints, tmp_path), rank=1) == 2  # rank 1: the same verdict...
    assert capsys.readouterr() == ("", "")  # ...in silence
    assert not (tmp_path / "ck").exists()  # refused before anything was written


def test_a_bad_course_cluster_gets_one_line_naming_the_presets(job_main, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("COURSE_CLUSTER", "nvlink")
    assert job_main(["--checkpoint-dir", str(tmp_path / "ck")], rank=0) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith("train_hybrid: COURSE_CLUSTER='nvlink' is not a cluster") and "h100:nvlink" in err
    assert not (tmp_path / "ck").exists()


def test_the_table_has_at_least_15_bad_inputs():
    assert len(BAD_INPUTS) >= 15 and len({b[0] for b in BAD_INPUTS}) == len(BAD_INPUTS)


def test_a_checkpoint_holding_a_pickled_object_is_refused_on_load_and_nothing_runs(checkpoints):
    folder = checkpoints / "pickled" / "step_000010"
    state = {"rng/rank0": b""}
    with pytest.raises(
        safe_load.CheckpointRefused, match=r"entry 'rng/rank0' of the checkpoint is a pickled object"
    ):
        safe_load.load(state, folder)
    with pytest.raises(safe_load.CheckpointRefused, match=r"names pathlib(\._local)?\.Path\.touch"):
        safe_load.load({}, checkpoints / "foreign_metadata" / "step_000010")
    assert not (checkpoints / "ran").exists()
    # what torch's own loader does with the same folder: it runs the pickle
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")
        dcp.load({"rng/rank0": b""}, checkpoint_id=str(folder))
    assert (checkpoints / "ran").exists()
    (checkpoints / "ran").unlink()


# --- under the real torchrun ---------------------------------------------------------------


JOB = dict(
    module="course_utils.scripts.train_hybrid", out_flag="--checkpoint-dir", timeout=120, max_restarts=0
)


@pytest.mark.launches
def test_under_torchrun_rank_0_says_it_once_and_torchruns_summary_names_it(tmp_path):
    with pytest.raises(runner.LauncherError) as error:
        elastic_run.run_elastic(tmp_path, script_args=["--steps", 2, "--batch-size", 511], **JOB)
    said = "--batch-size 511 (rows per step over all ranks) cannot be split equally over 2 ranks"
    lines = error.value.stderr.splitlines()
    before_torchruns_report = lines[: lines.index("Traceback (most recent call last):")]
    # the job's own output: one line, from rank 0 (the rest are torchrun's log lines, "W1128 ...")
    job_said = [ln for ln in before_torchruns_report if not stderr_report.C10_PREFIX.match(ln)]
    assert len(job_said) == 1 and job_said[0].startswith(f"train_hybrid: {said}")
    root_cause = error.value.stderr.split("Root Cause")[1]
    assert f"JobInputError: {said}" in root_cause and "exitcode  : 2" in root_cause  # @record named it


LATE_RANK_0 = """import os, runpy, time
if os.environ["RANK"] == "0":
    time.sleep({seconds})  # as a rank on a busy machine, still importing when the others are done
runpy.run_module("course_utils.scripts.train_hybrid", run_name="__main__", alter_sys=True)
"""


@pytest.mark.launches
def test_rank_0_still_says_it_when_the_other_ranks_found_it_long_before(tmp_path, monkeypatch):
    """The other ranks wait for rank 0 (torchrun would stop a late rank 0 before it says anything)."""
    (tmp_path / "late").mkdir()
    (tmp_path / "late" / "train_hybrid_late_rank_0.py").write_text(LATE_RANK_0.format(seconds=8))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tmp_path / "late"), *sys.path]))
    job = {**JOB, "module": "train_hybrid_late_rank_0"}
    with pytest.raises(runner.LauncherError) as error:
        elastic_run.run_elastic(tmp_path / "out", script_args=["--steps", 2, "--batch-size", 511], **job)
    said = "--batch-size 511 (rows per step over all ranks) cannot be split equally over 2 ranks"
    assert error.value.stderr.count(f"train_hybrid: {said}") == 1
    assert f"JobInputError: {said}" in error.value.stderr.split("Root Cause")[1]


@pytest.mark.launches
def test_a_folder_of_another_synthetic_job_is_refused_once_its_data_is_known(tmp_path):
    """Found after the process group started (the job writes its synthetic data first): still one line."""
    elastic_run.run_elastic(tmp_path, script_args=["--steps", 2, "--checkpoint-every", 1], **JOB)
    shutil.rmtree(tmp_path / "data")  # its data replaced by a data set with other tables
    logs = data.make_click_logs(960, seed=0, cardinalities=[7] * 26)
    data.write_parquet(logs[:768], tmp_path / "data" / "train.parquet", 24)
    data.write_parquet(logs[768:], tmp_path / "data" / "test.parquet", 24)
    with pytest.raises(runner.LauncherError) as error:
        elastic_run.run_elastic(tmp_path, script_args=["--steps", 4], **JOB)
    said = f"--checkpoint-dir {tmp_path} holds checkpoints of another job (step_000002: table 0 "
    assert error.value.stderr.count(f"train_hybrid: {said}") == 1
    assert f"JobInputError: {said}" in error.value.stderr.split("Root Cause")[1]


@pytest.mark.launches
def test_without_torchrun_it_says_to_use_torchrun(tmp_path):
    env = {
        k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    }
    done = subprocess.run(
        [sys.executable, "-m", "course_utils.scripts.train_hybrid", "--checkpoint-dir", str(tmp_path / "ck")],
        capture_output=True,
        text=True,
        env={**env, **runner._pythonpath()},
        timeout=120,
    )
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        "train_hybrid: this is a torchrun script and RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT are not set: "
        "start it with torchrun --standalone --nproc-per-node 2 -m course_utils.scripts.train_hybrid ..."
    ]
    assert not (tmp_path / "ck").exists()


def test_a_metadata_naming_a_path_loads_on_every_python(tmp_path):
    """DCP's ``.metadata`` may hold the folder's path: ``pathlib.PosixPath``, which Python 3.13
    pickles as ``pathlib._local.PosixPath``. Both are data, not code, and load."""
    (tmp_path / ".metadata").write_bytes(pickle.dumps({"where": Path("/some/folder")}))
    assert safe_load.read_metadata(tmp_path) == {"where": Path("/some/folder")}


def test_a_checkpoint_at_a_url_loads_as_data_and_one_holding_a_pickle_is_refused(tmp_path):
    """The same refusals through fsspec (``memory://``: fsspec's in-process store, no server):
    ``read_metadata`` reads the URL's ``.metadata``, the safe reader is DCP's ``FsspecReader``."""
    import torch.distributed.checkpoint as dcp

    url = f"memory://safe_load_{tmp_path.name}"
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")  # DCP in one process, without a process group
        dcp.save({"w": torch.arange(6.0).reshape(2, 3)}, checkpoint_id=f"{url}/good")
        dcp.save({"rng/rank0": _Canary(tmp_path / "ran")}, checkpoint_id=f"{url}/pickled")
    assert type(safe_load.reader_for(f"{url}/good")).__name__ == "SafeFsspecReader"
    assert type(safe_load.reader_for(tmp_path)) is safe_load.SafeReader
    state = {"w": torch.zeros(2, 3)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to load in a single process.*")
        safe_load.load(state, f"{url}/good")
        assert torch.equal(state["w"], torch.arange(6.0).reshape(2, 3))
        assert safe_load.non_tensor_entries(f"{url}/pickled") == ["rng/rank0"]
        with pytest.raises(
            safe_load.CheckpointRefused, match=r"entry 'rng/rank0' of the checkpoint is a pickled"
        ):
            safe_load.load({"rng/rank0": b""}, f"{url}/pickled")
    from course_utils.checkpoint import folders

    folders.location(f"{url}/good/.metadata").write_bytes(pickle.dumps(_Canary(tmp_path / "ran")))
    with pytest.raises(safe_load.CheckpointRefused, match=rf"^{url}/good: its .metadata names pathlib"):
        safe_load.read_metadata(f"{url}/good")
    assert not (tmp_path / "ran").exists()
