"""The "build it" checkers (course_utils.exercises): each exercise's worked solution passes, a
correct function written differently passes, and planted mistakes get their own message, with
none of the reference's code in what is printed.

The checkers that run ranks check all of a test's candidate functions in one launch (their
``check_*_many``), once per module (the fixtures), to keep this file fast.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
import torch.distributed as dist
from torch.nn import functional as F
from torch.utils.data import DistributedSampler

from course_utils import exercises
from course_utils.checkpoint import ResumableSampler
from course_utils.collectives import plain_ring_all_reduce
from course_utils.data_parallel.by_hand import DataParallelByHand
from course_utils.exercises import solutions
from course_utils.pipeline.schedules import one_f_one_b, one_f_one_b_order

pytestmark = pytest.mark.chapter(2, 3, 4, 5, 6, 7, 8)


def source_lines(*objects) -> list[str]:
    """The code lines (stripped, long enough to mean something) of the references and solutions."""
    lines = []
    for obj in objects:
        lines += [s for s in (line.strip() for line in inspect.getsource(obj).splitlines()) if len(s) >= 16]
    return lines


def assert_no_source(results, *references):
    text = "\n".join(str(r) for r in results)
    leaked = [line for line in source_lines(*references) if line in text]
    assert not leaked, leaked


# --- chapter 02: ring all-reduce ---------------------------------------------------------------


def _ring(tensor, *, chunking="split", all_gather=True, gather_op="copy"):
    """A ring all-reduce with a mistake to plant: chunks of ``numel // w`` ("floor"), no
    all-gather phase, or adding where the all-gather phase copies."""
    rank, world = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    if chunking == "split":
        chunks = torch.tensor_split(flat, world)
    else:
        size = flat.numel() // world
        chunks = [flat[i * size : (i + 1) * size] for i in range(world)]
    for phase in ("reduce-scatter", "all-gather") if all_gather else ("reduce-scatter",):
        for step in range(world - 1):
            if phase == "reduce-scatter":
                send, receive = (rank - step) % world, (rank - step - 1) % world
            else:
                send, receive = (rank + 1 - step) % world, (rank - step) % world
            incoming = torch.empty_like(chunks[receive])
            work = dist.isend(chunks[send], (rank + 1) % world)
            dist.recv(incoming, (rank - 1) % world)
            work.wait()
            if phase == "reduce-scatter" or gather_op == "add":
                chunks[receive].add_(incoming)
            else:
                chunks[receive].copy_(incoming)
    return tensor


def ring_divided(tensor):
    solutions.ring_all_reduce(tensor)
    return tensor.div_(dist.get_world_size())


def ring_not_in_place(tensor):
    return solutions.ring_all_reduce(tensor.clone())


def ring_receives_from_the_right(tensor):
    """Every rank waits for its right neighbour, which is waiting too: a message that never comes."""
    incoming = torch.empty_like(tensor)
    dist.recv(incoming, (dist.get_rank() + 1) % dist.get_world_size())
    return tensor.add_(incoming)


RING_CANDIDATES = {
    "solution": solutions.ring_all_reduce,
    "course's batched ring": plain_ring_all_reduce,
    "divided": ring_divided,
    "no all-gather": lambda t: _ring(t, all_gather=False),
    "tail left out": lambda t: _ring(t, chunking="floor"),
    "added twice": lambda t: _ring(t, gather_op="add"),
    "not in place": ring_not_in_place,
    "every rank waits": ring_receives_from_the_right,  # last: it costs the 3 s a rank waits
}


@pytest.fixture(scope="module")
def ring_results():
    results = exercises.check_ring_all_reduce_many(list(RING_CANDIDATES.values()), wait_s=3)
    return dict(zip(RING_CANDIDATES, results, strict=True))


@pytest.mark.launches
@pytest.mark.parametrize(
    "name, message",
    [
        ("solution", None),
        ("course's batched ring", None),
        ("divided", "rank 0's result is 1/3 of the expected sum: did you divide by the world size?"),
        ("no all-gather", "holds the full sum only in chunk 1 (elements 2 to 3)"),
        ("tail left out", "the last 1 element(s) on rank 0 (from element 6 on) are not summed"),
        ("added twice", "counts rank 0's value 2 times: a chunk was added again"),
        ("not in place", "returns the right sum, but the tensor passed in is unchanged"),
        (
            "every rank waits",
            "rank(s) 0, 1, 2 waited more than the time allowed for a message that never came",
        ),
    ],
)
def test_ring_all_reduce_checker(ring_results, name, message):
    result = ring_results[name]
    if message is None:
        assert result and str(result).startswith("passed: ring_all_reduce gives dist.all_reduce's sums")
    else:
        assert not result and message in str(result), str(result)


@pytest.mark.launches
def test_ring_all_reduce_checker_shows_no_reference_code(ring_results):
    assert_no_source(ring_results.values(), solutions.ring_all_reduce, plain_ring_all_reduce)


# --- chapter 04: gradients averaged in buckets ------------------------------------------------


def sync_per_parameter(model, bucket_bytes):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def sync_divided_twice(model, bucket_bytes):
    for p in model.parameters():
        p.grad /= dist.get_world_size()
    solutions.bucketed_gradient_sync(model, bucket_bytes)


def sync_flat(model, bucket_bytes, *, divide=True, shift=0, skip_last=False):
    """All gradients in one bucket (right for a large ``bucket_bytes``), with a mistake to plant."""
    params = list(model.parameters())[: -1 if skip_last else None]
    flat = torch.cat([p.grad.reshape(-1) for p in params] + [torch.zeros(shift)])
    dist.all_reduce(flat)
    if divide:
        flat /= dist.get_world_size()
    offset = shift
    for p in params:
        p.grad.copy_(flat[offset : offset + p.numel()].view_as(p))
        offset += p.numel()


def sync_reversed_async(model, bucket_bytes):
    """Correct, written otherwise: buckets filled from the last parameter (as DDP's first guess
    is), each gradient divided first, all-reduces started together and waited for at the end."""
    params = [p for p in model.parameters() if p.grad is not None][::-1]
    buckets = [[]]
    for p in params:
        if buckets[-1] and sum(q.grad.nbytes for q in buckets[-1]) + p.grad.nbytes > bucket_bytes:
            buckets.append([])
        buckets[-1].append(p)
    flats = [torch.cat([(p.grad / dist.get_world_size()).flatten() for p in b]) for b in buckets]
    works = [dist.all_reduce(flat, async_op=True) for flat in flats]
    for bucket, flat, work in zip(buckets, flats, works, strict=True):
        work.wait()
        for p, piece in zip(bucket, flat.split([p.numel() for p in bucket]), strict=True):
            p.grad.copy_(piece.view_as(p))


SYNC_CANDIDATES = {
    "solution": solutions.bucketed_gradient_sync,
    "reversed, async": sync_reversed_async,
    "not divided": lambda m, b: sync_flat(m, b, divide=False),
    "divided twice": sync_divided_twice,
    "last bucket left out": lambda m, b: sync_flat(m, b, skip_last=True),
    "slices off by one": lambda m, b: sync_flat(m, b, shift=1),
    "one all-reduce per parameter": sync_per_parameter,
    "one bucket whatever the size": sync_flat,
}


@pytest.fixture(scope="module")
def sync_results():
    results = exercises.check_bucketed_gradient_sync_many(list(SYNC_CANDIDATES.values()))
    return dict(zip(SYNC_CANDIDATES, results, strict=True))


@pytest.mark.launches
@pytest.mark.parametrize(
    "name, message",
    [
        ("solution", None),
        ("reversed, async", None),
        ("not divided", "is 2 times DDP's: the bucket was summed but not divided by the world size"),
        ("divided twice", "is 1/2 of DDP's: did you divide by the world size twice"),
        ("last bucket left out", "the gradient of '2.bias' is still this rank's own gradient"),
        ("slices off by one", "the slice copied back from the bucket is off by 1"),
        ("one all-reduce per parameter", "went in 4 all-reduces, one per parameter"),
        ("one bucket whatever the size", "one all-reduce sent 268 bytes, more than bucket_bytes"),
    ],
)
def test_bucketed_gradient_sync_checker(sync_results, name, message):
    result = sync_results[name]
    if message is None:
        assert result and str(result).startswith("passed: bucketed_gradient_sync leaves DDP's averaged")
    else:
        assert not result and message in str(result), str(result)


@pytest.mark.launches
def test_bucketed_gradient_sync_checker_shows_no_reference_code(sync_results):
    from course_utils.ddp.bucketed import BucketedDDP

    assert_no_source(sync_results.values(), solutions.bucketed_gradient_sync, BucketedDDP)


# --- chapter 08: a sampler that resumes where it was ------------------------------------------


class SamplerNoEpoch(solutions.PositionSampler):
    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


class SamplerAlwaysReset(solutions.PositionSampler):
    def set_epoch(self, epoch):
        self.position = 0
        DistributedSampler.set_epoch(self, epoch)


class SamplerCountsBatches(solutions.PositionSampler):
    def advance(self, n):
        self.position += 1


class SamplerKeepsPosition(solutions.PositionSampler):
    def set_epoch(self, epoch):
        DistributedSampler.set_epoch(self, epoch)


class SamplerFullLength(solutions.PositionSampler):
    def __len__(self):
        return self.num_samples


SAMPLERS = {
    "solution": solutions.PositionSampler,
    "the course's ResumableSampler": ResumableSampler,
    "no epoch saved": SamplerNoEpoch,
    "set_epoch always resets": SamplerAlwaysReset,
    "counts batches": SamplerCountsBatches,
    "new epoch not reset": SamplerKeepsPosition,
    "len of the whole epoch": SamplerFullLength,
}


@pytest.mark.parametrize(
    "name, message",
    [
        ("solution", None),
        ("the course's ResumableSampler", None),
        ("no epoch saved", "state_dict() keeps no epoch: the resumed sampler starts in epoch 0's order"),
        ("set_epoch always resets", "set_epoch(1) then sends the resumed run back to the start of the epoch"),
        ("counts batches", "advance(n) was called 3 times with n=2, the batch size: count samples"),
        ("new epoch not reset", "epoch 2 starts where epoch 1 was left, at sample 10"),
        ("len of the whole epoch", "len() of the resumed sampler is 11, but it yields 5 samples"),
    ],
)
def test_resumable_sampler_checker(name, message):
    result = exercises.check_resumable_sampler_many([SAMPLERS[name]])[0]
    if message is None:
        assert result and "gives ResumableSampler's samples on each of 2 and of 3 ranks" in str(result)
    else:
        assert not result and message in str(result), str(result)


def test_resumable_sampler_checker_prints_its_result_and_no_reference_code(capsys):
    results = [exercises.check_resumable_sampler(cls) for cls in SAMPLERS.values()]
    out = capsys.readouterr().out
    assert out == "".join(f"{r}\n" for r in results)
    assert_no_source(results, solutions.PositionSampler, ResumableSampler)


# --- chapter 07: a row-wise sharded lookup ----------------------------------------------------


def lookup_gathered(local_rows, ids, offsets, num_embeddings):
    """Correct, written otherwise: gather every shard (padded to one size), look up locally."""
    world = dist.get_world_size()
    size = -(-num_embeddings // world)
    padded = torch.zeros(size, local_rows.shape[1])
    padded[: len(local_rows)] = local_rows
    shards = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(shards, padded)
    return F.embedding_bag(ids, torch.cat(shards)[:num_embeddings], offsets, mode="sum")


def lookup_mean(local_rows, ids, offsets, num_embeddings):
    sums = solutions.row_wise_lookup(local_rows, ids, offsets, num_embeddings)
    lengths = torch.diff(offsets, append=torch.tensor([len(ids)])).clamp(min=1)
    return sums / lengths[:, None]


def lookup_own_rows(local_rows, ids, offsets, num_embeddings):
    rank, size = dist.get_rank(), -(-num_embeddings // dist.get_world_size())
    mine = ids // size == rank
    rows = torch.where(mine, ids - rank * size, 0)
    return F.embedding_bag(rows, local_rows, offsets, mode="sum", per_sample_weights=mine.float())


def lookup_global_index(local_rows, ids, offsets, num_embeddings):
    return F.embedding_bag(ids, local_rows, offsets, mode="sum")


LOOKUPS = {
    "solution": solutions.row_wise_lookup,
    "all shards gathered": lookup_gathered,
    "mean": lookup_mean,
    "own rows only": lookup_own_rows,
    "global id as local row": lookup_global_index,
}


@pytest.fixture(scope="module")
def lookup_results():
    results = exercises.check_row_wise_lookup_many(list(LOOKUPS.values()))
    return dict(zip(LOOKUPS, results, strict=True))


@pytest.mark.launches
@pytest.mark.parametrize(
    "name, message",
    [
        ("solution", None),
        ("all shards gathered", None),
        ("mean", "rank 0: each bag is the mean of its rows, not their sum"),
        ("own rows only", "rank 0: its bags hold only the rows rank 0 owns"),
        ("global id as local row", "A rank looked up a row its shard does not have: rank r holds rows r * 4"),
    ],
)
def test_row_wise_lookup_checker(lookup_results, name, message):
    result = lookup_results[name]
    if message is None:
        assert result and str(result).startswith("passed: row_wise_lookup gives F.embedding_bag's sums")
    else:
        assert not result and message in str(result), str(result)


@pytest.mark.launches
def test_row_wise_lookup_checker_shows_no_reference_code(lookup_results):
    from course_utils.sharding.row_wise import RowWiseEmbeddingBags

    assert_no_source(lookup_results.values(), solutions.row_wise_lookup, RowWiseEmbeddingBags)


# --- chapter 06: the 1F1B order ---------------------------------------------------------------


def order_from_course(stages, microbatches):
    """Correct, written otherwise: the course's schedule, its ``Action`` tuples as they are."""
    return [list(actions) for actions in one_f_one_b(stages, microbatches).devices]


