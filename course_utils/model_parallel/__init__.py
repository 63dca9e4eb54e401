"""Model parallelism: one model's parts on different devices.

* ``vertical``: whole layers per device (``VerticalSplit``, ``partition_sequential``, the
  ``.cuda(n)`` idiom), embedding tables placed per device, a split model under DDP;
* ``tensor_parallel``: one layer split across ranks (column- then row-parallel, Megatron's
  ``f`` and ``g``); ``torch_tp``: the same with PyTorch's ``parallelize_module``;
* ``fsdp``: sharded data parallelism with ``fully_shard`` (FSDP2); ``training_memory``: bytes
  per parameter by precision and ZeRO stage;
* ``activation_memory``: what autograd keeps for backward, counted.

    from course_utils.model_parallel import VerticalSplit, partition_sequential

Taught in chapter 05.
"""

from course_utils.model_parallel.vertical import (
    TwoGPUSplit,
    VerticalSplit,
    ddp_split_gradients,
    lookup_placed,
    partition_sequential,
    place_embedding_tables,
    place_largest_first,
    rank_devices,
)

__all__ = [
    "VerticalSplit",
    "TwoGPUSplit",
    "partition_sequential",
    "rank_devices",
    "ddp_split_gradients",
    "place_embedding_tables",
    "place_largest_first",
    "lookup_placed",
]
