"""Appendix 07d: the LRU cache of embedding rows, its hit rate against Che's approximation, the
modeled cost of its misses, and FP16 / INT8 tables."""

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from course_utils import Cluster
from course_utils.sharding import cache, cache_steps, quantized
from course_utils.workload import data

pytestmark = pytest.mark.chapter(7)


def _skewed_ids(n, rows, seed=0):
    return torch.from_numpy(data.make_click_logs(n, seed=seed, cardinalities=[rows], n_dense=0).sparse[:, 0])


def test_cached_lookup_equals_embedding_bag_bit_for_bit():
    g = torch.Generator().manual_seed(1)
    table = torch.randn(500, 4, generator=g)
    bags = _skewed_ids(30 * 8 * 4, 500, seed=2).reshape(30, 8, 4)
    bag = cache.CachedEmbeddingBag(table.clone(), capacity=40)
    for batch in bags:
        assert torch.equal(bag(batch), F.embedding_bag(batch, table, mode="sum"))
    c = bag.cache
    assert c.lookups == bags.numel() and 0 < c.misses < c.lookups and c.writebacks == c.misses - 40
    assert torch.equal(table, c.host)  # nothing trained: what went back is what came in


def test_cache_refuses_a_batch_larger_than_itself_and_uncached_ids():
    c = cache.LRUCache(torch.zeros(100, 2), capacity=3)
    with pytest.raises(ValueError, match="distinct rows but the cache holds 3"):
        c.prefetch(torch.tensor([1, 2, 3, 4]))
    with pytest.raises(KeyError, match="prefetch"):
        c.slot_ids(torch.tensor([5]))
    with pytest.raises(ValueError, match="capacity"):
        cache.LRUCache(torch.zeros(10, 2), capacity=11)


def test_lru_evicts_the_least_recently_used_row():
    c = cache.LRUCache(torch.arange(10.0)[:, None], capacity=3)
    for batch in ([0, 1], [2], [0], [3]):  # row 1 is the oldest when row 3 arrives
        c.prefetch(torch.tensor(batch))
    assert sorted(c.row_of_slot.tolist()) == [0, 2, 3] and c.slot_of_row[1] == -1
    assert (c.misses, c.writebacks) == (4, 1)


def test_training_through_the_cache_keeps_the_table_of_uncached_training():
    g = torch.Generator().manual_seed(0)
    table = torch.randn(300, 8, generator=g)
    batches = _skewed_ids(25 * 64 * 2, 300, seed=4).reshape(25, 64, 2)
    upstream = torch.randn(64, 8, generator=g)
    plain = nn.EmbeddingBag.from_pretrained(table.clone(), freeze=False, mode="sum")
    cached = cache.CachedEmbeddingBag(table.clone(), capacity=80)
    for module in (plain, cached):
        sgd = torch.optim.SGD(module.parameters(), lr=0.1)
        for batch in batches:
            sgd.zero_grad()
            (module(batch) * upstream).sum().backward()
            sgd.step()
    assert cached.cache.writebacks > 0  # rows did go back to the host and come in again
    cached.cache.flush()
    torch.testing.assert_close(cached.cache.host, plain.weight.detach(), rtol=0, atol=1e-5)
    assert not torch.equal(cached.cache.host, table)


def test_cache_tables_gives_each_table_of_a_dlrm_its_cache():
    from course_utils.workload.models import DLRM

    cards = [1000, 50, 8]
    model = DLRM(cards, seed=0)
    before = [bag.weight.detach().clone() for bag in model.embeddings]
    caches = cache.cache_tables(model, load_factor=0.1, batch=64)
    assert [c.capacity for c in caches] == [100, 50, 8]
    logs = data.make_click_logs(64, seed=0, cardinalities=cards)
    with torch.no_grad():
        reference = DLRM(cards, seed=0)(torch.from_numpy(logs.dense), torch.from_numpy(logs.sparse))
        assert torch.equal(model(torch.from_numpy(logs.dense), torch.from_numpy(logs.sparse)), reference)
    assert all(torch.equal(c.host, b) for c, b in zip(caches, before, strict=True))


