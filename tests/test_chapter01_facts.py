"""The numbers in quiz/chapter01-answers.md, computed by the code the chapter teaches."""

import re
from pathlib import Path

import pytest
import torch

from course_utils.workload import data
from course_utils.workload.models import DLRMConfig, memory_report

pytestmark = pytest.mark.chapter(1)

ANSWERS = (Path(__file__).resolve().parent.parent / "quiz" / "chapter01-answers.md").read_text(
    encoding="utf-8"
)
MLPERF = DLRMConfig(
    data.CRITEO_1TB_CARDINALITIES, embedding_dim=128, bottom_mlp=(512, 256), top_mlp=(1024, 1024, 512, 256)
)
GiB = 2**30


def right_option(question: int) -> str:
    """The bold option of a question in the answers file, e.g. 'A. About 10.2 GB'."""
    block = ANSWERS.split(f"### {question}.")[1].split("\n### ")[0]
    return re.search(r"\*\*([A-D]\. .*?)\*\*", block).group(1)


def test_q1_the_mlperf_model_does_not_fit_on_any_gpu_of_the_chapter_with_adam():
    report = memory_report(MLPERF, optimizer="adam")
    assert round(report.loc["total", "training_total"] / GiB) == 358
    assert report.loc["total", "training_total"] > 192e9  # the largest GPU in the chapter's plot: 192 GB
    assert right_option(1).startswith("B. The model does not fit")


def test_q2_embeddings_hold_almost_all_parameters():
    report = memory_report(MLPERF)
    assert report.loc["embeddings", "parameters"] / report.loc["total", "parameters"] > 0.999
    assert right_option(2).startswith("D. The embedding tables")


def test_q3_table_with_adam_state():
    report = memory_report(DLRMConfig((10_000_000,), embedding_dim=64), optimizer="adam")
    assert report.loc["embeddings", "weights"] == 2.56e9
    assert report.loc["embeddings", "training_total"] == 10.24e9
    assert right_option(3) == "A. About 10.2 GB" and "= 10.24 GB" in ANSWERS


def test_q4_one_pass_over_criteo_1tb_at_50k_samples_per_second():
    hours = data.CRITEO_1TB_ROWS / 50_000 / 3600
    assert hours == pytest.approx(24.3, abs=0.05)
    assert "24.3 hours" in ANSWERS and "1.2 million samples/s" in ANSWERS
    assert data.CRITEO_1TB_ROWS / 3600 == pytest.approx(1.2e6, rel=0.02)
    assert right_option(4) == "C. About a day"


def test_q6_sparse_gradients_hold_only_the_rows_a_batch_used():
    bag = torch.nn.EmbeddingBag(1000, 4, mode="sum", sparse=True)
    bag(torch.tensor([[3], [7], [3]])).sum().backward()
    assert bag.weight.grad.is_sparse and sorted(bag.weight.grad.coalesce().indices()[0].tolist()) == [3, 7]
    assert right_option(6).startswith("B. Only the rows the batch used")


def test_q5_and_q7_data_parallelism_splits_the_batch_not_the_model():
    assert right_option(5).startswith("D. All of them")
    assert right_option(7).startswith("C. Data parallelism splits the batch")


# MLPerf Training's DLRM-DCNv2 (rounds v3.0 on): the reference's --num_embeddings_per_feature,
# from the README of recommendation_v2/torchrec_dlrm in github.com/mlcommons/training
DCNV2_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip


def _chapter01_text() -> str:
    import json

    notebook = Path(__file__).resolve().parent.parent / "chapters" / "01_why_distribute.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")


def test_chapter01_dcnv2_tables_against_the_original_benchmarks():
    assert len(DCNV2_ROWS) == 26 and DCNV2_ROWS.count(40_000_000) == 5
    assert round(sum(DCNV2_ROWS) / 1e6) == 204 and round(sum(data.CRITEO_1TB_CARDINALITIES) / 1e6) == 188
    dcnv2 = memory_report(DLRMConfig(DCNV2_ROWS, embedding_dim=128)).loc["embeddings", "weights"]
    original = memory_report(MLPERF).loc["embeddings", "weights"]
    assert round(dcnv2 / GiB) == 97 and round(original / GiB, 1) == 89.5
    text = _chapter01_text()
    for claim in (
        "Five of them have exactly 40 million rows",
        "all 26 hold 204 million rows against 188 million",
        "about 97 GiB instead of 89.5 GiB",
    ):
        assert claim in text, claim


def test_chapter01_the_dcnv2_reference_tables_cost_weights_and_adagrad_state():
    """Fused Adagrad keeps one state value per parameter and stores no whole gradient: 8 bytes per
    parameter, what memory_report counts for SGD with dense gradients."""
    sgd = memory_report(MLPERF, optimizer="sgd").loc["embeddings"]
    adagrad = memory_report(MLPERF, optimizer="adagrad").loc["embeddings"]
    assert adagrad["weights"] + adagrad["optimizer_state"] == sgd["training_total"] == 8 * sgd["parameters"]
    assert "8 bytes per parameter, what our SGD column counts" in _chapter01_text()
