"""Tests of course_utils.workload.models: the DLRM against brute force, and the memory arithmetic."""

import pytest
import torch

from course_utils.workload import data
from course_utils.workload.models import (
    DLRM,
    OPTIMIZER_STATE_COPIES,
    DLRMConfig,
    DotInteraction,
    EmbeddingTables,
    format_bytes,
    memory_report,
)

pytestmark = pytest.mark.chapter(1)

CARDS = [3, 10, 100, 1000]


def small_model(**kw):
    return DLRM(CARDS, n_dense=5, embedding_dim=8, bottom_mlp=(16,), top_mlp=(12, 6), **kw)


def inputs(batch=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    dense = torch.rand(batch, 5, generator=g)
    sparse = torch.stack([torch.randint(0, c, (batch,), generator=g) for c in CARDS], dim=1)
    return dense, sparse


def test_forward_shape_and_dtype():
    model = small_model()
    dense, sparse = inputs()
    out = model(dense, sparse)
    assert out.shape == (7,) and out.dtype == torch.float32


def test_init_is_deterministic_and_seeded():
    a, b, c = small_model(seed=1), small_model(seed=1), small_model(seed=2)
    torch.manual_seed(123)  # the global RNG must not matter
    d = small_model(seed=1)
    for pa, pb, _pc, pd in zip(a.parameters(), b.parameters(), c.parameters(), d.parameters(), strict=False):
        assert torch.equal(pa, pb) and torch.equal(pa, pd)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters(), strict=False))


def test_embed_matches_row_lookup():
    model = small_model()
    _, sparse = inputs()
    emb = model.embed(sparse)
    assert emb.shape == (7, 4, 8)
    for t, bag in enumerate(model.embeddings):
        assert isinstance(bag, torch.nn.EmbeddingBag) and bag.mode == "sum"
        torch.testing.assert_close(emb[:, t], bag.weight[sparse[:, t]])


def test_dot_interaction_matches_brute_force():
    model = small_model()
    g = torch.Generator().manual_seed(0)
    bottom, embedded = torch.randn(3, 8, generator=g), torch.randn(3, 4, 8, generator=g)
    out = model.interact(bottom, embedded)
    vectors = [bottom] + [embedded[:, t] for t in range(4)]
    dots = [(vectors[i] * vectors[j]).sum(1) for i in range(5) for j in range(i + 1, 5)]
    expected = torch.cat([bottom, torch.stack(dots, dim=1)], dim=1)
    assert out.shape == (3, 8 + 10)
    torch.testing.assert_close(out, expected)


def test_forward_is_the_three_steps():
    model = small_model()
    dense, sparse = inputs()
    by_parts = model.interact_and_predict(model.bottom(dense), model.embed(sparse))
    torch.testing.assert_close(model(dense, sparse), by_parts)


#: small_model(seed=0)'s state_dict: its keys in order, and each tensor's sum of absolute values.
#: Chapters print parameter names and store numbers trained from this start, and checkpoints
#: name their entries so: the parts the DLRM is made of must keep them.
PINNED_STATE = {
    "embeddings.0.weight": 6.203305,
    "embeddings.1.weight": 13.669439,
    "embeddings.2.weight": 40.289106,
    "embeddings.3.weight": 125.607471,
    "bottom.0.weight": 23.178632,
    "bottom.0.bias": 0.0,
    "bottom.2.weight": 29.358641,
    "bottom.2.bias": 0.0,
    "top.0.weight": 46.632509,
    "top.0.bias": 0.0,
    "top.2.weight": 21.413247,
    "top.2.bias": 0.0,
    "top.4.weight": 2.203145,
    "top.4.bias": 0.0,
}


def test_state_dict_names_and_initial_values_are_pinned():
    state = small_model(seed=0).state_dict()
    assert list(state) == list(PINNED_STATE)
    for name, total in PINNED_STATE.items():
        assert float(state[name].double().abs().sum()) == pytest.approx(total, abs=1e-5), name
    torch.testing.assert_close(
        state["embeddings.0.weight"][0, :3], torch.tensor([-0.0043225177, 0.30971584, -0.47518533])
    )


