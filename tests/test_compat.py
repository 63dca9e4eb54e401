"""course_utils.runtime.compat (torch's private APIs) and versions (the version-proof pieces):
all-to-all with and without the backend's collective, torch.distributed.pipelining's handshake and
step options, and the engine lines that show_rank_output leaves out (gloo's connection report, c10
logs)."""

import types

import pytest
import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage

from course_utils import launch
from course_utils.runtime import compat, versions
from course_utils.runtime.launcher.output import engine_line, show_rank_output

pytestmark = pytest.mark.chapter(2, 7)


def _pieces(rank, world, dtype, uneven=False):
    """Rank r's piece for rank j: values 100 r + 10 j + k, 2 of them (j + 1 if ``uneven``)."""
    return [(100 * rank + 10 * j + torch.arange(j + 1 if uneven else 2)).to(dtype) for j in range(world)]


def _expected(rank, world, dtype, uneven=False):
    """What rank r receives from each rank s: s's piece for r."""
    return [_pieces(s, world, dtype, uneven)[rank] for s in range(world)]


def all_to_all_both_ways():
    # the backends' all_to_all may need pieces of one size (gloo does); the pairs take any sizes
    rank, world = dist.get_rank(), dist.get_world_size()
    failures = []
    for dtype in (torch.float32, torch.int64):
        for name, fn, uneven in (
            ("all_to_all", versions.all_to_all, False),
            ("by_pairs", versions.all_to_all_by_pairs, False),
            ("by_pairs uneven", versions.all_to_all_by_pairs, True),
        ):
            outs = [torch.empty_like(e) for e in _expected(rank, world, dtype, uneven)]
            fn(outs, _pieces(rank, world, dtype, uneven))
            if not all(
                torch.equal(o, e) for o, e in zip(outs, _expected(rank, world, dtype, uneven), strict=False)
            ):
                failures.append(f"{name} {dtype}: {[o.tolist() for o in outs]}")
    return failures, sorted(versions._LACK_ALL_TO_ALL)


@pytest.mark.launches
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_all_to_all_and_its_fallback_give_the_definition(world_size):
    results = launch(all_to_all_both_ways, world_size=world_size, timeout=60)
    assert [failures for failures, _ in results] == [[]] * world_size
    lacking = {tuple(map(tuple, lack)) for _, lack in results}
    assert len(lacking) == 1  # every rank took the same path
    assert lacking.pop() in ((), (("gloo", "cpu"),))


def all_to_all_where_the_backend_refuses():
    """dist.all_to_all refused as gloo refuses it in torch 2.9: the pairs run, once asked, then always."""
    rank, world = dist.get_rank(), dist.get_world_size()
    calls = []

    def refuse(*args, **kwargs):
        calls.append(1)
        raise RuntimeError("Backend gloo does not support alltoall")

    real, dist.all_to_all = dist.all_to_all, refuse
    versions._LACK_ALL_TO_ALL.clear()
    try:
        results = []
        for _ in range(2):
            outs = [torch.empty(2) for _ in range(world)]
            versions.all_to_all(outs, _pieces(rank, world, torch.float32))
            results.append(
                all(
                    torch.equal(o, e)
                    for o, e in zip(outs, _expected(rank, world, torch.float32), strict=False)
                )
            )
    finally:
        dist.all_to_all = real
    return results, len(calls), sorted(versions._LACK_ALL_TO_ALL)


@pytest.mark.launches
def test_all_to_all_falls_back_to_pairs_and_remembers():
    for results, calls, lacking in launch(all_to_all_where_the_backend_refuses, world_size=3, timeout=60):
        assert results == [True, True]
        assert calls == 1
        assert lacking == [("gloo", "cpu")]


def all_to_all_other_errors_are_raised():
    def broken(*args, **kwargs):
        raise RuntimeError("something else")

    real, dist.all_to_all = dist.all_to_all, broken
    try:
        versions.all_to_all([torch.empty(1)] * 2, [torch.ones(1)] * 2)
    except RuntimeError as exc:
        return str(exc)
    finally:
        dist.all_to_all = real


@pytest.mark.launches
def test_all_to_all_does_not_hide_other_errors():
    assert launch(all_to_all_other_errors_are_raised, world_size=2, timeout=60) == ["something else"] * 2


def pairs_on_a_subgroup():
    rank = dist.get_rank()
    groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]  # every rank creates every group
    mine = groups[rank % 2]
    outs = [torch.empty(1), torch.empty(1)]
    versions.all_to_all_by_pairs(
        outs, [torch.tensor([10.0 * rank]), torch.tensor([10.0 * rank + 1])], group=mine
    )
    return [int(o.item()) for o in outs]


