"""What one ATen operator costs on a modeled GPU: a roofline, in whole nanoseconds.

    cost = max(FLOPs / achieved FLOP/s, bytes read and written / achieved bandwidth) + launch

* FLOPs: ``torch.utils.flop_counter``'s formulas (matrix products, convolutions, attention), plus
  the lookups a recommender needs, which it counts as 0: an embedding bag adds ``D`` numbers per
  id (``_EXTRA_FLOPS``). Element-wise operators count 0 FLOPs; they are priced by their bytes.
* Bytes: every tensor the operator reads (its inputs, but not the buffers it only writes: ``out=``
  arguments, the target of ``copy_``/``fill_``/``zero_``) plus every tensor it writes (its
  outputs). A lookup reads the rows it gathers, not its whole table (``_gathered_bytes``), and a
  scatter into a table touches the rows it writes. A sparse tensor counts its indices and values;
  added into a dense one in place (``table.add_(sparse_gradient)``), it touches its rows only.
* Free (0 ns): views and aliases (``func.is_view``: ``view``, ``t``, ``expand``, ``as_strided``
  ...), allocation without a kernel (``empty``), reading a scalar to the host (``item``),
  metadata, and every operator outside the ``aten`` namespace (the profiler's markers; the
  collectives, which ``group.py`` prices on the network).
* The dtype that picks the peak is the output's (float32, or TF32 for a float32 matrix product
  when ``Cluster(tf32=True)``; float16, bfloat16).

Rounded to whole nanoseconds per operator, so that costs add up exactly.

Taught in chapter 02 (the modeled cluster: what a step costs on a GPU).
"""

from __future__ import annotations

import torch

from course_utils.runtime import compat

__all__ = ["op_cost", "Cost", "tensor_bytes", "tensors_in"]

_FREE = {
    "aten::detach",
    "aten::alias",
    "aten::_unsafe_view",
    "aten::lift_fresh",
    "aten::lift_fresh_copy",
    "aten::empty",
    "aten::empty_strided",
    "aten::empty_like",
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::_local_scalar_dense",
    "aten::set_",
    "aten::resize_",
    "aten::_resize_output_",
    "aten::is_nonzero",
    "aten::_has_same_storage_numel",
    "aten::_is_any_true",
    "aten::sym_size",
    "aten::sym_stride",
    "aten::sym_numel",
    "aten::sym_storage_offset",
    "aten::_nested_tensor_size",
    "aten::record_stream",
}
_WRITE_ONLY_SELF = {
    "aten::copy_",
    "aten::fill_",
    "aten::zero_",
    "aten::normal_",
    "aten::uniform_",
    "aten::random_",
    "aten::exponential_",
    "aten::geometric_",
    "aten::cauchy_",
    "aten::log_normal_",
    "aten::bernoulli_",
}
_MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::_scaled_mm"}


