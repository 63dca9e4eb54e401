"""Appendix 08b: the restart cost in the checkpoint interval (formula against a seeded simulation),
incremental checkpoints of the touched rows (restored bit for bit under Adagrad; under Adam every
row once looked up changes), and the production job's ``--table-optimizer adagrad``."""

import math

import pytest

from course_utils import launch
from course_utils.checkpoint import interval
from course_utils.checkpoint.incremental_run import incremental_run
from course_utils.runtime import elastic_run

pytestmark = [pytest.mark.chapter(8), pytest.mark.launches]

C, M = 60.0, 42.8 * 3600  # a one-minute save, a failure every 42.8 hours


def test_the_best_interval_does_not_depend_on_the_restart_cost_but_the_overhead_does():
    best = [interval.best_interval(C, M, r) for r in (0.0, 600.0, 3600.0)]
    assert max(best) - min(best) < 1e-6 * best[0]
    assert best[0] == pytest.approx(interval.young_daly_interval(C, M), rel=0.01)  # C << M
    with_restart = interval.expected_overhead(best[0], C, M, 600.0)
    without = interval.expected_overhead(best[0], C, M, 0.0)
    # the restart multiplies the expected wall time by e^(R/M): about R / M more overhead
    assert with_restart - without == pytest.approx(math.expm1(600.0 / M) * (1 + without), rel=1e-9)
    assert with_restart - without == pytest.approx(600.0 / M, rel=0.05)
    assert interval.first_order_overhead(best[0], C, M, 600.0) == pytest.approx(with_restart, rel=0.01)


def test_the_simulated_overhead_agrees_with_the_formula():
    tau = interval.young_daly_interval(C, M)
    for restart in (0.0, 1800.0):
        for t in (tau / 4, tau, 4 * tau):
            run = interval.simulate_overhead(t, C, M, restart, work_seconds=2000 * M, seed=3)
            assert run["failures"] > 1500
            assert run["overhead"] == pytest.approx(interval.expected_overhead(t, C, M, restart), rel=0.06)


def test_bad_interval_arguments_are_refused():
    with pytest.raises(ValueError, match="restart_seconds not negative"):
        interval.expected_overhead(10.0, C, M, -1.0)
    assert math.isclose(interval.young_daly_interval(2.0, 4.0), 4.0)


def _both(folder):
    """Both optimizers' incremental runs, then a DCP round trip of the job's Adagrad optimizer."""
    import torch.distributed as dist

    from course_utils.checkpoint import incremental, load_sharded, save_sharded
    from course_utils.sharding.hybrid import HybridDLRM
    from course_utils.sharding.table_optimizer import hybrid_optimizer
    from course_utils.workload import data
    from course_utils.workload.models import DLRMConfig
    from course_utils.workload.train import train_step

    out = {name: incremental_run(name, f"{folder}/{name}", saves=2) for name in ("adagrad", "adam")}
    logs = data.make_click_logs(256, seed=1)
    config = DLRMConfig(cardinalities=logs.cardinalities)
    models = [HybridDLRM(config, "row_wise", seed=s) for s in (0, 1)]
    optimizers = [hybrid_optimizer(m, "adagrad", 1e-2, 0.05) for m in models]
    for batch in logs.batches(64):
        rows = len(batch.label) // 2
        part = type(batch)(*(t[dist.get_rank() * rows : (dist.get_rank() + 1) * rows] for t in batch))
        train_step(models[0], optimizers[0], part)
    save_sharded(models[0], optimizers[0], f"{folder}/dcp")
    load_sharded(models[1], optimizers[1], f"{folder}/dcp")
    out["dcp_differ"] = incremental.differing_tensors(models[0], optimizers[0], models[1], optimizers[1])
    return out


def test_a_base_and_deltas_restore_adagrads_tables_bit_for_bit_and_adam_moves_every_row_seen(tmp_path):
    for name in ("adagrad", "adam"):
        (tmp_path / name).mkdir()
    ranks = launch(_both, str(tmp_path), world_size=2, timeout=120)
    for rank in ranks:
        adagrad, adam = rank["adagrad"], rank["adam"]
        assert adagrad["differ"] == [] and adagrad["base_alone_differ"]  # the deltas restore it all
        assert adagrad["changed"] == adagrad["touched"]  # no row without a gradient moved
        assert all(d < adagrad["full_bytes"] / 4 for d in adagrad["delta_bytes"])
        assert adam["changed"] == adam["ever"] and adam["changed"][-1] > adam["touched"][-1]
        assert adam["differ"]  # so a delta of the touched rows misses rows that moved
        assert rank["dcp_differ"] == []  # the job's DCP checkpoint holds Adagrad's state too


def test_the_job_trains_with_adagrad_tables_and_refuses_to_resume_with_the_other_optimizer(tmp_path):
    from course_utils.scripts import job_checks, job_optimizer

    job = dict(module="course_utils.scripts.train_hybrid", out_flag="--checkpoint-dir", timeout=240)
    args = ["--steps", 10, "--checkpoint-every", 5, "--table-optimizer", "adagrad", "--table-lr", 0.05]
    run = elastic_run.run_elastic(tmp_path, script_args=[*args, "--synthetic-rows", 8192], **job)
    assert [e["step"] for e in run.events if e["event"] == "finished"] == [10, 10]
    job_optimizer.check_checkpoint_optimizer(tmp_path, "adagrad")
    with pytest.raises(job_checks.JobInputError, match="trained with --table-optimizer adagrad, not adam"):
        job_optimizer.check_checkpoint_optimizer(tmp_path, "adam")