def order_with(warmup_of, stages, microbatches, *, backward_first=False):
    """1F1B with a planted mistake: ``warmup_of(stage)`` warm-up forwards, or each steady pair
    run backward first."""
    orders = []
    for stage in range(stages):
        warmup = min(warmup_of(stage), microbatches)
        order = [f"F{j}" for j in range(warmup)]
        for i in range(microbatches - warmup):
            pair = [f"F{warmup + i}", f"B{i}"]
            order += pair[::-1] if backward_first and i else pair
        orders.append(order + [f"B{j}" for j in range(microbatches - warmup, microbatches)])
    return orders


ORDERS = {
    "solution": solutions.one_f_one_b_order,
    "the course's schedule": order_from_course,
    "GPipe": lambda p, m: order_with(lambda d: m, p, m),
    "warm-up reversed": lambda p, m: order_with(lambda d: d, p, m),
    "one warm-up forward too many": lambda p, m: order_with(lambda d: p - d, p, m),
    "backward before forward in the steady phase": lambda p, m: order_with(
        lambda d: p - 1 - d, p, m, backward_first=True
    ),
    "no cool-down": lambda p, m: [
        o[: 2 * m - (p - 1 - d)] for d, o in enumerate(solutions.one_f_one_b_order(p, m))
    ],
}


