"""The course's Kubernetes manifest, checked field by field before it meets a cluster.

``templates/kubernetes/jobset_train_hybrid.yaml`` is a JobSet (``jobset.x-k8s.io/v1alpha2``). Two
published schemas check it, and every field must be one they know (as ``kubectl apply`` with the
API server's strict field validation does; a plain ``apply`` would drop an unknown field and go on):

* the JobSet's own fields against the JobSet CRD's ``openAPIV3Schema`` (kubernetes-sigs/jobset
  v0.12.0), vendored beside the manifest with its source (``jobset_v1alpha2_schema.json``) and
  checked with ``jsonschema``, every object closed to the properties it lists (CEL rules,
  ``x-kubernetes-validations``, are the API server's: not checked here);
* each ``replicatedJobs[].template`` (a ``batch/v1`` JobTemplateSpec: the Job, its pod template,
  containers, volumes) with the official Python client's model (``kubernetes.client``,
  ``V1JobTemplateSpec.model_validate``): unknown fields, missing required ones and wrong types
  are refused. The client types resource quantities (``cpu``, ``nvidia.com/gpu``, ``sizeLimit``)
  as strings, so the manifest quotes them (the API server also takes numbers).

:func:`errors` returns one line per problem, ``[]`` for a manifest both accept. :func:`job_command`
reads what the trainer container's ``torchrun`` starts (``-m MODULE ARGS``); :func:`run_here` runs
those arguments on this machine under ``torchrun`` (1 node), the manifest's bucket replaced by a
local one (``checkpoint.object_store.local_s3``) and its volume by a local folder.

Taught in chapter 08 (appendix 08a, Kubernetes).
"""

from __future__ import annotations

import copy
import json
import shlex
from pathlib import Path
from urllib.parse import urlsplit

__all__ = [
    "template_path",
    "load",
    "errors",
    "jobset_errors",
    "job_template_errors",
    "job_command",
    "run_here",
]


def template_path(name: str = "jobset_train_hybrid.yaml") -> Path:
    """``templates/kubernetes/<name>``: a checkout's own file, or the copy a wheel install carries."""
    import importlib.resources

    import course_utils

    in_checkout = Path(course_utils.__file__).resolve().parents[1] / "templates" / "kubernetes" / name
    if in_checkout.is_file():
        return in_checkout
    return Path(str(importlib.resources.files("course_utils.templates") / "kubernetes" / name))


def load(path: str | Path | None = None) -> dict:
    """The manifest at ``path`` (default: the course's JobSet) as a dict."""
    import yaml

    return yaml.safe_load(Path(path or template_path()).read_text())


def _closed(schema):
    """A copy of an OpenAPI v3 schema in which every object with ``properties`` refuses others
    (unless it says ``x-kubernetes-preserve-unknown-fields``)."""
    schema = copy.deepcopy(schema)

    def close(node):
        if isinstance(node, dict):
            if "properties" in node and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                close(value)
        elif isinstance(node, list):
            for value in node:
                close(value)

    close(schema)
    return schema


def jobset_errors(manifest: dict) -> list[str]:
    """The JobSet's fields against the vendored CRD schema: one line per problem."""
    import jsonschema

    vendored = json.loads(template_path("jobset_v1alpha2_schema.json").read_text())
    validator = jsonschema.Draft7Validator(_closed(vendored["openAPIV3Schema"]))
    found = [
        f"{'.'.join(str(p) for p in e.absolute_path) or '(top)'}: {e.message}"
        for e in validator.iter_errors(manifest)
    ]
    wanted = f"{vendored['group']}/{vendored['version']}"
    if manifest.get("apiVersion") != wanted or manifest.get("kind") != vendored["kind"]:
        found.append(f"(top): apiVersion/kind must be {wanted}/{vendored['kind']}")
    return found


def job_template_errors(template: dict, where: str = "template") -> list[str]:
    """A ``batch/v1`` JobTemplateSpec against the kubernetes client's ``V1JobTemplateSpec`` (a pydantic
    model since client 37: unknown fields forbidden, required ones and types checked)."""
    from kubernetes.client import V1JobTemplateSpec

    try:
        V1JobTemplateSpec.model_validate(template)
    except ValueError as error:  # pydantic's ValidationError
        return [
            f"{where}.{'.'.join(str(p) for p in problem['loc'])}: {problem['msg']}"
            for problem in error.errors()
        ]
    return []


def errors(manifest: dict | None = None) -> list[str]:
    """Every problem in a JobSet manifest (default: the course's), one line each; ``[]`` if none."""
    manifest = load() if manifest is None else manifest
    found = jobset_errors(manifest)
    jobs = manifest.get("spec", {}).get("replicatedJobs", [])
    for i, job in enumerate(jobs if isinstance(jobs, list) else []):
        if isinstance(job, dict) and "template" in job:
            found += job_template_errors(job["template"], f"spec.replicatedJobs.{i}.template")
    return found


def job_command(manifest: dict | None = None) -> tuple[str, list[str]]:
    """``(module, arguments)``: what the first container's script passes to ``exec torchrun``
    after ``-m`` (default manifest: the course's), shell quotes removed and variables such as
    ``$JOBSET_UID`` left as written (the pod fills them in)."""
    manifest = load() if manifest is None else manifest
    pod = manifest["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    script = pod["containers"][0]["args"][0]
    command = script[script.index("exec torchrun") :].replace("\\\n", " ")
    words = shlex.split(command.splitlines()[0], posix=True)
    module = words.index("-m")
    return words[module + 1], words[module + 2 :]


def run_here(
    bucket: str,
    jobset_uid: str,
    root: str | Path,
    extra: list | tuple = (),
    manifest: dict | None = None,
    nproc_per_node: int = 2,
    timeout: float = 180.0,
):
    """The manifest's job (:func:`job_command`) under ``torchrun`` on this machine, 1 node of
    ``nproc_per_node`` ranks (``elastic_run.run_elastic``): its ``--checkpoint-url`` with
    ``bucket`` (``s3://name``) in place of the manifest's bucket, ``jobset_uid`` for every
    ``$JOBSET_UID``, its ``--checkpoint-dir`` under the local folder ``root`` (``/shared/X``:
    ``root/shared/X``), then ``extra`` arguments. Returns ``(url, run)``: the checkpoint URL it
    used and the ``ElasticRun``."""
    from course_utils.runtime import elastic_run

    module, arguments = job_command(manifest)
    arguments = [a.replace("$JOBSET_UID", jobset_uid) for a in arguments]
    url_at = arguments.index("--checkpoint-url") + 1
    theirs = urlsplit(arguments[url_at])
    url = arguments[url_at] = f"{bucket.rstrip('/')}{theirs.path}"
    dir_at = arguments.index("--checkpoint-dir")
    folder = Path(root) / arguments[dir_at + 1].lstrip("/")
    del arguments[dir_at : dir_at + 2]
    run = elastic_run.run_elastic(
        folder,
        nproc_per_node=nproc_per_node,
        module=module,
        out_flag="--checkpoint-dir",
        script_args=[*arguments, *extra],
        timeout=timeout,
    )
    return url, run