def test_the_dlrm_is_made_of_parts():
    model = small_model()
    assert isinstance(model.embeddings, EmbeddingTables) and isinstance(model.interaction, DotInteraction)
    assert [name for name, _ in model.named_children()] == ["embeddings", "bottom", "top", "interaction"]
    dense, sparse = inputs()
    assert torch.equal(model.embed(sparse), model.embeddings(sparse))
    bottom = model.bottom(dense)
    embedded = model.embeddings(sparse)
    assert torch.equal(model.interact(bottom, embedded), model.interaction(bottom, embedded))
    assert not list(model.interaction.parameters())  # and its buffers are not saved:
    assert not any(key.startswith("interaction") for key in model.state_dict())
    some = model.embeddings[1:]  # a slice of the tables looks its own tables up
    assert isinstance(some, EmbeddingTables) and some.cardinalities.tolist() == CARDS[1:]
    assert torch.equal(some(sparse[:, 1:]), model.embed(sparse)[:, 1:])


def test_hybrid_dense_arch_is_the_same_parts():
    from course_utils.sharding.hybrid import DenseArch

    model = small_model(seed=3)
    dense_arch = DenseArch(model)
    for name in ("bottom", "interaction", "top"):
        mine, theirs = getattr(dense_arch, name), getattr(model, name)
        assert type(mine) is type(theirs) and mine is not theirs  # a copy, of the same class
    dense_keys = [key for key in model.state_dict() if not key.startswith("embeddings.")]
    assert list(dense_arch.state_dict()) == dense_keys
    assert all(torch.equal(dense_arch.state_dict()[k], model.state_dict()[k]) for k in dense_keys)
    dense, sparse = inputs()
    embedded = model.embed(sparse)
    assert torch.equal(dense_arch(dense, embedded), model.interact_and_predict(model.bottom(dense), embedded))


def test_parameter_groups_split_the_model():
    model = small_model()
    emb = {id(p) for p in model.embedding_parameters()}
    dense = {id(p) for p in model.dense_parameters()}
    assert not emb & dense and emb | dense == {id(p) for p in model.parameters()}
    assert len(emb) == 4
    dense_in, sparse_in = inputs()
    model(dense_in, sparse_in).sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.parametrize(
    "cfg",
    [
        DLRMConfig((3, 10, 100, 1000), n_dense=5, embedding_dim=8, bottom_mlp=(16,), top_mlp=(12, 6)),
        DLRMConfig(tuple(data.criteo_cardinalities(1 / 1000))),
        DLRMConfig((50,) * 3, n_dense=13, embedding_dim=4, bottom_mlp=(), top_mlp=()),
    ],
)
def test_analytic_counts_match_a_real_model(cfg):
    model = cfg.build(seed=0)
    assert cfg.embedding_parameter_count() == sum(p.numel() for p in model.embedding_parameters())
    assert cfg.dense_parameter_count() == sum(p.numel() for p in model.dense_parameters())
    report = memory_report(model, optimizer="adam")
    assert report.loc["total", "parameters"] == sum(p.numel() for p in model.parameters())
    assert report.loc["total", "weights"] == sum(p.numel() * p.element_size() for p in model.parameters())


def test_memory_report_optimizer_state_and_gradients():
    cfg = DLRMConfig((1000, 2000), n_dense=4, embedding_dim=10, bottom_mlp=(8,), top_mlp=(6,))
    weights = memory_report(cfg, "sgd").loc["embeddings", "weights"]
    assert weights == 3000 * 10 * 4
    for name, copies in OPTIMIZER_STATE_COPIES.items():
        rep = memory_report(cfg, name)
        assert rep.loc["embeddings", "optimizer_state"] == copies * weights
        assert rep.loc["embeddings", "gradients"] == weights
        assert (
            rep.loc["total", "training_total"]
            == rep.loc["total", ["weights", "gradients", "optimizer_state"]].sum()
        )
    assert memory_report(cfg, "adam").loc["embeddings", "training_total"] == 4 * weights
    with pytest.raises(ValueError, match="optimizer"):
        memory_report(cfg, "lamb")


