"""Chapter 02: process groups and collectives, by hand and measured.

- ``groups``: ``init_group`` (``init_process_group`` with clear errors), ``free_port``;
- ``ring``: ``plain_ring_all_reduce`` and the tuned ``ring_all_reduce`` from point-to-point
  messages, and their schedule;
- ``runs``: every collective on a few ranks, before and after, as text and a figure;
- ``bandwidth``: algorithm and bus bandwidth, timing all-reduces (wall time, or virtual time
  on a modeled cluster), the alpha-beta model and its fit;
- ``published``: NCCL's published all-reduce bandwidths on GPU nodes, to hold the model against;
- ``uneven``: all-to-all and all-gather when ranks hold different amounts (counts first);
- ``streams``: what ``work.wait()`` orders on CPU and on CUDA, and timing with CUDA events;
- ``flight_recorder``: each rank's recorded collectives, and where the ranks part ways.

Taught in chapter 02 and its appendix 02a.
"""

from course_utils.collectives import bandwidth, flight_recorder, published, runs, streams, uneven
from course_utils.collectives.groups import GroupInitError, init_group
from course_utils.collectives.ring import (
    bytes_sent_per_rank,
    plain_ring_all_reduce,
    ring_all_reduce,
    ring_schedule,
)
from course_utils.runtime.ports import free_port

__all__ = [
    "bandwidth",
    "runs",
    "published",
    "uneven",
    "streams",
    "flight_recorder",
    "ring_all_reduce",
    "plain_ring_all_reduce",
    "ring_schedule",
    "bytes_sent_per_rank",
    "init_group",
    "free_port",
    "GroupInitError",
]
