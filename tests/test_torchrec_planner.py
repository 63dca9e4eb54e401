"""TorchRec's planner on modeled H100s (appendix 07b): MLPerf's tables refused by one GPU and placed
on 2 and 8, each fix of section 4 fitting one GPU, memory per rank against chapter 07's arithmetic.

TorchRec is not a course dependency: without it these tests skip, unless
``COURSE_REQUIRE_TORCHREC=1`` (set by ``.ci/run``'s TorchRec part), where a missing or broken
torchrec is a failure. The planner runs in this process (no ranks).
"""

import os

import pytest

from course_utils.sharding import mlperf
from course_utils.sharding.torchrec_dlrm import torchrec_missing

pytestmark = [pytest.mark.chapter(7)]

MISSING = torchrec_missing()
REQUIRED = os.environ.get("COURSE_REQUIRE_TORCHREC") == "1"

if MISSING is not None:
    if REQUIRED:
        raise RuntimeError(f"COURSE_REQUIRE_TORCHREC=1 but torchrec does not import: {MISSING}")
    pytest.skip(f"torchrec does not import here ({MISSING})", allow_module_level=True)

from course_utils.sharding import torchrec_planner as tp  # noqa: E402

GIB = 2**30


def test_the_topology_is_in_torchrecs_units():
    t = tp.h100_topology(16)
    assert t.world_size == 16 and t.local_world_size == 8
    assert t.devices[0].storage.hbm == 80 * GIB and t.devices[0].storage.ddr == 256 * GIB
    assert t.intra_host_bw == 450e9 / 1e3 and t.inter_host_bw == 50e9 / 1e3  # bytes per millisecond


def test_one_gpu_refuses_in_one_line_and_two_fit():
    one = tp.plan_tables(1)
    assert one.plan is None and one.error.startswith("PlannerError: ") and "\n" not in one.error
    two = tp.plan_tables(2)
    assert two.error is None
    rows = tp.planner_rank_rows(two.stats)
    assert [r["rank"] for r in rows] == [0, 1]
    ours = tp.rank_memory(two.plan, 2)
    # every table placed once, on some rank: the two ranks hold all rows (data-parallel ones twice)
    dp = [int(line.split()[0][1:]) for line in tp.placement(two.plan) if " DP " in line]
    total = sum(4 * (n * mlperf.DIM + n) for n in mlperf.TABLE_ROWS)
    assert sum(ours) == total + sum(
        4 * (mlperf.TABLE_ROWS[t] * mlperf.DIM + mlperf.TABLE_ROWS[t]) for t in dp
    )
    for r, mine in zip(rows, ours, strict=True):  # the planner's column: ours plus one batch's buffers
        assert 0 < r["hbm_gb"] - mine / GIB < 2


@pytest.mark.parametrize(
    "options, value_bytes",
    [(dict(data_type="fp16"), 2), (dict(dim=64), 4), (dict(max_rows=10_000_000), 4)],
)
def test_each_fix_fits_one_gpu(options, value_bytes):
    planned = tp.plan_tables(1, **options)
    assert planned.error is None
    held = tp.rank_memory(planned.plan, 1, value_bytes=value_bytes, dim=options.get("dim", mlperf.DIM),
                          max_rows=options.get("max_rows"))[0]  # fmt: skip
    assert held < 80 * GIB * (1 - tp.RESERVED)


def test_uvm_caching_moves_tables_to_host_memory():
    planned = tp.plan_tables(1, kernels=("fused", "dense", "fused_uvm_caching"))
    assert planned.error is None
    assert any("fused_uvm_caching" in line for line in tp.placement(planned.plan))
    assert tp.planner_rank_rows(planned.stats)[0]["ddr_gb"] > 0


def test_eight_gpus_split_the_hottest_table_and_replicate_small_ones():
    lines = {line.split()[0]: line.split()[1] for line in tp.placement(tp.plan_tables(8).plan)}
    hottest = f"t{max(range(len(mlperf.MULTI_HOT)), key=mlperf.MULTI_HOT.__getitem__)}"
    assert lines[hottest] == "RW"
    big = [f"t{t}" for t, n in enumerate(mlperf.TABLE_ROWS) if n >= 1_000_000 and f"t{t}" != hottest]
    assert {lines[name] for name in big} == {"TW"}
    assert "DP" in lines.values()


def test_pooling_factors_are_mean_lengths():
    import torch
    from torchrec import KeyedJaggedTensor

    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(7), lengths=torch.tensor([2, 0, 1, 1, 2, 1]))
    assert tp.pooling_factors(kjt) == {"a": 1.0, "b": 4 / 3}
