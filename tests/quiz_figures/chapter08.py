"""Sources of the numbers in quiz 08's answers (see tests/test_quiz_figures.py)."""

import signal

EVERY, KILLED_BEFORE = 5, 14  # question 4: a checkpoint every 5 steps, killed just before step 14
N, GLOBAL_BATCH, STEPS = 4096, 128, 20  # question 6: the chapter's epoch, batch and stop


def _last_saved() -> int:
    return (KILLED_BEFORE - 1) // EVERY * EVERY


def _resized() -> tuple[list[int], list[int]]:
    """Question 6 without ranks: what 2 ranks used in STEPS steps, and what 4 ranks resumed from
    the global position (the sampler of every rank, built with its rank and world size) use."""
    from course_utils.checkpoint.position import GlobalPositionSampler

    before = [GlobalPositionSampler(N, rank=r, world_size=2) for r in range(2)]
    seen = [i for s in before for i in list(s)[: STEPS * GLOBAL_BATCH // 2]]
    state = {"epoch": 0, "samples_seen": STEPS * GLOBAL_BATCH}  # what before[r].advance() would reach
    after = [GlobalPositionSampler(N, rank=r, world_size=4) for r in range(4)]
    for s in after:
        s.load_state_dict(state)
    return seen, [i for s in after for i in s]


def _every_sample_once() -> bool:
    seen, rest = _resized()
    return sorted(seen + rest) == list(range(N))


def _per_rank_count_leaves_nothing() -> bool:
    """Question 6, A: the per-rank count of 2 ranks (1,280) read as each of 4 ranks' count."""
    from course_utils.checkpoint import ResumableSampler

    sampler = ResumableSampler(range(N), num_replicas=4, rank=0, shuffle=True, seed=0)
    sampler.load_state_dict({"epoch": 0, "consumed": STEPS * GLOBAL_BATCH // 2})
    return len(list(sampler)) == 0


def _young_daly_seconds() -> float:
    from course_utils.checkpoint.interval import young_daly_interval

    return young_daly_interval(60, 24 * 3600)


FIGURES = {
    4: {
        "10": Computed(_last_saved),
        "11": Computed(lambda: _last_saved() + 1),
        "12": Computed(lambda: _last_saved() + 2),
    },
    5: {
        "102": InChapter("checkpoints of 102 MB"),  # the chapter's modeled 8xH100 node
        "0.800": InChapter("dcp.async_save"),
        "4.096": InChapter("dcp.save "),
    },
    6: {
        "2,560": Computed(lambda: len(_resized()[0])),
        "1,536": Computed(lambda: len(_resized()[1])),
        "1,280": Computed(lambda: STEPS * GLOBAL_BATCH // 2),
    },
    7: {
        "54": Computed(lambda: _young_daly_seconds() / 60),
        "86,400": Computed(lambda: 24 * 3600),
        "3,220": Computed(_young_daly_seconds),
    },
    8: {
        # the stand-in SLURM run is appendix 08c's (section 2), whose first run printed "failed with exit
        # code 137": the shell's code for a process ended by SIGKILL, 128 + 9
        "137": Computed(lambda: 128 + int(signal.SIGKILL)),
        "20": InChapter("resumed from the checkpoint of step 20"),
    },
}

CLAIMS = {
    4: (Claim("B. Steps 11, 12 and 13", lambda: [*range(_last_saved() + 1, KILLED_BEFORE)] == [11, 12, 13]),),
    6: (
        Claim("every sample once", _every_sample_once),
        Claim("each of the 4 ranks would have had 0 samples left", _per_rank_count_leaves_nothing),
    ),
}
