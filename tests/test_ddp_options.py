"""What torch's DDP asks of every rank: uneven inputs (Join), unused parameters, buffers,
the first iteration's single bucket; and the canonical torchrun script's evaluation."""

import json

import pytest
import torch

from course_utils import launch
from course_utils.ddp import options, uneven, wrap
from course_utils.runtime import runner
from course_utils.runtime.launcher import RankFailedError
from course_utils.workload import data
from course_utils.workload.models import DLRMConfig

pytestmark = [pytest.mark.chapter(4), pytest.mark.launches]


def test_join_lets_ranks_with_different_batch_counts_finish_with_equal_weights():
    out = launch(
        uneven.train_uneven, [2, 4], True, world_size=2, timeout=60, init_group=False, show_output=False
    )
    assert [r["steps"] for r in out] == [2, 4]
    assert torch.equal(out[0]["weight"], out[1]["weight"])


def test_without_join_the_longer_rank_times_out_in_its_all_reduce():
    with pytest.raises(RankFailedError, match="rank 1 .*Timed out"):
        launch(
            uneven.train_uneven,
            [2, 4],
            False,
            2.0,
            world_size=2,
            timeout=60,
            init_group=False,
            show_output=False,
        )


def test_an_unused_parameter_stops_torch_ddp_unless_it_looks_for_unused_parameters():
    stopped = launch(options.train_with_unused_head, False, world_size=2, timeout=60, show_output=False)
    assert all(r["steps"] == 1 and "find_unused_parameters=True" in r["error"] for r in stopped)
    fine = launch(options.train_with_unused_head, True, world_size=2, timeout=60, show_output=False)
    assert fine == [{"steps": 3, "error": None}] * 2


def test_buffers_are_rank_0s_with_broadcast_and_each_rank_own_without():
    synced = launch(options.running_means, True, world_size=2, timeout=60, show_output=False)
    apart = launch(options.running_means, False, world_size=2, timeout=60, show_output=False)
    assert torch.equal(synced[0], synced[1]) and not torch.allclose(apart[0], apart[1])
    assert torch.equal(apart[0], synced[0])  # rank 0's own statistics either way


def test_torch_ddp_first_iteration_has_one_bucket_with_every_gradient():
    logs = data.make_click_logs(500, seed=0)
    config = DLRMConfig(logs.cardinalities)

    def rank_fn():
        model = wrap(config.build(seed=0), "torch")
        sizes = str(model._get_ddp_logging_data()["bucket_sizes"]).split(",")
        return [int(s) for s in sizes], sum(p.numel() * 4 for p in model.parameters())

    sizes, total = launch(rank_fn, world_size=2, timeout=60, show_output=False)[0]
    assert sizes == [total]


def test_canonical_script_pads_evaluation_rows_and_the_exact_split_matches_one_process():
    run = runner.run_torchrun(
        "course_utils.scripts.ddp_canonical_os_exit",  # ddp_canonical.main, then os._exit
        nproc_per_node=2,
        timeout=180,
        args=["--rows", "1000", "--epochs", "1"],
    )
    first = run.reports[0]
    assert first["rows_counted"] == {"padded": 102, "drop_last": 100, "exact": 101}
    assert first["rows_read"] == 500 and first["steps"] == 2
    loss = first["logloss"]
    assert loss["exact"] == pytest.approx(loss["one process"], abs=1e-6)
    # a repeated row, a missing row: other means (how far depends on those rows' losses)
    assert loss["padded"] != pytest.approx(loss["exact"], abs=1e-7)
    assert loss["drop_last"] != pytest.approx(loss["exact"], abs=1e-7)
    assert run.reports[1]["logloss"]["exact"] == loss["exact"]


def test_the_canonical_script_on_one_rank_trains_what_its_one_process_twin_trains(tmp_path):
    """One batch per epoch, so the shuffles (sampler against DataLoader) only reorder a sum."""
    from course_utils.scripts import one_process

    args = ["--rows", "512", "--epochs", "2", "--batch", "512"]
    run = runner.run_torchrun(
        "course_utils.scripts.ddp_canonical_os_exit", nproc_per_node=1, timeout=180, args=args
    )
    one_process.main([*args, "--out", str(tmp_path)])
    twin = json.loads((tmp_path / "report.json").read_text())
    assert run.reports[0]["steps"] == twin["steps"] == 2
    assert run.reports[0]["logloss"]["one process"] == pytest.approx(twin["logloss"], abs=1e-6)
