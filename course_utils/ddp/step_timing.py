"""Step times of the DDP variants (naive, bucketed, torch), run side by side on the same ranks.

``step_times`` runs every variant in turn, ``rounds`` times, interleaved so that each
meets the same machine state, and returns each one's step times, final weights and
all-reduce count: what bucketing saves (fewer, overlapped messages) measured.

Taught in chapter 04 (section 5, buckets, timed against naive and torch DDP).
"""

from __future__ import annotations

from ..models import DLRMConfig
from .train import TrainSettings, ddp_worker

__all__ = ["VARIANTS", "step_times"]


#: DDP variants ``step_times`` can run: name -> (kind, wrap options). "one bucket" holds every
#: gradient in a single bucket, which can only leave once backward has finished: no overlap.
VARIANTS = {
    "naive": ("naive", {}),
    "bucketed": ("bucketed", {}),
    "torch": ("torch", {}),
    "one bucket": ("bucketed", {"bucket_cap_mb": 1024.0, "first_bucket_cap_mb": 1024.0}),
}


def step_times(
    data,
    model_config: DLRMConfig,
    settings: TrainSettings,
    variants=("naive", "bucketed", "torch"),
    rounds: int = 2,
    warmup_steps: int = 2,
) -> dict:
    """On every rank (call through ``launch``): ``rounds`` x each DDP variant, interleaved.

    Returns ``{"seconds": {variant: [step seconds after the first warmup_steps of each run]},
    "states": {variant: this rank's final state_dict of the last round},
    "collectives": {variant: all-reduces the last run started (None for torch DDP)}}``.
    """
    seconds = {name: [] for name in variants}
    states, collectives = {}, {}
    for _ in range(rounds):
        for name in variants:
            kind, options = VARIANTS[name]
            run = ddp_worker(kind, data, model_config, settings, **options)
            seconds[name] += run.step_seconds[warmup_steps:]
            states[name], collectives[name] = run.state, run.collectives
    return {"seconds": seconds, "states": states, "collectives": collectives}
