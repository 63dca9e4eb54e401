"""Chapter 02: process groups and collectives, by hand and measured.

- ``groups``: ``init_group`` (``init_process_group`` with clear errors), ``free_port``;
- ``ring``: ``plain_ring_all_reduce`` and the tuned ``ring_all_reduce`` from point-to-point
  messages, and their schedule;
- ``runs``: every collective on a few ranks, before and after, as text and a figure;
- ``bandwidth``: algorithm and bus bandwidth, timing all-reduces, the alpha-beta model;
- ``wire_check``: each collective timed on a modeled wire, next to the model's prediction;
- ``uneven``: all-to-all and all-gather when ranks hold different amounts (counts first);
- ``streams``: what ``work.wait()`` orders on CPU and on CUDA, and timing with CUDA events;
- ``flight_recorder``: each rank's recorded collectives, and where the ranks part ways.

Taught in chapter 02 and its appendix 02a.
"""

from course_utils.collectives import bandwidth, flight_recorder, runs, streams, uneven, wire_check
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
    "wire_check",
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
