"""Appendix 08a: the production job's Kubernetes manifest (a JobSet) and checkpoints in object storage.

The manifest is checked against the JobSet CRD's published schema (vendored) and the official
Python client's models, and each planted mistake must fail that check. The job's checkpoint state
goes through DCP's fsspec storage to a local S3 (moto's server on 127.0.0.1) and back, bit for bit,
on 2 ranks; the server is gone afterwards. The job itself, run with the manifest's own arguments
(its ``--checkpoint-url``, the local bucket for the manifest's), checkpoints under that prefix in
the bucket and a second run resumes from there.
"""

from __future__ import annotations

import copy
import json
import os
import re
import socket
import urllib.request

import pytest

from course_utils import launch
from course_utils.checkpoint import object_store
from course_utils.runtime import elastic_run
from course_utils.runtime import kubernetes_manifest as km

pytestmark = pytest.mark.chapter(8)


def _pod(manifest: dict) -> dict:
    return manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def test_the_manifest_validates_and_holds_what_the_job_needs():
    manifest = km.load()
    assert km.errors(manifest) == []
    assert manifest["spec"]["network"] == {
        "enableDNSHostnames": True,
        "subdomain": "dlrm-hybrid",
        "publishNotReadyAddresses": True,
    }
    job = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == 0 and job["completionMode"] == "Indexed"
    pod = _pod(manifest)
    (trainer,) = pod["containers"]
    script = trainer["args"][0]
    assert "exec torchrun" in script and "--rdzv-backend c10d" in script
    assert f"--nnodes {job['parallelism']} " in script and job["parallelism"] == job["completions"]
    shutdown = int(re.search(r"--shutdown-timeout (\d+)", script)[1])
    assert pod["terminationGracePeriodSeconds"] > shutdown  # torchrun's SIGKILL comes before the kubelet's
    gpus = trainer["resources"]["limits"]["nvidia.com/gpu"]
    assert f"--nproc-per-node {gpus} " in script
    dshm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert dshm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in trainer["volumeMounts"]
    env = {e["name"]: e for e in trainer["env"]}
    assert "jobset.sigs.k8s.io/coordinator" in env["COORDINATOR"]["valueFrom"]["fieldRef"]["fieldPath"]
    # checkpoints in the bucket, one prefix per JobSet (the same for every pod and restart)
    assert "jobset.sigs.k8s.io/jobset-uid" in env["JOBSET_UID"]["valueFrom"]["fieldRef"]["fieldPath"]
    module, arguments = km.job_command(manifest)
    assert module == "course_utils.scripts.train_hybrid"
    assert arguments == [
        "--checkpoint-url",
        "s3://your-bucket/dlrm-hybrid/$JOBSET_UID",
        "--checkpoint-dir",
        "/shared/$JOBSET_UID",
    ]
    # the store's endpoint and keys from a Secret, under the names s3fs (botocore) reads
    secret = {name: env[name]["valueFrom"]["secretKeyRef"] for name in env if name.startswith("AWS_")}
    assert set(secret) == {"AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
    assert {s["name"] for s in secret.values()} == {"dlrm-hybrid-s3"}
    assert secret["AWS_ENDPOINT_URL_S3"].get("optional") is True  # AWS itself: the SDK's default
    assert not any(s.get("optional") for name, s in secret.items() if name != "AWS_ENDPOINT_URL_S3")
    # the --checkpoint-dir (events, synthetic data) on the volume every pod mounts
    shared = next(v for v in pod["volumes"] if v["name"] == "shared")
    assert "persistentVolumeClaim" in shared
    assert {"name": "shared", "mountPath": "/shared"} in trainer["volumeMounts"]


PLANTED = {
    "a JobSet field misspelt": (lambda m: m["spec"]["failurePolicy"].update(maxRestart=3), "maxRestart"),
    "a field in the wrong object": (
        lambda m: _pod(m)["containers"][0].update(terminationGracePeriodSeconds=120),
        "containers.0.terminationGracePeriodSeconds: Extra inputs",
    ),
    "an emptyDir field that does not exist": (
        lambda m: _pod(m)["volumes"][0]["emptyDir"].update(size="16Gi"),
        "emptyDir.size: Extra inputs",
    ),
    "a required field missing": (
        lambda m: _pod(m)["containers"][0].pop("name"),
        "containers.0.name: Field required",
    ),
    "a wrong type": (
        lambda m: m["spec"]["replicatedJobs"][0].update(replicas="two"),
        "replicas: 'two' is not",
    ),
    "another kind": (lambda m: m.update(kind="PyTorchJob"), "apiVersion/kind"),
}


@pytest.mark.parametrize("mistake", PLANTED)
def test_a_planted_mistake_fails_validation(mistake):
    plant, said = PLANTED[mistake]
    manifest = copy.deepcopy(km.load())
    plant(manifest)
    found = km.errors(manifest)
    assert len(found) == 1 and said in found[0], found


def test_the_vendored_schema_names_its_source():
    vendored = json.loads(km.template_path("jobset_v1alpha2_schema.json").read_text())
    assert "kubernetes-sigs/jobset/blob/v0.12.0/" in vendored["$comment"]
    assert (vendored["group"], vendored["version"], vendored["kind"]) == (
        "jobset.x-k8s.io",
        "v1alpha2",
        "JobSet",
    )


def test_dcp_takes_an_s3_url_to_its_fsspec_storage():
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter
    from torch.distributed.checkpoint._storage_utils import _storage_setup

    assert type(_storage_setup(None, "s3://bucket/job/step_000010")) is FsspecWriter
    assert type(_storage_setup(None, "s3://bucket/job/step_000010", reader=True)) is FsspecReader


def _listening_addresses(port: int) -> set[str]:
    """The local addresses listening on TCP ``port`` (``/proc/net/tcp`` and ``tcp6``)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in open(table).read().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hex_port = local.split(":")
            if state == "0A" and int(hex_port, 16) == port:
                found.add(address)
    return found


@pytest.mark.launches
def test_the_job_state_round_trips_through_a_local_s3_on_two_ranks():
    before = os.environ.get("AWS_ENDPOINT_URL_S3")
    with object_store.local_s3() as bucket:
        endpoint = os.environ["AWS_ENDPOINT_URL_S3"]
        port = int(endpoint.rsplit(":", 1)[1])
        assert endpoint.startswith("http://127.0.0.1:") and _listening_addresses(port) == {"0100007F"}
        url = f"{bucket}/dlrm-hybrid/step_000002"
        results = launch(object_store.job_state_round_trip, url, world_size=2, timeout=120)
        stored = object_store.objects(url)
    for result in results:
        assert result["equal_after"] == result["entries"] > result["differed_before"] > 0
    assert set(stored) == {".metadata", "__0_0.distcp", "__1_0.distcp"} and min(stored.values()) > 0
    assert os.environ.get("AWS_ENDPOINT_URL_S3") == before and not _listening_addresses(port)
    with pytest.raises(OSError):
        urllib.request.urlopen(endpoint, timeout=5)


def test_the_local_s3_stops_when_the_block_fails():
    with pytest.raises(RuntimeError, match="inside"), object_store.local_s3() as bucket:
        port = int(os.environ["AWS_ENDPOINT_URL_S3"].rsplit(":", 1)[1])
        assert object_store.objects(bucket) == {}
        raise RuntimeError("inside")
    with pytest.raises(OSError), socket.create_connection(("127.0.0.1", port), timeout=5):
        pass


@pytest.mark.launches
def test_the_manifests_checkpoint_url_round_trips_through_fsspec_to_a_local_s3(tmp_path):
    """The job with the manifest's own arguments (``$JOBSET_UID`` a fixed id, the local bucket for
    the manifest's, ``/shared`` a local folder), 2 ranks: its checkpoints land under the
    manifest's prefix in the bucket, and a second run resumes from them."""
    small = ["--checkpoint-every", 2, "--synthetic-rows", 2048, "--batch-size", 128]
    with object_store.local_s3() as bucket:
        url, first = km.run_here(bucket, "jobset-uid-1", tmp_path, ["--steps", 4, *small])
        after_first = sorted(object_store.objects(url))
        _, second = km.run_here(bucket, "jobset-uid-1", tmp_path, ["--steps", 6, *small])
        after_second = sorted(object_store.objects(bucket))
    assert url == f"{bucket}/dlrm-hybrid/jobset-uid-1"
    (command,) = first.commands
    assert f"-m course_utils.scripts.train_hybrid --checkpoint-dir OUT --checkpoint-url {url} " in command
    assert first.out == tmp_path / "shared" / "jobset-uid-1"
    assert after_first == [
        f"step_{s:06d}/{f}" for s in (2, 4) for f in (".metadata", "__0_0.distcp", "__1_0.distcp")
    ]
    assert after_second == [  # the newest two, nothing else in the bucket
        f"dlrm-hybrid/jobset-uid-1/step_{s:06d}/{f}"
        for s in (4, 6)
        for f in (".metadata", "__0_0.distcp", "__1_0.distcp")
    ]
    timeline = elastic_run.timeline(second.events)
    assert "attempt 1: ranks [0, 1] resumed from the checkpoint of step 4" in timeline, timeline
    assert elastic_run.finished(second.events)["step"] == 6
    assert not list(first.out.glob("step_*"))  # the volume: events and data only