@pytest.mark.launches
def test_pairs_on_a_subgroup_use_group_ranks():
    # group [0, 2]: rank 0 sends 0 to itself and 1 to rank 2; rank 2 sends 20 to rank 0 and keeps 21
    assert launch(pairs_on_a_subgroup, world_size=4, timeout=60) == [[0, 20], [10, 30], [1, 21], [11, 31]]


@pytest.mark.launches
def test_pairs_check_the_number_of_pieces():
    def wrong_count():
        try:
            versions.all_to_all_by_pairs([torch.empty(1)], [torch.ones(1)])
        except ValueError as exc:
            return str(exc)

    assert launch(wrong_count, world_size=2, timeout=60)[0] == (
        "all_to_all needs one input and one output per rank (2), got 1 inputs and 1 outputs"
    )


def p2p_batches_posted():
    """The batches all_to_all_by_pairs and the isend/irecv demo post: (op name, peer) lists."""
    from course_utils.collectives import runs

    rank, world = dist.get_rank(), dist.get_world_size()
    batches, real = [], dist.batch_isend_irecv

    def record(ops):
        batches.append(sorted((op.op.__name__, op.peer) for op in ops))
        return real(ops)

    dist.batch_isend_irecv = record
    try:
        versions.all_to_all_by_pairs(
            [torch.empty(2) for _ in range(world)], _pieces(rank, world, torch.float32)
        )
        runs.demo_isend_irecv()
    finally:
        dist.batch_isend_irecv = real
    return batches


@pytest.mark.launches
def test_every_send_is_posted_with_the_receives_in_one_batch():
    for rank, batches in enumerate(launch(p2p_batches_posted, world_size=3, timeout=60)):
        others = [peer for peer in range(3) if peer != rank]
        assert batches == [
            sorted([("irecv", p) for p in others] + [("isend", p) for p in others]),
            sorted([("isend", (rank + 1) % 3), ("irecv", (rank - 1) % 3)]),
        ]


# --- torch.distributed.pipelining --------------------------------------------------


def test_init_handshake_is_float32_both_ways():
    ops = [types.SimpleNamespace(tensor=torch.zeros(1)), types.SimpleNamespace(tensor=torch.tensor(3))]
    fixed = versions.fix_init_handshake(ops)
    assert fixed is ops and [op.tensor.dtype for op in ops] == [torch.float32] * 2
    assert [op.tensor.numel() * op.tensor.element_size() for op in ops] == [4, 4]
    assert ops[1].tensor.item() == 3.0


def stage_handshake_dtypes():
    from course_utils.pipeline.torch_pipelining import Stage

    stage = Stage(torch.nn.Linear(2, 2), dist.get_rank(), dist.get_world_size(), torch.device("cpu"))
    return [
        (op.op.__name__, op.tensor.dtype, op.tensor.numel()) for op in stage._get_init_p2p_neighbors_ops()
    ]


@pytest.mark.launches
@pytest.mark.skipif(
    not hasattr(PipelineStage, "_get_init_p2p_neighbors_ops"),
    reason="this torch's PipelineStage has no neighbour handshake (torch 2.15 dropped it)",
)
def test_course_pipeline_stage_sends_what_its_neighbour_expects():
    first, last = launch(stage_handshake_dtypes, world_size=2, timeout=60)
    assert sorted(first) == [("irecv", torch.float32, 1), ("isend", torch.float32, 1)]
    assert sorted(last) == [("irecv", torch.float32, 1), ("isend", torch.float32, 1)]


def test_step_options_follow_the_schedules_signature():
    class Old:  # torch 2.9
        def step(self, *args, target=None, losses=None, **kwargs):
            pass

    class New:  # torch 2.13
        def step(self, *args, target=None, losses=None, return_outputs=True, **kwargs):
            pass

    assert not versions.step_accepts_return_outputs(Old())
    assert versions.step_accepts_return_outputs(New())


# --- what show_rank_output leaves out ----------------------------------------------

ENGINE_LINES = [
    "[Gloo] Rank 0 is connected to 2 peer ranks. Expected number of connected peer ranks is : 2",
    "[Gloo] Rank 1 is NOT connected to: [2]",
    "[W1122 15:30:01.123456 4242 socket.cpp:12] [c10d] a warning",
    "[I1122 15:30:01.123456 4242 ProcessGroupNCCL.cpp:12] info",
    "[rank0]:[W1122 15:30:01.123456 4242 ProcessGroupNCCL.cpp:12] a warning with a rank prefix",
    "[W socket.cpp:663] [c10d] the older format",
]
RANK_LINES = [
    "hello",
    "[rank 0] printed by the rank",
    "[Info] a user's bracket",
    "Gloo [Gloo] Rank 0 is connected",
    "[Gloo] Rank 1 is NOT connected, says the rank",
]


