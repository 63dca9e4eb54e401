"""The production job's checkpoints in object storage (``train_hybrid --checkpoint-url s3://...``),
against moto's S3 server on loopback (``object_store.local_s3``): step folders listed, ordered and
pruned there as in a local folder (and a listing never stale); the job run straight and with a
killed rank ends on the parameters of the local-folder run, keeping only its newest two
checkpoints in the bucket; a pickled checkpoint there, and a URL the job cannot use, are refused in
one line before training."""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path

import pytest
import torch

from course_utils.checkpoint import checkpoints, folders, latest_complete, object_store, step_of
from course_utils.checkpoint.folders import prunable
from course_utils.runtime import elastic_run
from course_utils.workload import data

pytestmark = [pytest.mark.chapter(8), pytest.mark.launches]

JOB = dict(module="course_utils.scripts.train_hybrid", out_flag="--checkpoint-dir", timeout=240)


def _forget_file_systems() -> None:
    """fsspec keeps one S3 file system per set of options for the life of the process, connected to
    the endpoint of its time: each local_s3 (a new port) starts and ends without them."""
    import fsspec

    fsspec.get_filesystem_class("s3").clear_instance_cache()


@pytest.fixture(scope="module")
def bucket():
    """``s3://checkpoints`` on a local S3 server, for the module (it restores the environment)."""
    _forget_file_systems()
    try:
        with object_store.local_s3() as url:
            yield url
    finally:
        _forget_file_systems()


def finished(run) -> dict:
    """Rank 0's "finished" event of the run's last attempt: ``step``, ``auc``, ``sha256``."""
    ends = [e for e in run.events if e["event"] == "finished" and e["rank"] == 0]
    assert ends, "\n".join(elastic_run.timeline(run.events)) + run.stderr[0][-2000:]
    return ends[-1]


def _layout(root, complete: list[int], incomplete: list[int]) -> None:
    """``step_<N>`` folders under ``root`` (a local folder or a URL), complete ones with a
    ``.metadata``, and two entries that are no checkpoint."""
    root = folders.location(root)
    files = [root / f"step_{s:06d}" / ".metadata" for s in complete]
    files += [root / f"step_{s:06d}" / "__0_0.distcp" for s in incomplete]
    files += [root / "step_abc" / ".metadata", root / "data" / "train.parquet"]
    for file in files:
        if not folders.is_url(root):
            file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(b"")


def _answers(root) -> tuple:
    done, unfinished = checkpoints(root)
    return (
        [p.name for p in done],
        [p.name for p in unfinished],
        latest_complete(root).name,
        [p.name for p in prunable(root, keep=1)],
    )


def test_step_folders_at_a_url_are_listed_ordered_and_pruned_as_in_a_local_folder(bucket, tmp_path):
    url = f"{bucket}/listing"
    for root in (tmp_path, url):
        _layout(root, complete=[9, 1_000_000], incomplete=[10])
    expected = (
        ["step_000009", "step_1000000"],
        ["step_000010"],
        "step_1000000",
        ["step_000009", "step_000010"],
    )
    assert _answers(tmp_path) == _answers(url) == expected
    assert all(type(p) is type(tmp_path) for p in checkpoints(tmp_path)[0])  # local: pathlib paths
    assert str(latest_complete(url)) == f"{url}/step_1000000"
    assert checkpoints(f"{bucket}/nothing_yet") == ([], [])

    # another writer (another process, as another rank is) completes step 10 and writes step 11:
    # seen at once (a cached listing of the folder would miss step_000011)
    import fsspec

    other, _ = fsspec.url_to_fs(url, skip_instance_cache=True)
    other.pipe({f"{url}/step_{s:06d}/.metadata": b"" for s in (10, 11)})
    assert [step_of(p) for p in checkpoints(url)[0]] == [9, 10, 11, 1_000_000]
    for old in prunable(url, keep=1):
        folders.remove(old)
    assert sorted(object_store.objects(url)) == [
        "data/train.parquet",
        "step_1000000/.metadata",
        "step_abc/.metadata",
    ]