@pytest.mark.parametrize("rows", [1, 7, 16, 1000, 101_312])
def test_id_probabilities_sum_to_one_and_follow_the_octaves(rows):
    p = cache.id_probabilities(rows)
    assert p.shape == (rows,) and abs(p.sum() - 1) < 1e-12
    assert (np.diff(p) <= 1e-15).all()  # id 0 the most frequent, never rising


def test_id_probabilities_match_the_generator():
    rows, n = 5000, 1 << 19
    p = cache.id_probabilities(rows)
    seen = np.bincount(_skewed_ids(n, rows, seed=9).numpy(), minlength=rows) / n
    for lo, hi in ((0, 1), (1, 3), (3, 7), (63, 127), (4095, rows)):  # whole octaves: many draws each
        expected = p[lo:hi].sum()
        assert abs(seen[lo:hi].sum() - expected) < 5 * np.sqrt(expected / n), (lo, hi)


def test_che_is_exact_for_uniform_ids():
    p = np.full(1000, 1 / 1000)
    hit, t_c = cache.che_hit_rate(p, 250)
    assert abs(hit - 0.25) < 1e-9 and abs(np.sum(-np.expm1(-p * t_c)) - 250) < 1e-6
    assert abs(cache.static_hit_rate(p, 250) - 0.25) < 1e-12


def test_che_rises_with_the_cache_and_stays_below_the_static_cache():
    p = cache.id_probabilities(20_000)
    rates = [cache.che_hit_rate(p, c)[0] for c in (100, 1000, 5000)]
    assert rates == sorted(rates)
    assert all(r < cache.static_hit_rate(p, c) for r, c in zip(rates, (100, 1000, 5000), strict=True))
    with pytest.raises(ValueError, match="capacity"):
        cache.che_hit_rate(p, 20_000)


def test_measured_lru_hit_rate_is_within_two_points_of_che():
    rows, slots, batch = 10_000, 1000, 256
    p = cache.id_probabilities(rows)
    che, t_c = cache.che_hit_rate(p, slots)
    warm = int(np.ceil(3 * t_c / batch))
    ids = _skewed_ids(warm * batch + (1 << 17), rows, seed=6)
    measured = cache.measured_hit_rate(ids, slots, batch, warm_up=warm)
    assert abs(measured - che) < 0.02, (measured, che)
    assert measured < cache.static_hit_rate(p, slots)


def test_capacity_holds_a_batch_and_at_most_the_table():
    assert cache.capacity(10_000, 0.2, 512) == 2000
    assert cache.capacity(10_000, 0.01, 512) == 512
    assert cache.capacity(100, 0.2, 512) == 100
    with pytest.raises(ValueError, match="load_factor"):
        cache.capacity(100, 0.0, 8)


def test_host_copy_is_alpha_plus_bytes_over_beta():
    gpu = Cluster("h100", "pcie")
    link = gpu.network
    assert cache_steps.host_copy_seconds(0, 128, gpu) == 0.0
    assert cache_steps.host_copy_seconds(1000, 128, gpu) == pytest.approx(
        link.latency_s + 1000 * 128 * 4 / link.bandwidth_Bps, rel=1e-12
    )


def test_prefetch_hides_copies_shorter_than_the_compute_and_waits_for_longer_ones():
    gpu = Cluster("h100", "pcie")
    compute, copies = 1e-3, [2e-4, 3e-4, 1.5e-3, 1e-4]
    plain, _ = cache_steps.modeled_steps(compute, copies, gpu, prefetch=False)
    assert plain.tolist() == [round((compute + c) * 1e9) for c in copies]
    ahead, timeline = cache_steps.modeled_steps(compute, copies, gpu, prefetch=True)
    # step 0 waits for its own rows; step 2's copy (1.5 ms) ran beside step 1 and outlasts it by 0.5 ms
    assert ahead.tolist() == [1_200_000, 1_000_000, 1_500_000, 1_000_000]
    assert {s.lane for s in timeline.spans} == {"compute", "host link"}


