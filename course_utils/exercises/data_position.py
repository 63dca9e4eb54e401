"""Exercise: a sampler that saves its data position, checked against ``checkpoint.ResumableSampler``.

The learner writes a class like ``DistributedSampler`` (``cls(dataset, num_replicas=,
rank=, shuffle=True, seed=, drop_last=True)``, a subclass is easiest) that also counts the
samples this rank has consumed (``advance(n)`` after each batch of ``n``), saves its position in
``state_dict()`` and puts it back with ``load_state_dict(state)``: a run resumed from the saved
state, which calls ``set_epoch`` for the epoch it is in, sees exactly the samples of that epoch
the interrupted run had not seen, and the next epoch in full.

``check_resumable_sampler(cls)`` plays that on 2 and on 3 ranks (23 samples, batches of 2): three
batches, save (through ``torch.save`` and ``torch.load(weights_only=True)``, as a checkpoint),
resume in a fresh sampler, two batches more, save and resume again, then the next epoch; and
compares each rank's samples with ``ResumableSampler``'s. A sampler communicates nothing, so each
rank's sampler is built here with its ``rank`` and ``num_replicas``; no processes start.

Taught in chapter 08 (section 2, the data position in a checkpoint).
"""

from __future__ import annotations

import io

import torch

from course_utils.checkpoint.replicated import ResumableSampler
from course_utils.exercises.result import CheckResult

__all__ = ["check_resumable_sampler", "check_resumable_sampler_many", "DATASET_SIZE", "BATCH", "WORLD_SIZES"]

DATASET_SIZE, BATCH, SEED, EPOCH = 23, 2, 7, 1
WORLD_SIZES = (2, 3)
FIRST, SECOND = 3, 2  # batches before the first save, and between the two resumes


class _Error(Exception):
    pass


def _saved(state) -> dict:
    """``state`` through ``torch.save`` and ``torch.load(weights_only=True)``, as a checkpoint stores it."""
    buffer = io.BytesIO()
    try:
        torch.save(state, buffer)
        buffer.seek(0)
        return torch.load(buffer, weights_only=True)
    except Exception as exc:
        raise _Error(
            f"state_dict() returned something a checkpoint cannot store and load back with "
            f"torch.load(weights_only=True) ({type(exc).__name__}: {_first_sentence(exc)}): "
            "keep it to a dict of plain ints (the epoch, the samples consumed)"
        ) from exc


def _first_sentence(exc: Exception) -> str:
    text = "".join(c for c in str(exc) if c.isprintable())
    return text.split(". ")[0][:120]


def _epoch_order(world: int, rank: int, epoch: int) -> list:
    sampler = ResumableSampler(
        list(range(DATASET_SIZE)), num_replicas=world, rank=rank, shuffle=True, seed=SEED, drop_last=True
    )
    sampler.set_epoch(epoch)
    return list(iter(sampler))


def _play(cls, world: int, rank: int) -> dict:
    """One rank's run with sampler class ``cls``: what it sees at each stage."""
    dataset = list(range(DATASET_SIZE))

    def make():
        return cls(dataset, num_replicas=world, rank=rank, shuffle=True, seed=SEED, drop_last=True)

    seen = {}
    sampler = make()
    sampler.set_epoch(EPOCH)
    seen["epoch"] = list(iter(sampler))
    seen["before"] = seen["epoch"][: FIRST * BATCH]
    for _ in range(FIRST):
        sampler.advance(BATCH)
    state = _saved(sampler.state_dict())
    resumed = make()
    resumed.load_state_dict(state)
    seen["loaded"] = list(iter(resumed))  # before set_epoch
    resumed.set_epoch(EPOCH)  # the resumed loop enters the same epoch
    seen["rest"] = list(iter(resumed))
    seen["len"] = len(resumed)
    for _ in range(SECOND):
        resumed.advance(BATCH)
    again = make()
    again.load_state_dict(_saved(resumed.state_dict()))
    again.set_epoch(EPOCH)
    seen["rest2"] = list(iter(again))
    again.set_epoch(EPOCH + 1)
    seen["next"] = list(iter(again))
    return seen


def _sequence(values: list, limit: int = 6) -> str:
    return "[" + ", ".join(map(str, values[:limit])) + (", ...]" if len(values) > limit else "]")


