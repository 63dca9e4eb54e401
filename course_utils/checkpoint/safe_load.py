"""Load a DCP checkpoint as data, never as code.

A ``torch.distributed.checkpoint`` (DCP) folder is not only tensors. Its ``.metadata`` file is a
pickle, which torch's ``FileSystemReader.read_metadata`` reads with ``pickle.load``; and every
value that is not a tensor (an int, a string, pickled bytes) is read back with
``torch.load(..., weights_only=False)`` (``DefaultLoadPlanner.load_bytes``; torch 2.9 to 2.13).
Unpickling runs whatever code the file names, so anyone who can write into a checkpoint folder
(a shared file system, as on a cluster) can run code in every rank that loads it. Tensors
themselves are safe: DCP reads them with ``weights_only=True``.

Here a load reads only data:

* ``read_metadata(path)``: the ``.metadata`` pickle, with an unpickler that builds only what DCP's
  metadata is made of (its own dataclasses and enums, ``torch.Size``, dtypes, layouts, paths);
  anything else it names is refused before it is built (``CheckpointRefused``);
* ``SafeReader``: torch's ``FileSystemReader``, reading its metadata that way;
* ``reader_for(path)``: the reader for ``path``: ``SafeReader`` for a local folder; for a URL
  (``s3://bucket/job/step_000010``: object storage through fsspec, appendix 08a), DCP's
  ``FsspecReader`` reading its metadata the same way (one override, ``_AllowlistedMetadata``,
  shared by both; ``read_metadata`` reads a URL's ``.metadata`` through fsspec);
* ``SafePlanner``: torch's ``DefaultLoadPlanner``, reading every non-tensor value with
  ``torch.load(weights_only=True)``: ints, strings, lists and dicts of them load, objects do not;
* ``load(state, path)``: ``dcp.load`` with both.

The production job goes further: its checkpoints hold tensors only (``checkpoint.job``), and it
refuses a folder that holds any pickled value (``non_tensor_entries``).

Taught in chapter 08 (what a checkpoint folder can do to the job that loads it).
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import io
import os
import pathlib
import pickle

import torch
import torch.serialization
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

from course_utils.checkpoint.folders import is_url, location

__all__ = [
    "CheckpointRefused",
    "read_metadata",
    "non_tensor_entries",
    "SafeReader",
    "reader_for",
    "SafePlanner",
    "load",
]


class CheckpointRefused(ValueError):
    """A checkpoint folder holds something that loading it would run as code (one line, the path)."""


_PATHS = {"PosixPath", "WindowsPath", "PurePosixPath", "PureWindowsPath", "Path"}


class _MetadataUnpickler(pickle.Unpickler):
    """Builds only the classes a DCP ``.metadata`` is made of; refuses any other global."""

    def __init__(self, data: bytes, path):
        super().__init__(io.BytesIO(data))
        self.path = path

    def find_class(self, module: str, name: str):
        found = None
        if module.startswith("torch.distributed.checkpoint"):
            found = getattr(__import__(module, fromlist=[name]), name, None)
            is_data = isinstance(found, type) and (
                dataclasses.is_dataclass(found) or issubclass(found, enum.Enum)
            )
            found = found if is_data and found.__module__.startswith("torch.distributed.checkpoint") else None
        elif module == "torch" and name == "Size":
            found = torch.Size
        elif module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            found = getattr(torch, name)
        elif (module, name) == ("torch.serialization", "_get_layout"):  # a name -> torch.layout lookup
            found = getattr(torch.serialization, name)
        elif module in ("pathlib", "pathlib._local") and name in _PATHS:  # _local: Python 3.13
            found = getattr(pathlib, name)
        elif (module, name) == ("collections", "OrderedDict"):
            found = collections.OrderedDict
        if found is None:
            raise CheckpointRefused(
                f"{self.path}: its .metadata names {module}.{name}, which DCP's metadata never holds; "
                "unpickling it could run code, so it is not loaded (use a checkpoint you wrote yourself)"
            )
        return found


def read_metadata(path: str | os.PathLike):
    """The ``Metadata`` of the DCP folder ``path`` (what each entry is: ``state_dict_metadata``),
    unpickled safely; ``path`` may be a URL (its ``.metadata`` read through fsspec). Raises
    ``FileNotFoundError`` if it has no ``.metadata`` (an incomplete save) and ``CheckpointRefused``
    if it names anything but DCP's metadata classes."""
    folder = location(path)  # a local folder: a pathlib.Path; a URL: a UPath
    try:
        return _MetadataUnpickler((folder / ".metadata").read_bytes(), folder).load()
    except CheckpointRefused:
        raise
    except (pickle.UnpicklingError, EOFError, AttributeError, ValueError, TypeError) as exc:
        raise CheckpointRefused(
            f"{path}: its .metadata is not DCP metadata ({type(exc).__name__}: {exc})"
        ) from exc


