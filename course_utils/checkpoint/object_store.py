"""Checkpoints in object storage (S3 and the like) through DCP's fsspec storage, and a local S3.

``dcp.save(state, checkpoint_id="s3://bucket/job/step_000010")`` needs no other code: DCP
chooses its storage from the checkpoint id, and a URL that ``fsspec.core.url_to_fs`` knows goes
to its ``FsspecWriter`` (``dcp.load``: ``FsspecReader``), in
``torch/distributed/checkpoint/_fsspec_filesystem.py``, picked by ``_storage_setup`` in
``_storage_utils.py`` (torch 2.9.1 to 2.15). fsspec hands ``s3://`` to ``s3fs``, which finds the
endpoint and credentials where every AWS SDK looks: ``AWS_ENDPOINT_URL_S3`` (any S3-compatible
store: MinIO, Ceph, a cloud's own), ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``. Each rank
writes its own ``__<rank>_0.distcp`` object, rank 0 the ``.metadata`` last.

:func:`local_s3` runs such a store on this machine: moto's S3 server (``ThreadedMotoServer``)
on ``127.0.0.1`` only, with one bucket, the variables above set while it runs; it is emptied
and stopped in a ``finally``. :func:`job_state_round_trip` is what every rank runs against it: the production
job's checkpoint state (``checkpoint.job.job_state``: sharded tables, MLPs, Adam's state,
progress, random state) saved to a URL and loaded back into another model.

Loading with DCP's own reader unpickles the checkpoint's ``.metadata``: read only from a bucket
that only your jobs can write, or load with ``safe_load``, which reads URLs as data too (the
production job does: ``train_hybrid --checkpoint-url s3://bucket/job``).

Taught in chapter 08 (appendix 08a, Kubernetes).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["local_s3", "objects", "job_state_round_trip"]

#: what the local store answers to: moto accepts any key pair
_TEST_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "local-test",
    "AWS_SECRET_ACCESS_KEY": "local-test",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@contextmanager
def local_s3(bucket: str = "checkpoints") -> Iterator[str]:
    """An S3 server on ``127.0.0.1`` (moto) holding one empty ``bucket``; yields ``"s3://<bucket>"``.
    While it runs, ``AWS_ENDPOINT_URL_S3`` and test credentials are set in ``os.environ`` (ranks
    forked or spawned meanwhile inherit them); on exit the server stops and the variables are
    restored, whatever happened inside."""
    import fsspec
    from moto.server import ThreadedMotoServer

    from course_utils.runtime.ports import free_port

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    port = free_port("127.0.0.1")
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    names = [*_TEST_CREDENTIALS, "AWS_ENDPOINT_URL_S3"]
    before = {name: os.environ.get(name) for name in names}
    endpoint = f"http://127.0.0.1:{port}"
    server.start()
    try:
        _reset(endpoint)  # moto keeps its buckets in this process, from one server to the next
        os.environ.update(_TEST_CREDENTIALS, AWS_ENDPOINT_URL_S3=endpoint)
        fs, _ = fsspec.url_to_fs(f"s3://{bucket}", skip_instance_cache=True)
        fs.mkdir(bucket)
        yield f"s3://{bucket}"
    finally:
        try:
            _reset(endpoint)
        finally:
            server.stop()
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _reset(endpoint: str) -> None:
    """Empty moto's store (its documented ``/moto-api/reset``)."""
    import urllib.request

    urllib.request.urlopen(
        urllib.request.Request(f"{endpoint}/moto-api/reset", method="POST"), timeout=30
    ).close()


def objects(url: str) -> dict[str, int]:
    """Every object under ``url`` (a checkpoint's folder): ``{name relative to url: bytes}``."""
    import fsspec

    fs, root = fsspec.url_to_fs(url, skip_instance_cache=True)
    found = fs.find(root, detail=True)
    return {path[len(root) :].lstrip("/"): info["size"] for path, info in sorted(found.items())}


def _trained_job_state(cardinalities: tuple, seed: int, steps: int) -> tuple[dict, object]:
    """``(job_state, model)``: a row-wise ``HybridDLRM`` seeded with ``seed``, ``steps`` Adam steps on
    seeded synthetic clicks (this rank's rows), and its checkpoint state (``job.job_state``)."""
    import torch
    import torch.distributed as dist

    from course_utils.checkpoint import job
    from course_utils.sharding.hybrid import HybridDLRM
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig
    from course_utils.workload.train import make_optimizer, train_step

    rank, world = dist.get_rank(), dist.get_world_size()
    model = HybridDLRM(DLRMConfig(cardinalities), "row_wise", seed=seed)
    optimizer = make_optimizer(model, "adam", 1e-2)
    logs = data.make_click_logs(64 * steps * world, cardinalities=cardinalities, seed=seed)
    for step in range(steps):
        rows = slice((step * world + rank) * 64, (step * world + rank + 1) * 64)
        batch = data.Batch(
            *(torch.as_tensor(column[rows]) for column in (logs.dense, logs.sparse, logs.label))
        )
        train_step(model, optimizer, batch)
    return job.job_state(model, optimizer, {"step": steps, "epoch": 0}, []), model


def job_state_round_trip(url: str, cardinalities: tuple = (40, 24, 12)) -> dict:
    """Every rank runs this (default process group up): the job's checkpoint state after 2 steps
    of a model seeded 0, saved with ``dcp.save`` to ``url``, then loaded with ``dcp.load`` into the
    state of a model seeded 1 (trained 1 step, so that every entry differs). Returns
    ``{"entries", "differed_before", "equal_after"}``: this rank's entries, how many differed
    before the load, and how many are bit for bit the saved ones after it."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import DTensor

    def local(value):
        return value.to_local() if isinstance(value, DTensor) else value

    def same(a, b):  # bit for bit (a NaN equals itself)
        a, b = local(a).contiguous().reshape(-1), local(b).contiguous().reshape(-1)
        return a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))

    from course_utils.runtime import versions

    versions.quiet_dcp_storage_warning()  # torch 2.9's writer warns about its own storage() call
    saved, _ = _trained_job_state(cardinalities, seed=0, steps=2)
    expected = {k: local(v).clone() for k, v in saved.items()}
    dcp.save(saved, checkpoint_id=url)
    other, _ = _trained_job_state(cardinalities, seed=1, steps=1)
    differed = sum(not same(other[k], expected[k]) for k in expected)
    dcp.load(other, checkpoint_id=url)
    return {
        "entries": len(expected),
        "differed_before": differed,
        "equal_after": sum(same(other[k], expected[k]) for k in expected),
    }