def _diagnose(world: int, rank: int, got: dict, want: dict) -> str | None:
    where = f"on {world} ranks, rank {rank}"
    consumed = FIRST * BATCH
    if got["epoch"] != want["epoch"]:
        return (
            f"{where}: epoch {EPOCH} before any save gives {_sequence(got['epoch'])}, "
            f"DistributedSampler gives {_sequence(want['epoch'])}: keep its order (same seed, "
            "shuffle, drop_last), only start later in it"
        )
    if got["rest"] != want["rest"]:
        full = want["epoch"]
        if got["rest"] == full and got["loaded"] == _epoch_order(world, rank, 0)[consumed:]:
            return (
                f"{where}: state_dict() keeps no epoch: the resumed sampler starts in epoch 0's order, "
                f"and set_epoch({EPOCH}) then starts epoch {EPOCH} from its beginning, so the run sees "
                f"again the {consumed} samples it had already seen. Save the epoch too (the shuffle "
                "depends on seed + epoch)"
            )
        if got["rest"] == full:
            if got["loaded"] == want["rest"]:
                return (
                    f"{where}: right after load_state_dict the position is right, but set_epoch({EPOCH}) "
                    f"then sends the resumed run back to the start of the epoch: it sees again the "
                    f"{consumed} samples it had already seen. set_epoch must start from 0 only when the "
                    "epoch changes"
                )
            return (
                f"{where}: the resumed run sees the whole epoch again, the {consumed} samples "
                f"already seen ({_sequence(full[:consumed])}) included: the position was not saved in "
                "state_dict(), or load_state_dict did not put it back"
            )
        other = ResumableSampler(
            list(range(DATASET_SIZE)), num_replicas=world, rank=rank, shuffle=True, seed=SEED
        )
        other.set_epoch(0)
        if got["rest"] == list(iter(other))[consumed:]:
            return (
                f"{where}: the resumed run continues in epoch 0's order, not epoch {EPOCH}'s: "
                "save the epoch in state_dict() too (the shuffle depends on seed + epoch)"
            )
        for skipped, why in (
            (
                FIRST,
                f"advance(n) was called {FIRST} times with n={BATCH}, the batch size: "
                "count samples, not calls",
            ),
            (
                consumed * world,
                "that is every rank's samples together: this sampler's positions are per rank",
            ),
            (consumed + 1, "one sample too many: is the position counted from 1?"),
            (consumed - 1, "one sample too few: is the position counted from 1?"),
        ):
            if got["rest"] == full[skipped:]:
                return (
                    f"{where}: the resumed run skips {skipped} samples of epoch {EPOCH}, but the "
                    f"interrupted run had consumed {consumed} ({FIRST} batches of {BATCH}): {why}"
                )
        return (
            f"{where}: the resumed run sees {_sequence(got['rest'])} ({len(got['rest'])} samples), "
            f"ResumableSampler {_sequence(want['rest'])} ({len(want['rest'])})"
        )
    if got["len"] != len(want["rest"]):
        return (
            f"{where}: len() of the resumed sampler is {got['len']}, but it yields {len(want['rest'])} "
            "samples: len must count what is left of the epoch (a DataLoader sizes the epoch with it)"
        )
    if got["rest2"] != want["rest2"]:
        more = (FIRST + SECOND) * BATCH
        if got["rest2"] == want["epoch"][SECOND * BATCH :]:
            return (
                f"{where}: after a second save and resume the run skips only the {SECOND * BATCH} "
                f"samples consumed since the first resume, not all {more}: advance must add to the "
                "loaded position, not start a new count"
            )
        return (
            f"{where}: after a second save and resume the run sees {_sequence(got['rest2'])}, "
            f"ResumableSampler {_sequence(want['rest2'])}"
        )
    if got["next"] != want["next"]:
        if got["next"] == want["next"][(FIRST + SECOND) * BATCH :]:
            return (
                f"{where}: epoch {EPOCH + 1} starts where epoch {EPOCH} was left, at sample "
                f"{(FIRST + SECOND) * BATCH}: set_epoch with a new epoch must start it from the beginning"
            )
        return (
            f"{where}: epoch {EPOCH + 1} gives {_sequence(got['next'])}, "
            f"DistributedSampler {_sequence(want['next'])}"
        )
    return None


def _check(cls) -> CheckResult:
    result = CheckResult(
        getattr(cls, "__name__", "sampler"),
        f"gives ResumableSampler's samples on each of 2 and of 3 ranks ({DATASET_SIZE} samples, "
        f"batches of {BATCH}): after a save and resume, after a second one, and in the next epoch",
    )
    for world in WORLD_SIZES:
        for rank in range(world):
            want = _play(ResumableSampler, world, rank)
            try:
                got = _play(cls, world, rank)
            except _Error as exc:
                result.problems.append(f"on {world} ranks, rank {rank}: {exc}")
                return result
            except Exception as exc:
                result.problems.append(
                    f"on {world} ranks, rank {rank}: your sampler raised "
                    f"{type(exc).__name__}: {str(exc)[:200]}"
                )
                return result
            problem = _diagnose(world, rank, got, want)
            if problem:
                result.problems.append(problem)
                return result
    return result


def check_resumable_sampler_many(classes: list) -> list[CheckResult]:
    """``check_resumable_sampler`` for several classes (nothing printed)."""
    return [_check(cls) for cls in classes]


def check_resumable_sampler(cls) -> CheckResult:
    """Check sampler class ``cls`` against ``ResumableSampler``; print what differs, or one line
    saying it passed."""
    return _check(cls).shown()