def non_tensor_entries(path: str | os.PathLike) -> list[str]:
    """The entries of a DCP folder that are not tensors (pickled values), in name order."""
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    saved = read_metadata(path).state_dict_metadata
    return sorted(k for k, meta in saved.items() if isinstance(meta, BytesStorageMetadata))


class _AllowlistedMetadata:
    """A DCP reader's ``read_metadata``, unpickling ``.metadata`` with the module's
    ``read_metadata`` (the allowlist); mixed into ``SafeReader`` and the fsspec reader."""

    def read_metadata(self, *args, **kwargs):
        if kwargs.get("rank") is not None:  # a rank's own metadata: the course never writes one
            raise FileNotFoundError(f"{self.path}: no per-rank metadata is read")
        metadata = read_metadata(self.path)
        if getattr(metadata, "storage_meta", None) is None:
            from torch.distributed.checkpoint.metadata import StorageMeta

            metadata.storage_meta = StorageMeta()
        if hasattr(self, "load_id"):
            metadata.storage_meta.load_id = self.load_id
        return metadata


class SafeReader(_AllowlistedMetadata, FileSystemReader):
    """``FileSystemReader`` that unpickles ``.metadata`` with ``read_metadata``'s allowlist."""


@functools.cache
def _safe_fsspec_reader():
    """``SafeReader``'s twin for URLs, made on first use: DCP's ``FsspecReader`` needs fsspec,
    which only the course's kubernetes extra installs."""
    from course_utils.runtime import compat

    class SafeFsspecReader(_AllowlistedMetadata, compat.fsspec_reader_class()):
        """DCP's ``FsspecReader`` that unpickles ``.metadata`` with ``read_metadata``'s allowlist."""

    return SafeFsspecReader


def reader_for(path: str | os.PathLike):
    """The safe DCP reader of the checkpoint ``path``: ``SafeReader`` for a local folder, a safe
    ``FsspecReader`` for a URL (``s3://bucket/job/step_000010``)."""
    return _safe_fsspec_reader()(str(path)) if is_url(path) else SafeReader(str(path))


class SafePlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that reads each non-tensor value with ``torch.load(weights_only=True)``:
    plain values load, a pickled object raises ``CheckpointRefused`` naming its entry."""

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        name = read_item.dest_index.fqn
        try:
            plain = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise CheckpointRefused(
                f"entry {name!r} of the checkpoint is a pickled object, not plain data; loading it "
                "could run code, so it is not loaded"
            ) from exc
        again = io.BytesIO()
        torch.save(plain, again)  # plain data, re-serialised: the planner's own load is safe now
        again.seek(0)
        super().load_bytes(read_item, again)


def load(state: dict, path: str | os.PathLike, process_group=None) -> None:
    """``dcp.load(state, ...)`` from the folder (or URL) ``path``, reading only data (see the module's
    docstring). The metadata is checked first, on every rank, so that a refusal names the folder."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    read_metadata(path)
    try:
        dcp.load(state, storage_reader=reader_for(path), planner=SafePlanner(), process_group=process_group)
    except CheckpointException as exc:  # DCP gathers every rank's failure: a refusal is the one to say
        for failure in exc.failures.values():
            failure = failure[0] if isinstance(failure, tuple) else failure
            if isinstance(failure, CheckpointRefused):
                raise CheckpointRefused(f"{path}: {failure}") from None
        raise