def test_optimizer_state_copies_match_torch():
    """SGD keeps nothing, momentum one buffer, Adagrad one sum, Adam two moments."""
    model = small_model()
    dense, sparse = inputs()
    n_params = sum(p.numel() for p in model.parameters())
    makers = {
        "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
        "sgd_momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
        "adagrad": lambda p: torch.optim.Adagrad(p, lr=0.1),
        "adam": lambda p: torch.optim.Adam(p, lr=0.1),
    }
    for name, make in makers.items():
        opt = make(model.parameters())
        model(dense, sparse).sum().backward()
        opt.step()
        state = sum(
            v.numel() for s in opt.state.values() for k, v in s.items() if torch.is_tensor(v) and k != "step"
        )  # Adam's step counter is one scalar
        assert state == OPTIMIZER_STATE_COPIES[name] * n_params, name


def test_memory_report_of_a_model_that_does_not_fit():
    """The MLPerf DLRM on Criteo 1TB: counted, never built."""
    cfg = DLRMConfig(
        data.CRITEO_1TB_CARDINALITIES,
        embedding_dim=128,
        bottom_mlp=(512, 256),
        top_mlp=(1024, 1024, 512, 256),
    )
    rep = memory_report(cfg, "adagrad")
    rows = sum(data.CRITEO_1TB_CARDINALITIES)
    assert rep.loc["embeddings", "parameters"] == rows * 128
    assert rep.loc["embeddings", "weights"] == rows * 128 * 4 > 89 * 2**30  # 89.5 GiB (96 GB)
    assert rep.loc["embeddings", "weights"] / rep.loc["total", "weights"] > 0.99
    assert format_bytes(rep.loc["embeddings", "weights"]).endswith("GiB")


def test_bad_input_is_a_clear_error():
    model = small_model()
    dense, sparse = inputs()
    with pytest.raises(ValueError, match=r"\[B, 4\]"):
        model(dense, sparse[:, :3])
    bad = sparse.clone()
    bad[0, 2] = 100
    with pytest.raises(IndexError, match="table 2 has 100 rows"):
        model(dense, bad)
    with pytest.raises(TypeError, match="int64"):
        model(dense, sparse.int())
    with pytest.raises(ValueError, match=r"\[B, 5\]"):
        model(dense[:, :4], sparse)
    with pytest.raises(ValueError, match="cardinalities"):
        DLRMConfig((10, 0))


def test_format_bytes():
    assert format_bytes(512) == "512 B"
    assert format_bytes(1536) == "1.5 KiB"
    assert format_bytes(3 * 2**30) == "3 GiB"


# --- chapter 01's prose on the MLPerf DLRM-DCNv2 tables (the figures it states, recomputed) -----

# MLPerf Training's DLRM-DCNv2 (rounds v3.0 on): the reference's --num_embeddings_per_feature,
# from the README of recommendation_v2/torchrec_dlrm in github.com/mlcommons/training
DCNV2_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
MLPERF = DLRMConfig(
    data.CRITEO_1TB_CARDINALITIES, embedding_dim=128, bottom_mlp=(512, 256), top_mlp=(1024, 1024, 512, 256)
)


def _chapter01_text() -> str:
    import json
    from pathlib import Path

    notebook = Path(__file__).resolve().parent.parent / "chapters" / "01_why_distribute.ipynb"
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    return " ".join(" ".join("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")


def test_chapter01_dcnv2_tables_against_the_original_benchmarks():
    assert len(DCNV2_ROWS) == 26 and DCNV2_ROWS.count(40_000_000) == 5
    assert round(sum(DCNV2_ROWS) / 1e6) == 204 and round(sum(data.CRITEO_1TB_CARDINALITIES) / 1e6) == 188
    dcnv2 = memory_report(DLRMConfig(DCNV2_ROWS, embedding_dim=128)).loc["embeddings", "weights"]
    original = memory_report(MLPERF).loc["embeddings", "weights"]
    assert round(dcnv2 / 2**30) == 97 and round(original / 2**30, 1) == 89.5
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