def test_the_job_checkpoints_to_a_bucket_and_resumes_from_it_on_the_local_runs_parameters(bucket, tmp_path):
    local = elastic_run.run_elastic(tmp_path / "local", script_args=["--steps", 40], **JOB)
    runs = {}
    for name, kill in (("straight", []), ("killed", ["--kill-rank", 1, "--kill-at-step", 21])):
        url = f"{bucket}/{name}"
        runs[name] = elastic_run.run_elastic(
            tmp_path / name, script_args=["--steps", 40, "--checkpoint-url", url, *kill], **JOB
        )
        assert sorted({key.split("/")[0] for key in object_store.objects(url)}) == [
            "step_000030",
            "step_000040",
        ]  # the newest two: the older ones were deleted in the bucket
        assert not list((tmp_path / name).glob("step_*"))  # the local folder: events and data only
    timeline = elastic_run.timeline(runs["killed"].events)
    assert "attempt 1: ranks [0, 1] resumed from the checkpoint of step 20" in timeline, timeline
    assert finished(runs["straight"])["sha256"] == finished(local)["sha256"]
    assert finished(runs["killed"])["sha256"] == finished(local)["sha256"]


class _Canary:
    """Unpickled, it creates ``path``: the proof that loading ran code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (Path.touch, (Path(self.path),))


def _one_line(code: int, capsys) -> str:
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1 and err.startswith("train_hybrid: "), err
    return err


def test_a_pickled_checkpoint_in_the_bucket_is_refused_in_one_line_and_nothing_runs(
    bucket, tmp_path, job_main, capsys
):
    import torch.distributed.checkpoint as dcp

    logs = data.make_click_logs(960, seed=0)
    data.write_parquet(logs, tmp_path / "train.parquet", 8)
    data.write_parquet(logs[:480], tmp_path / "test.parquet", 4)
    tables = {f"model/embeddings.table{t}": torch.zeros(n, 16) for t, n in enumerate(logs.cardinalities)}
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore")  # DCP in one process, without a process group
        dcp.save(
            {**tables, "rng/rank0": _Canary(tmp_path / "ran")}, checkpoint_id=f"{bucket}/pickled/step_000010"
        )
        dcp.save(tables, checkpoint_id=f"{bucket}/foreign/step_000010")
    folders.location(f"{bucket}/foreign/step_000010/.metadata").write_bytes(
        pickle.dumps(_Canary(tmp_path / "ran"))
    )
    data_args = ["--data", str(tmp_path / "train.parquet"), "--test-data", str(tmp_path / "test.parquet")]
    for name, said in (
        ("pickled", "holds 1 pickled value(s) (rng/rank0), which this job never writes"),
        ("foreign", "Path.touch, which DCP's metadata never holds"),
    ):
        url = f"{bucket}/{name}"
        argv = ["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-url", url, *data_args]
        err = _one_line(job_main(argv), capsys)
        assert err.startswith(f"train_hybrid: --checkpoint-url: {url}/step_000010") and said in err, err
        assert name == "foreign" or err.endswith("(or a new --checkpoint-url)\n"), err
    assert not (tmp_path / "ran").exists() and not (tmp_path / "ck").exists()


@pytest.mark.parametrize(
    "url, said",
    [
        ("nosuch://x/job", "--checkpoint-url nosuch://x/job: Protocol not known: nosuch"),
        ("s3://no-such-bucket/job", "the bucket 'no-such-bucket' does not exist"),
        ("relative/job", "--checkpoint-url relative/job is not a URL"),
    ],
)
def test_a_url_the_job_cannot_use_is_refused_in_one_line(url, said, bucket, tmp_path, job_main, capsys):
    err = _one_line(job_main(["--checkpoint-dir", str(tmp_path / "ck"), "--checkpoint-url", url]), capsys)
    assert said in err, err
    assert not (tmp_path / "ck").exists()
