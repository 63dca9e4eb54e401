"""Checkpoints that make a resumed run continue exactly where the interrupted one stopped.

Two ways to save, for the two ways a model is spread over ranks:

* **replicated state** (DDP: every rank has the same model): rank 0 writes one file
  with ``torch.save``, between two barriers (:func:`save_on_rank0`), and every rank
  reads it back (:func:`load_on_every_rank`). The file is written under a temporary
  name and renamed, so a rank killed mid-save never leaves half a checkpoint.
* **sharded state** (the hybrid DLRM: each rank holds different rows of the tables):
  every rank writes its own pieces with ``torch.distributed.checkpoint`` (DCP)
  (:func:`save_sharded`). Shards are saved as DTensors that know their place in the
  whole table (the sharded lookup describes them: ``course_utils.sharding.dtensor``), so
  the checkpoint can be loaded by a different number of ranks, or
  whole by one process (:func:`load_sharded`, :func:`load_full_tables`).

While training goes on: ``dcp.async_save`` copies the state to CPU memory and writes it in
a background thread (:class:`Checkpointer`, ``background``); an :class:`AppState` (the
``Stateful`` protocol, with ``get_state_dict``/``set_state_dict``) gathers model, optimizer,
data position and step; :class:`GlobalPositionSampler` stores the data position as a global
sample count, so that another number of ranks can resume it.

A resume must restore everything the next step depends on: the weights, the
optimizer's state (Adam's moments and step count), and the position in the data
(:class:`ResumableSampler`: the epoch and how many samples of it were used).

Modules: ``replicated`` (rank-0 save, load, the resumable sampler, the training state),
``sharded`` (DCP save and load of a model that lists its pieces: ``ShardedModel``),
``app_state`` (``AppState``), ``position`` (``GlobalPositionSampler``), ``background`` (blocking
or asynchronous DCP saves, and the run that measures them), ``interval`` (how often to save:
Young and Daly's interval, and the restart cost), ``folders`` (which ``step_<N>`` folders are
complete, in order of ``N``), ``job`` (the production job's checkpoint: sharded state, progress,
data position, all tensors), ``random_state`` (each rank's generators, as tensors),
``safe_load`` (loading a DCP folder as data, never as code), ``incremental`` (a full base, then
deltas of the table rows touched since the last save) and ``incremental_run`` (the job's model
saved that way).

Taught in chapter 08 and appendix 08b.
"""

from course_utils.checkpoint.app_state import AppState
from course_utils.checkpoint.background import Checkpointer
from course_utils.checkpoint.folders import checkpoints, latest_complete, step_of
from course_utils.checkpoint.interval import young_daly_interval
from course_utils.checkpoint.position import GlobalPositionSampler
from course_utils.checkpoint.replicated import (
    ResumableSampler,
    load_on_every_rank,
    restore_training_state,
    save_on_rank0,
    training_state,
)
from course_utils.checkpoint.sharded import (
    ShardedModel,
    load_full_tables,
    load_sharded,
    save_sharded,
    sharded_state_dict,
)

__all__ = [
    "young_daly_interval",
    "save_on_rank0",
    "load_on_every_rank",
    "ResumableSampler",
    "training_state",
    "restore_training_state",
    "ShardedModel",
    "sharded_state_dict",
    "save_sharded",
    "load_sharded",
    "load_full_tables",
    "AppState",
    "GlobalPositionSampler",
    "Checkpointer",
    "latest_complete",
    "checkpoints",
    "step_of",
]