class Cost:
    """One operator's price: ``ns`` (whole nanoseconds), ``flops``, ``bytes``; ``op`` its name."""

    __slots__ = ("ns", "flops", "bytes", "op")

    def __init__(self, ns: int, flops: int, nbytes: int, op: str = ""):
        self.ns, self.flops, self.bytes, self.op = ns, flops, nbytes, op

    def __repr__(self) -> str:
        return f"Cost({self.op}: ns={self.ns}, flops={self.flops}, bytes={self.bytes})"


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes a kernel moves to read or write ``t`` whole (a sparse tensor: indices and values)."""
    if t.layout == torch.sparse_coo:
        indices, values = compat.sparse_indices_and_values(t)
        return indices.numel() * indices.element_size() + values.numel() * values.element_size()
    if t.layout != torch.strided:
        return 0
    return t.numel() * t.element_size()


def tensors_in(tree) -> list[torch.Tensor]:
    """The tensors in ``tree`` (a tensor, or lists, tuples and dicts of them, nested)."""
    if isinstance(tree, torch.Tensor):
        return [tree]
    if isinstance(tree, (list, tuple)):
        return [t for item in tree for t in tensors_in(item)]
    if isinstance(tree, dict):
        return [t for item in tree.values() for t in tensors_in(item)]
    return []


_tensors = tensors_in


def _row_bytes(table: torch.Tensor) -> int:
    """Bytes of one row of a ``[rows, D]`` table."""
    return (table.numel() // max(table.shape[0], 1)) * table.element_size() if table.dim() else 0


def _gathered_bytes(name: str, args, out) -> tuple[int, int] | None:
    """``(bytes read, bytes written)`` of an operator that reads or writes only some rows of a big
    tensor (a lookup, a scatter into a table), or None for every other operator."""
    outs = _tensors(out)
    if name == "aten::embedding":  # (weight [N, D], indices) -> [*indices, D]
        weight, indices = args[0], args[1]
        return tensor_bytes(indices) + indices.numel() * _row_bytes(weight), tensor_bytes(outs[0])
    if name in ("aten::_embedding_bag", "aten::_embedding_bag_forward_only", "aten::embedding_bag"):
        weight, indices, offsets = args[0], args[1], args[2]
        read = indices.numel() * _row_bytes(weight) + tensor_bytes(indices) + tensor_bytes(offsets)
        extra = [a for a in args[3:] if isinstance(a, torch.Tensor)]  # per_sample_weights
        return read + sum(tensor_bytes(a) for a in extra), tensor_bytes(outs[0])
    if name in ("aten::index_select", "aten::gather", "aten::index", "aten::take"):
        index = _tensors(args[1:])
        return tensor_bytes(outs[0]) + sum(tensor_bytes(i) for i in index), tensor_bytes(outs[0])
    if name in ("aten::embedding_dense_backward", "aten::_embedding_bag_dense_backward"):
        grad, indices = args[0], args[1]
        written = tensor_bytes(outs[0])  # the whole table's gradient, zeroed then added into
        return tensor_bytes(grad) + tensor_bytes(indices) + indices.numel() * _row_bytes(outs[0]), written
    if name in ("aten::_embedding_bag_backward", "aten::_embedding_bag_sparse_backward"):
        grad, indices = args[0], args[1]
        return tensor_bytes(grad) + tensor_bytes(indices), tensor_bytes(outs[0])
    if name in (
        "aten::index_put_",
        "aten::_index_put_impl_",
        "aten::index_add_",
        "aten::index_copy_",
        "aten::scatter_add_",
        "aten::scatter_",
        "aten::scatter_reduce_",
        "aten::index_put",
        "aten::index_add",
        "aten::scatter_add",
    ):
        small = [t for t in _tensors(args[1:])]
        moved = sum(tensor_bytes(t) for t in small)
        values = max((tensor_bytes(t) for t in small), default=0)
        return moved + values, values  # indices and values read, the touched rows read and written
    return None


def _sparse_into_dense(args, out) -> tuple[int, int] | None:
    """``(read, written)`` of an in-place operator that adds a sparse tensor into a dense one (its
    values, and the dense rows they land on, read; those rows written), or None for any other."""
    if not (args and isinstance(out, torch.Tensor) and out is args[0] and out.layout == torch.strided):
        return None
    sparse = [t for t in tensors_in(args[1:]) if t.layout == torch.sparse_coo]
    if not sparse:
        return None
    values = 0
    for t in sparse:
        _, v = compat.sparse_indices_and_values(t)
        values += v.numel() * v.element_size()
    return sum(tensor_bytes(t) for t in sparse) + values, values


def _extra_flops(name: str, args, out) -> int:
    """FLOPs of the operators ``torch.utils.flop_counter`` counts as 0 that a recommender needs."""
    if name in ("aten::_embedding_bag", "aten::_embedding_bag_forward_only", "aten::embedding_bag"):
        weight, indices = args[0], args[1]
        return indices.numel() * (weight.numel() // max(weight.shape[0], 1))  # one add per id and column
    if name in ("aten::_embedding_bag_backward", "aten::_embedding_bag_dense_backward"):
        grad, indices = args[0], args[1]
        return indices.numel() * (grad.numel() // max(grad.shape[0], 1))
    return 0


def _shapes(tree):
    """``tree`` with every tensor replaced by its shape (what the FLOP formulas take)."""
    if isinstance(tree, torch.Tensor):
        return tree.shape
    if isinstance(tree, (list, tuple)):
        return type(tree)(_shapes(x) for x in tree)
    return tree


class _OpInfo:
    """What pricing an operator needs to know of its signature, worked out once per operator."""

    __slots__ = ("name", "free", "reads", "formula", "gathers")

    def __init__(self, func):
        from torch.utils.flop_counter import flop_registry

        self.free = func.namespace != "aten" or func.is_view
        schema = compat.op_schema(func)
        self.name = schema.name
        self.free = self.free or self.name in _FREE
        self.reads = []  # (position, keyword) of each argument the operator reads
        for i, arg in enumerate(schema.arguments):
            written = arg.alias_info is not None and arg.alias_info.is_write
            if written and (arg.kwarg_only or (i == 0 and self.name in _WRITE_ONLY_SELF)):
                continue  # out= buffers, and the target of copy_/fill_/zero_: written, not read
            self.reads.append((i, arg.name))
        formula = flop_registry.get(func.overloadpacket)
        # the registry's formulas take shapes; shape_wrapper maps tensors to shapes with pytree,
        # which costs more than the formula, so call the formula itself on our own shapes
        self.formula = getattr(formula, "__wrapped__", formula)
        self.gathers = self.name in _GATHERING

    def flops(self, args, kwargs, out) -> int:
        if self.formula is None:
            return _extra_flops(self.name, args, out)
        return int(self.formula(*_shapes(args), **_shapes_kw(kwargs), out_shape=_shapes(out)))

    def read_bytes(self, args, kwargs) -> int:
        total = 0
        for i, keyword in self.reads:
            value = args[i] if i < len(args) else kwargs.get(keyword)
            if isinstance(value, torch.Tensor):
                total += tensor_bytes(value)
            elif isinstance(value, (list, tuple)):
                total += sum(tensor_bytes(t) for t in tensors_in(value))
        return total


def _shapes_kw(kwargs: dict) -> dict:
    return {k: _shapes(v) for k, v in kwargs.items()}


_GATHERING = {
    "aten::embedding",
    "aten::_embedding_bag",
    "aten::_embedding_bag_forward_only",
    "aten::embedding_bag",
    "aten::index_select",
    "aten::gather",
    "aten::index",
    "aten::take",
    "aten::embedding_dense_backward",
    "aten::_embedding_bag_dense_backward",
    "aten::_embedding_bag_backward",
    "aten::_embedding_bag_sparse_backward",
    "aten::index_put_",
    "aten::_index_put_impl_",
    "aten::index_add_",
    "aten::index_copy_",
    "aten::scatter_add_",
    "aten::scatter_",
    "aten::scatter_reduce_",
    "aten::index_put",
    "aten::index_add",
    "aten::scatter_add",
}
_INFO: dict = {}


def _dtype_key(name: str, out, args, tf32: bool) -> str:
    outs = _tensors(out) or _tensors(args)
    dtype = outs[0].dtype if outs else torch.float32
    if dtype == torch.float16:
        return "float16"
    if dtype == torch.bfloat16:
        return "bfloat16"
    if dtype == torch.float32 and tf32 and name in _MATMUL:
        return "tf32"
    return "float32"


def op_cost(func, args, kwargs, out, cluster) -> Cost | None:
    """The price of ``func(*args, **kwargs) -> out`` on ``cluster.device``, or None if free."""
    info = _INFO.get(func)
    if info is None:
        info = _INFO[func] = _OpInfo(func)
    if info.free:
        return None
    device = cluster.device
    gathered = _gathered_bytes(info.name, args, out) if info.gathers else _sparse_into_dense(args, out)
    if gathered is None:
        read = info.read_bytes(args, kwargs)
        written = (
            tensor_bytes(out) if isinstance(out, torch.Tensor) else sum(map(tensor_bytes, _tensors(out)))
        )
    else:
        read, written = gathered
    flops = info.flops(args, kwargs, out)
    moved = read + written
    seconds = moved / device.bytes_per_second
    if flops:
        seconds = max(
            seconds, flops / device.flops_per_second(_dtype_key(info.name, out, args, cluster.tf32))
        )
    return Cost(round((seconds + device.launch_s) * 1e9), flops, moved, info.name)