def test_engine_lines_are_recognised_and_nothing_else():
    assert [engine_line(line) for line in ENGINE_LINES] == [True] * len(ENGINE_LINES)
    assert [engine_line(line) for line in RANK_LINES] == [False] * len(RANK_LINES)


def test_show_rank_output_drops_engine_lines(tmp_path, capsys):
    for rank in range(2):
        folder = tmp_path / "run" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text("\n".join([ENGINE_LINES[0], f"line from {rank}"]) + "\n")
        (folder / "stderr.log").write_text("\n".join(ENGINE_LINES[1:] + [f"error from {rank}"]) + "\n")
    show_rank_output(tmp_path, 2)
    out, err = capsys.readouterr()
    assert out == "[rank 0] line from 0\n[rank 1] line from 1\n"
    assert err == "[rank 0] error from 0\n[rank 1] error from 1\n"


def test_reusable_stager_stages_again_or_is_none():
    """torch 2.11's DefaultStager works once (chapter 08's async_save failed there with
    ``KeyError: <class 'type'>`` on the second save); the course then lets async_save make its own."""
    staging = pytest.importorskip("torch.distributed.checkpoint.staging")
    options = staging.StagingOptions(False, False, False, False)
    stager = versions.reusable_stager(options)
    if stager is None:  # this torch's stager is single-use: the course must not reuse it
        once = staging.DefaultStager(options)
        once.stage({"t": torch.ones(2)})
        with pytest.raises(KeyError):
            once.stage({"t": torch.ones(2)})
        return
    state = {"t": torch.arange(3.0), "step": 7}
    for _ in range(3):
        staged = stager.stage(state)
        assert torch.equal(staged["t"], state["t"]) and staged["step"] == 7
    stager.close()


# --- private torch APIs, each behind one compat function -------------------------------------


def ddp_buckets_with_one_ignored():
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 300), torch.nn.Linear(300, 2000))
    compat.ddp_ignore(model, ["0.bias"])
    ddp = DDP(model)
    first = compat.ddp_bucket_sizes(ddp)
    for _ in range(3):
        ddp(torch.randn(2, 4)).sum().backward()
    return first, compat.ddp_bucket_sizes(ddp)


@pytest.mark.launches
def test_ddp_bucket_sizes_before_and_after_the_rebuild_without_the_ignored():
    four = 4  # bytes per float32
    weight1, bias1, weight0 = 300 * 2000 * four, 2000 * four, 4 * 300 * four  # 0.bias ignored
    for first, rebuilt in launch(ddp_buckets_with_one_ignored, world_size=2, timeout=60):
        assert first == {"first": [weight1 + bias1 + weight0], "rebuilt": []}
        # gradients arrive last layer first; the first bucket closes past 1 MiB
        assert rebuilt == {"first": [weight1 + bias1 + weight0], "rebuilt": [weight1 + bias1, weight0]}


def test_module_tree_copy_shares_parameters_until_set_and_copies_buffers():
    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.BatchNorm1d(2))
    replica = compat.module_tree_copy(model, torch.device("cpu"))
    assert replica is not model and replica[0] is not model[0] and replica[0].weight is model[0].weight
    assert replica[1].running_mean is not model[1].running_mean
    assert torch.equal(replica[1].running_mean, model[1].running_mean)
    linked = model[0].weight * 1  # no Parameter: setattr would refuse it
    compat.set_parameter(replica, "0.weight", linked)
    assert replica[0].weight is linked and isinstance(model[0].weight, torch.nn.Parameter)
    replica(torch.ones(3, 2)).pow(2).sum().backward()
    assert model[0].weight.grad is not None  # through the linked copy, to the original


def test_cuda_probes_and_dynamo_import():
    import sys

    assert compat.cuda_compiled() == (torch.version.cuda is not None or torch.version.hip is not None)
    if not compat.cuda_compiled():
        assert torch.cuda.device_count() == 0
    compat.import_dynamo()
    assert "torch._dynamo" in sys.modules


@pytest.mark.parametrize("module", [compat, versions])
def test_the_docstring_index_and_all_name_every_public_helper(module):
    """What the module defines, its ``__all__`` and its docstring's index are one list: a helper
    missing from one of them is one a reader of the index, or ``import *``, would not find."""
    import ast
    import inspect

    tree = ast.parse(inspect.getsource(module))
    defined = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.ClassDef):
            defined.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            defined |= {t.id for t in targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.ImportFrom):  # a torch class under a name of the module's own
            defined |= {alias.asname for alias in node.names if alias.asname}
    public = {name for name in defined if not name.startswith("_")} - {"__all__"}
    assert set(module.__all__) == public
    indexed = {name for name in public if f"``{name}``" in module.__doc__ or f"``{name}(" in module.__doc__}
    assert indexed == public, f"not in {module.__name__}'s docstring: {sorted(public - indexed)}"
