"""course_utils.scripts.gpu_report on this machine: with fewer than two GPUs it runs on gloo,
says so, and writes all four sections with their figures."""

from __future__ import annotations

import pytest

from course_utils.scripts import gpu_report


def test_the_report_runs_on_cpu_and_says_it_is_not_a_gpu_network(tmp_path):
    path = gpu_report.build_report(tmp_path, quick=True)
    text = path.read_text()
    assert "gloo on 2 CPU processes" in text and "not a GPU network's" in text
    for section in (
        "## 1. All-reduce bandwidth",
        "## 2. DDP overlap",
        "## 3. Pipeline bubble",
        "## 4. Embedding",
    ):
        assert section in text
    for figure in ("bandwidth.png", "ddp_buckets.png", "pipeline.png"):
        assert (tmp_path / figure).stat().st_size > 1000 and f"]({figure})" in text
    assert text.count("| table-wise |") == 1 and "alpha-beta fit: alpha" in text


def test_one_rank_is_refused():
    with pytest.raises(SystemExit, match="--ranks must be at least 2"):
        gpu_report.build_report(None, ranks=1)