@pytest.mark.parametrize(
    "name, message",
    [
        ("solution", None),
        ("the course's schedule", None),
        ("GPipe", "stage 0 runs 4 forward(s) before its first backward: all forwards, then all backwards"),
        (
            "warm-up reversed",
            "stage 0 runs 1 forward(s) before its first backward: the warm-up counts are reversed",
        ),
        (
            "one warm-up forward too many",
            "stage 0 runs 3 forward(s) before its first backward: one forward too many",
        ),
        (
            "backward before forward in the steady phase",
            "the order of stage 0 (with 2 stages and 4 micro-batches) differs at slot 3: expected F2, got B1",
        ),
        ("no cool-down", "stage 0 runs B3 0 times: every micro-batch's backward runs once on every stage"),
    ],
)
def test_one_f_one_b_order_checker(name, message):
    result = exercises.check_one_f_one_b_order_many([ORDERS[name]])[0]
    if message is None:
        assert result and str(result).startswith("passed: one_f_one_b_order gives the 1F1B order")
    else:
        assert not result and message in str(result), str(result)


def test_one_f_one_b_order_checker_prints_its_result_and_no_reference_code(capsys):
    results = [exercises.check_one_f_one_b_order(fn) for fn in ORDERS.values()]
    assert capsys.readouterr().out == "".join(f"{r}\n" for r in results)
    assert_no_source(results, solutions.one_f_one_b_order, one_f_one_b, one_f_one_b_order)