def test_step_compute_does_not_depend_on_the_table_sizes():
    gpu = Cluster("h100", "pcie")
    small = cache_steps.step_compute_seconds([100, 50], 16, 64, gpu)
    large = cache_steps.step_compute_seconds([100_000_000, 50], 16, 64, gpu)
    assert small == large > 0


def test_miss_counts_add_up_the_tables_caches():
    cards = [2000, 30]
    ids = torch.from_numpy(data.make_click_logs(8 * 64, seed=1, cardinalities=cards, n_dense=0).sparse)
    misses = cache_steps.miss_counts(ids, cards, 0.1, 64)
    first = len(torch.unique(ids[:64, 0])) + len(torch.unique(ids[:64, 1]))
    assert misses.shape == (8,) and misses[0] == first and misses[1:].sum() > 0
    assert cache_steps.miss_counts(ids, cards, 1.0, 64).sum() == sum(
        len(torch.unique(ids[:, t])) for t in (0, 1)
    )


def test_fp16_and_int8_stay_within_their_error_bounds():
    g = torch.Generator().manual_seed(3)
    table = torch.randn(400, 16, generator=g) * torch.logspace(-3, 1, 400)[:, None]
    half = quantized.dequantized(table, "fp16")
    assert ((half - table).abs() <= table.abs().clamp_min(2**-14) * 2**-11).all()  # subnormals: absolute
    q, scale, bias = quantized.quantize_rowwise_int8(table)
    assert q.dtype == torch.uint8 and torch.equal(bias, table.min(dim=1).values)
    error = (quantized.dequantize_rowwise_int8(q, scale, bias) - table).abs()
    assert (error <= scale[:, None] * (0.5 + 1e-3)).all()
    assert torch.equal(quantized.dequantized(table, "fp32"), table)


def test_int8_layout_is_torchs_fused_8bit_rowwise():
    g = torch.Generator().manual_seed(4)
    table = torch.randn(300, 12, generator=g) * 0.05
    mine, theirs = quantized.fused_rowwise_int8(table), torch.ops.quantized.embedding_bag_byte_prepack(table)
    assert mine.shape == theirs.shape == (300, 12 + 8) and mine.dtype == theirs.dtype == torch.uint8
    assert torch.equal(mine[:, -8:], theirs[:, -8:])  # scale and bias, float32, the same bytes
    assert (mine[:, :-8].int() - theirs[:, :-8].int()).abs().max() <= 1  # a midpoint may round either way
    ids = torch.arange(300)
    torch.testing.assert_close(
        torch.ops.quantized.embedding_bag_byte_rowwise_offsets(theirs, ids, ids),
        quantized.dequantized(table, "int8"),
        rtol=0,
        atol=float(table.abs().max()) * 2 / 255,
    )


def test_bytes_per_row_and_table():
    assert [quantized.row_bytes(128, f) for f in ("fp32", "fp16", "int8")] == [512, 256, 136]
    assert quantized.table_bytes([10, 20], 16, "int8") == 30 * 24
    assert quantized.table_bytes(5, 4, "fp16") == 40
    with pytest.raises(ValueError):
        quantized.row_bytes(16, "int4")


def test_with_tables_as_changes_only_the_tables():
    from course_utils.workload.models import DLRM

    model = DLRM([300, 40], seed=0)
    copy = quantized.with_tables_as(model, "int8")
    assert all(
        torch.equal(a, b) for a, b in zip(model.dense_parameters(), copy.dense_parameters(), strict=True)
    )
    assert torch.equal(
        copy.embeddings[0].weight, quantized.dequantized(model.embeddings[0].weight.detach(), "int8")
    )
