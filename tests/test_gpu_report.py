"""course_utils.scripts.gpu_report on this machine: with fewer than two GPUs it writes every section
from the modeled cluster alone (on the meta device), says that nothing was measured, and its
modeled figures are the cluster's exact ones."""

from __future__ import annotations

import re

import pytest

from course_utils.ddp import overlap
from course_utils.scripts import gpu_report

pytestmark = [pytest.mark.chapter(4), pytest.mark.launches]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_report")
    return out, gpu_report.build_report(out, quick=True).read_text()


def _ms(text: str, first_cell: str) -> float:
    """The modeled column of the table row that starts with ``first_cell``."""
    match = re.search(rf"^\| {re.escape(first_cell)} \| ([0-9.]+) \| - \| - \|$", text, re.M)
    assert match, f"no row {first_cell!r} with a modeled time and nothing measured"
    return float(match.group(1))


def test_without_gpus_the_report_is_the_model_alone_and_says_so(report):
    out, text = report
    assert "- modeled: modeled H100 SXM on NVLink" in text
    assert "- measured: nothing: 0 GPU(s) here, fewer than 2 ranks" in text
    for section in ("## 1. All-reduce", "## 2. DDP overlap", "## 3. Pipeline bubble", "## 4. Embedding"):
        assert section in text
    assert "No GPU here: this section needs one" in text
    for figure in ("bandwidth.png", "ddp_buckets.png", "pipeline.png"):
        assert (out / figure).stat().st_size > 1000 and f"]({figure})" in text


def test_the_modeled_all_reduce_is_the_ring_formula_written_out(report):
    _, text = report
    # 2 ranks on NVLink 4 (5 us, 450 GB/s): 2 (w - 1) (alpha + n / (w beta)), in ms
    for nbytes in (1024, 1 << 20):
        assert _ms(text, f"{nbytes:,}") == pytest.approx(2 * (5e-6 + nbytes / (2 * 450e9)) * 1e3, abs=1e-4)


def test_the_modeled_ddp_variants_cost_at_least_the_step_without_communication(report):
    _, text = report
    alone = _ms(text, "none (0)")
    naive = _ms(text, f"naive ({len(list(overlap.tower(128, 8).parameters()))})")  # one per parameter
    assert naive > _ms(text, "bucketed 0.25 MiB (2)") > _ms(text, "bucketed 64 MiB (1)") > alone


def test_the_sharding_rows_give_the_bytes_each_scheme_moved(report):
    _, text = report
    rows = re.findall(
        r"^\| (table-wise|row-wise|column-wise) \(([0-9,]+)\) \| [0-9.]+ \| - \| - \|$", text, re.M
    )
    assert [kind for kind, _ in rows] == ["table-wise", "row-wise", "column-wise"]
    assert all(int(moved.replace(",", "")) > 0 for _, moved in rows)


def test_the_cluster_follows_the_gpu_name():
    assert gpu_report.cluster_for(["Tesla T4", "Tesla T4"]).label.startswith("modeled T4")
    assert "PCIe Gen3" in gpu_report.cluster_for(["Tesla T4"]).network.name
    assert gpu_report.cluster_for(["NVIDIA A100-SXM4-80GB"]).device.name.startswith("A100")
    assert gpu_report.side_by_side(0.002, 0.003) == "2.0000 | 3.0000 | 1.50"


def test_one_rank_is_refused():
    with pytest.raises(SystemExit, match="--ranks must be at least 2"):
        gpu_report.build_report(None, ranks=1)