# --- chapter 05: the Megatron-LM MLP on ranks --------------------------------------------------


def mlp_gathered(x, first_weight, first_bias, second_weight, second_bias):
    """Correct, written otherwise: gather every rank's hidden features and columns, then compute whole."""
    world = dist.get_world_size()
    hidden = F.relu(F.linear(x, first_weight, first_bias))
    hiddens = [torch.empty_like(hidden) for _ in range(world)]
    dist.all_gather(hiddens, hidden)
    columns = [torch.empty_like(second_weight) for _ in range(world)]
    dist.all_gather(columns, second_weight.contiguous())
    return F.linear(torch.cat(hiddens, 1), torch.cat(columns, 1), second_bias)


def mlp_planted(
    x, first_weight, first_bias, second_weight, second_bias, *, reduce=True, bias_early=False, divide=False
):
    out = torch.relu(x @ first_weight.T + first_bias) @ second_weight.T
    if bias_early:
        out = out + second_bias
    if reduce:
        dist.all_reduce(out)
    if divide:
        out = out / dist.get_world_size()
    return out if bias_early else out + second_bias


MLPS = {
    "solution": solutions.tensor_parallel_mlp,
    "gathered": mlp_gathered,
    "no all-reduce": lambda *a: mlp_planted(*a, reduce=False),
    "bias before the all-reduce": lambda *a: mlp_planted(*a, bias_early=True),
    "averaged": lambda *a: mlp_planted(*a, divide=True),
}


