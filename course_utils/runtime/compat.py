"""Every private torch API the course needs, in one place (``tests/test_private_torch_api.py`` finds
any other use), each wrapped in a function that says what it reaches and why no public call does.
The differences between torch versions that public APIs absorb are in ``versions.py``.

* ``sparse_indices_and_values(t)``: a sparse COO tensor's indices and values, coalesced or not;
* ``cuda_compiled()``, ``gpu_count_from_driver()``: GPUs counted without initialising CUDA;
* ``gpu_sleep(cycles)``: device time on the current stream that the host does not wait for;
  ``dump_flight_recorder(nccl)``: the flight recorder's entries of this process;
* ``import_dynamo()``: ``torch._dynamo``, imported ahead of the forked ranks;
* ``ddp_ignore(module, names)``, ``ddp_bucket_sizes(ddp_model)``: DDP's ignored parameters,
  and its gradient buckets as its logger records them; ``queue_autograd_callback(fn)``: code run
  at the end of a backward pass, as DDP's reducer finishes its sync;
* ``computes_pipeline_order(cls)``, ``pipeline_order(cls, p, m, v)``: the action lists of
  torch's zero-bubble schedules, computed without processes;
* ``module_tree_copy(module, device)``, ``set_parameter(module, name, tensor)``: a module's
  replica for another device, as ``torch.nn.parallel.replicate`` builds it;
* ``DISPATCH_MODE_BASE``, ``op_schema(op)``, ``storage_key(t)``, ``in_autograd_backward()``: what
  the modeled cluster's clock needs to price every operator a rank runs (the dispatch mode it
  derives from, an operator's signature, which memory a tensor lives in, and whether autograd's
  backward pass is running);
* ``fsspec_reader_class()``: DCP's reader of a checkpoint at a URL (``s3://...``), which the
  course's safe loader derives from;
* ``WORK_BASE``, ``register_cpu_backend(group, backend)``, ``backend_all_gather_into_tensor``,
  ``backend_reduce_scatter_tensor``: a process group written in Python (the modeled cluster's), its ``Work``
  handles, the gloo group its unmodelled calls go to, and that group's flat-tensor collectives.

The private names used here exist, with the same meaning, in every supported torch (2.9.1 to 2.13).

Not taught in a chapter: support code that the taught modules call, so they read the same on every torch.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = [
    "sparse_indices_and_values",
    "computes_pipeline_order",
    "cuda_compiled",
    "ddp_bucket_sizes",
    "ddp_ignore",
    "queue_autograd_callback",
    "gpu_count_from_driver",
    "gpu_sleep",
    "dump_flight_recorder",
    "import_dynamo",
    "module_tree_copy",
    "pipeline_order",
    "set_parameter",
    "WORK_BASE",
    "register_cpu_backend",
    "backend_all_gather_into_tensor",
    "backend_reduce_scatter_tensor",
    "storage_key",
    "in_autograd_backward",
    "op_schema",
    "DISPATCH_MODE_BASE",
    "fsspec_reader_class",
]


# --- private torch APIs, one function each ---------------------------------------------------


def sparse_indices_and_values(t):
    """A sparse COO tensor's indices ``[sparse dims, nnz]`` and values ``[nnz, ...]`` as stored,
    coalesced or not: ``Tensor._indices()`` and ``_values()`` (torch 2.9 to 2.15). The public
    ``indices()``/``values()`` refuse an uncoalesced tensor, and a sparse gradient straight from
    backward is one (one row per lookup, repeats included)."""
    return t._indices(), t._values()


def cuda_compiled() -> bool:
    """Whether this torch was built with CUDA (or ROCm), without initialising CUDA:
    ``torch.cuda._is_compiled()``. (``torch.cuda.is_available()`` would initialise the driver,
    and a process that has done so cannot fork ranks that use CUDA.)"""
    return torch.cuda._is_compiled()


def gpu_count_from_driver() -> int:
    """The GPUs this process may use (``CUDA_VISIBLE_DEVICES`` honoured), asked of the driver's
    management library, not of CUDA: ``torch.cuda._device_count_nvml()`` (NVIDIA) or
    ``torch.cuda._device_count_amdsmi()`` (ROCm builds). The same count ``torch.cuda`` takes when
    ``PYTORCH_NVML_BASED_CUDA_CHECK=1`` is set; -1 where the library cannot answer."""
    return torch.cuda._device_count_amdsmi() if torch.version.hip else torch.cuda._device_count_nvml()


def gpu_sleep(cycles: int) -> None:
    """Keep the current CUDA stream busy for ``cycles`` GPU clock cycles, without the host waiting:
    ``torch.cuda._sleep`` (a spin kernel torch's own stream tests use; no public call queues
    device time that does nothing). Appendix 02a uses it to show what ``work.wait()`` orders."""
    torch.cuda._sleep(cycles)


def dump_flight_recorder(nccl: bool = False) -> dict:
    """This process's flight recorder as a dict (``"entries"``: one per collective, oldest first,
    with ``collective_seq_id``, ``profiling_name`` such as ``"gloo:all_reduce"``, ``state``,
    ``input_sizes``): ``torch._C._distributed_c10d._dump_fr_trace`` (gloo and other backends;
    torch 2.9 to 2.13) or, with ``nccl=True``, ``_dump_nccl_trace`` (NCCL's own recorder, CUDA
    builds only). Stack traces left out. Both return the pickle that
    ``TORCH_NCCL_DUMP_ON_TIMEOUT`` writes to a file; no public call returns it."""
    import pickle

    import torch._C._distributed_c10d as c10d

    if nccl and not hasattr(c10d, "_dump_nccl_trace"):
        raise RuntimeError(
            "this torch has no NCCL flight recorder (a CPU build): dump_flight_recorder(nccl=False)"
        )
    dump = c10d._dump_nccl_trace if nccl else c10d._dump_fr_trace
    return pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=False))


def import_dynamo() -> None:
    """Import ``torch._dynamo``, torch's compiler front end (a private package). Building a
    ``DistributedDataParallel`` imports it, about a second of CPU; imported once before ranks
    are forked, every rank inherits it instead of importing it on its own."""
    import torch._dynamo  # noqa: F401


def ddp_ignore(module: torch.nn.Module, names: list[str]) -> None:
    """Make a ``DistributedDataParallel`` built from ``module`` leave the parameters and buffers
    ``names`` (fully qualified: ``"table.weight"``) alone: no broadcast, no gradient all-reduce.
    ``DistributedDataParallel._set_params_and_buffers_to_ignore_for_model``, private until the
    API is settled (pytorch/pytorch#43690); call it before wrapping."""
    from torch.nn.parallel import DistributedDataParallel

    DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(module, names)


def ddp_bucket_sizes(ddp_model) -> dict[str, list[int]]:
    """The bytes of each gradient bucket of a ``DistributedDataParallel`` model, as its logger
    records them: ``{"first": [...], "rebuilt": [...]}``, the buckets built with the model, then
    those rebuilt at the second forward in the order the gradients came (empty before).
    ``DistributedDataParallel._get_ddp_logging_data()``, a "prototype interface" whose
    ``bucket_sizes`` and ``rebuilt_bucket_sizes`` are comma-separated text; nothing public
    tells the bucket layout."""
    logged = ddp_model._get_ddp_logging_data()

    def sizes(key: str) -> list[int]:
        return [int(part) for part in str(logged.get(key, "")).split(",") if part.strip()]

    return {"first": sizes("bucket_sizes"), "rebuilt": sizes("rebuilt_bucket_sizes")}


def queue_autograd_callback(callback) -> None:
    """Run ``callback()`` once the autograd engine has finished the backward pass now running
    (call it from inside backward, e.g. from a gradient hook): what DDP's C++ reducer does to
    finish its gradient sync inside ``loss.backward()``
    (``torch/csrc/distributed/c10d/reducer.cpp``: ``queue_callback`` of ``finalize_backward``).
    ``Variable._execution_engine.queue_callback``, private in every supported torch (2.9.1 to
    2.13); no public call runs code at the end of a backward."""
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def computes_pipeline_order(cls) -> bool:
    """Whether torch's schedule class ``cls`` computes its per-rank action lists in a method
    that ``pipeline_order`` can call (``_calculate_single_rank_operations``: the zero-bubble
    schedules, from torch 2.6)."""
    return hasattr(cls, "_calculate_single_rank_operations")


def pipeline_order(cls, p: int, m: int, v: int) -> dict:
    """``{rank: [action or None]}``: the order torch's zero-bubble schedule class ``cls`` runs, for
    ``p`` ranks, ``m`` micro-batches and ``v`` stages per rank, without processes or stages.

    Sets, on an instance made without ``__init__``, the attributes the class's own
    ``_calculate_single_rank_operations`` reads (``_n_microbatches`` among them), and for
    ``ScheduleInterleavedZeroBubble`` adds its idle slots with ``_add_bubbles_to_actions``, as
    its ``__init__`` does; all private (torch 2.9 to 2.13), there being no public way to get a
    schedule's order without building its stages on ``p`` processes."""
    schedule = cls.__new__(cls)  # no process group, no stages: only what the order needs
    schedule.pp_group_size, schedule._n_microbatches, schedule.n_local_stages = p, m, v
    schedule.num_stages = p * v
    interleaved = cls.__name__ == "ScheduleInterleavedZeroBubble"
    if interleaved:
        schedule.number_of_rounds = max(1, m // p)
        schedule.microbatches_per_round = m // schedule.number_of_rounds
        if m % schedule.number_of_rounds:
            raise ValueError(f"{cls.__name__} needs m a multiple of its rounds, got m={m}, p={p}")
    schedule.pipeline_order = {rank: schedule._calculate_single_rank_operations(rank) for rank in range(p)}
    if interleaved and hasattr(schedule, "_add_bubbles_to_actions"):
        schedule.pipeline_order = schedule._add_bubbles_to_actions(p * v)
    return schedule.pipeline_order


def module_tree_copy(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """A copy of ``module`` and its submodules for ``device``, as ``torch.nn.parallel.replicate``
    builds one: every module a new object sharing its code and settings, holding the copies of
    its children, copies of its buffers on ``device``, and the original parameters until
    ``set_parameter`` replaces them.

    nn.Module's own dicts, ``_parameters``, ``_buffers`` and ``_modules``, are private (unchanged
    in torch 2.9 to 2.13). ``named_children`` and ``named_buffers`` leave out ``None`` entries and
    repeats, and ``copy.deepcopy`` would copy the parameters too."""
    new = {}
    for old in module.modules():
        new[old] = old.__new__(type(old))
        new[old].__dict__ = old.__dict__.copy()
        new[old]._parameters = dict(old._parameters)
    for old, rep in new.items():
        rep._modules = {k: (None if c is None else new[c]) for k, c in old._modules.items()}
        rep._buffers = {k: (None if b is None else b.to(device, copy=True)) for k, b in old._buffers.items()}
    return new[module]


def set_parameter(module: torch.nn.Module, name: str, tensor: torch.Tensor) -> None:
    """Put ``tensor`` where ``module``'s parameter ``name`` (``"0.weight"``) was, also a tensor that
    is no ``nn.Parameter`` (a copy linked to the original through autograd), which ``setattr``
    refuses ("cannot assign ... as parameter"): the owner's private ``_parameters`` dict, as
    ``torch.nn.parallel.replicate`` writes it (torch 2.9 to 2.13)."""
    owner, _, leaf = name.rpartition(".")
    module.get_submodule(owner)._parameters[leaf] = tensor


#: The class a Python process group's handles derive from (``torch._C._distributed_c10d.Work``,
#: exported as ``dist._Work`` in every supported torch); torch's own tests of Python process
#: groups (test_c10d_pypg.py) derive from it the same way.
WORK_BASE = dist._Work


def register_cpu_backend(group: dist.ProcessGroup, backend) -> None:
    """Give a Python ``ProcessGroup`` subclass ``backend`` (a gloo group) for CPU tensors.

    torch's C++ helpers that DDP calls at construction (``_verify_params_across_processes``)
    ask the group for its CPU backend, which a Python group has none of ("No backend type
    associated with device type cpu"); ``_register_backend`` is how ``init_process_group``
    itself attaches one. Operations the subclass overrides still go through the subclass.
    """
    group._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO, backend)


def backend_all_gather_into_tensor(group, output: torch.Tensor, input: torch.Tensor, opts):
    """``group._allgather_base``: what ``dist.all_gather_into_tensor`` calls on a process group
    (every supported torch); the modeled cluster's group passes the call on to its gloo group through here."""
    return group._allgather_base(output, input, opts)


def backend_reduce_scatter_tensor(group, output: torch.Tensor, input: torch.Tensor, opts):
    """``group._reduce_scatter_base``: what ``dist.reduce_scatter_tensor`` calls on a process
    group (every supported torch); the modeled cluster's group passes the call on to its gloo
    group through here."""
    return group._reduce_scatter_base(output, input, opts)


def storage_key(t: torch.Tensor) -> int:
    """A number naming the memory ``t`` lives in, the same for every view of it and unique while
    it lives, meta tensors included: the address of its ``c10::StorageImpl``,
    ``UntypedStorage._cdata`` (every supported torch). ``data_ptr()`` is 0 for every meta tensor,
    so it cannot tell two of them apart; nothing public names a storage. A sparse tensor has no
    storage of its own: it is named by the tensor itself (``id``)."""
    if t.layout != torch.strided:
        return id(t)
    return t.untyped_storage()._cdata


def in_autograd_backward() -> bool:
    """Whether this thread is running a node of autograd's backward pass:
    ``torch._C._current_autograd_node()`` is not None (every supported torch); nothing public
    tells a backward kernel from a forward one."""
    return torch._C._current_autograd_node() is not None


#: The base class of a mode that sees every ATen operator a thread runs, after autograd:
#: ``torch.utils._python_dispatch.TorchDispatchMode``, documented in "Extending PyTorch" under
#: that private module path in every supported torch (2.9.1 to 2.15); no public alias exists.
from torch.utils._python_dispatch import TorchDispatchMode as DISPATCH_MODE_BASE  # noqa: E402


def op_schema(op):
    """An ATen operator's signature (``torch._C.FunctionSchema``: its ``name`` such as
    ``"aten::addmm"``, its ``arguments`` with which ones it writes): ``OpOverload._schema``, the
    attribute torch's own FLOP counter and dispatch modes read (every supported torch)."""
    return op._schema


def fsspec_reader_class():
    """DCP's reader of a checkpoint at a URL (``s3://bucket/job/step_000010``: any file system
    fsspec knows), the one ``dcp.load`` picks by itself for such a ``checkpoint_id``:
    ``FsspecReader``, of the private module ``torch.distributed.checkpoint._fsspec_filesystem``
    (the same class there in torch 2.9.1 to 2.15; ``torch.distributed.checkpoint`` exports
    ``FileSystemReader`` but not it). ``checkpoint.safe_load`` derives its URL reader from it, to
    read ``.metadata`` with an allowlist. Importing it needs fsspec (the kubernetes extra)."""
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    return FsspecReader