@pytest.fixture(scope="module")
def mlp_results():
    results = exercises.check_tensor_parallel_mlp_many(list(MLPS.values()))
    return dict(zip(MLPS, results, strict=True))


@pytest.mark.launches
@pytest.mark.parametrize(
    "name, message",
    [
        ("solution", None),
        ("gathered", None),
        ("no all-reduce", "rank 0: the output is only this rank's partial product"),
        ("bias before the all-reduce", "rank 0: the second layer's bias is counted 2 times"),
        ("averaged", "rank 0: the partial products were averaged, not summed"),
    ],
)
def test_tensor_parallel_mlp_checker(mlp_results, name, message):
    result = mlp_results[name]
    if message is None:
        assert result and str(result).startswith("passed: tensor_parallel_mlp gives the unsharded")
    else:
        assert not result and message in str(result), str(result)


@pytest.mark.launches
def test_tensor_parallel_mlp_checker_shows_no_reference_code(mlp_results):
    from course_utils.model_parallel.tensor_parallel import MegatronMLP

    assert_no_source(mlp_results.values(), solutions.tensor_parallel_mlp, MegatronMLP)


# --- chapter 03: a DataParallel step by hand ---------------------------------------------------


def dp_course(model, inputs, targets, devices):
    """Correct, written otherwise: the course's DataParallelByHand (its own Broadcast)."""
    return F.mse_loss(DataParallelByHand(model, devices)(inputs), targets)


def dp_deepcopy(model, inputs, targets, devices):
    outputs = [copy.deepcopy(model)(chunk) for chunk in inputs.chunk(len(devices))]
    return F.mse_loss(torch.cat(outputs), targets)


def dp_chunk_losses(model, inputs, targets, devices, *, average=False):
    pairs = zip(inputs.chunk(len(devices)), targets.chunk(len(devices)), strict=True)
    losses = [F.mse_loss(model(x), y) for x, y in pairs]
    return sum(losses) / len(losses) if average else sum(losses)


def dp_reversed(model, inputs, targets, devices):
    return F.mse_loss(torch.cat([model(x) for x in inputs.chunk(len(devices))][::-1]), targets)


DATA_PARALLEL = {
    "solution": solutions.data_parallel_loss,
    "the course's DataParallelByHand": dp_course,
    "deepcopy replicas": dp_deepcopy,
    "chunk losses summed": dp_chunk_losses,
    "chunk losses averaged": lambda *a: dp_chunk_losses(*a, average=True),
    "gathered in reverse": dp_reversed,
}


@pytest.mark.parametrize(
    "name, message",
    [
        ("solution", None),
        ("the course's DataParallelByHand", None),
        ("deepcopy replicas", "'0.weight' has no gradient after backward(): the replicas are not connected"),
        (
            "chunk losses summed",
            "6 rows on 2 devices: the loss is 0.93841, not one device's: each chunk's mean loss was added up",
        ),
        (
            "chunk losses averaged",
            "5 rows on 2 devices: the loss is 1.0036, not one device's: each chunk's mean loss counts",
        ),
        ("gathered in reverse", "the outputs were gathered in another order than the chunks were scattered"),
    ],
)
def test_data_parallel_loss_checker(name, message):
    result = exercises.check_data_parallel_loss_many([DATA_PARALLEL[name]])[0]
    if message is None:
        assert result and str(result).startswith("passed: data_parallel_loss gives one device's loss")
    else:
        assert not result and message in str(result), str(result)


def test_data_parallel_loss_checker_prints_its_result_and_no_reference_code(capsys):
    results = [exercises.check_data_parallel_loss(fn) for fn in DATA_PARALLEL.values()]
    assert capsys.readouterr().out == "".join(f"{r}\n" for r in results)
    assert_no_source(results, solutions.data_parallel_loss, DataParallelByHand)
