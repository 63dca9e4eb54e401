"""A cache of hot embedding rows on the device, the whole table in host memory: LRU by hand.

A table too large for the GPU's memory (HBM) can live in host memory, with the rows the batches
use most copied into a cache of ``C`` slots on the device. Before a batch is looked up, its rows
are brought in (``prefetch``): each row already cached is a hit; each missing one is copied from
the host into a slot, whose previous row is written back first. The lookup then reads only the
cache, so it returns exactly what ``nn.EmbeddingBag`` over the whole table returns, and training
updates the cached rows, which reach the host table when evicted or flushed.

The policy is FBGEMM's LRU as its UVM cache runs it (``lru_cache_populate`` in
``fbgemm_gpu/src/split_embeddings_cache/lru_cache_populate.cu``): once per batch, over the
batch's distinct ids, with the batch's number as the time stamp of every row it uses; a missing
row takes the slot whose stamp is oldest. FBGEMM's cache is 32-way set-associative (a row may only
go to one set of 32 slots, ``DEFAULT_ASSOC``); this one is fully associative (any slot).

Hit rates: ``id_probabilities`` gives the exact probability of every id of the synthetic click
logs (``workload.data.synthetic``), and ``che_hit_rate`` the hit rate Che's approximation
predicts for LRU under independent requests with those probabilities (H. Che, Y. Tung and Z. Wang,
"Hierarchical Web caching systems: modeling, design and experimental results", IEEE JSAC 2002):
the characteristic time ``T_C`` solves ``sum_i (1 - exp(-p_i T_C)) = C`` and the hit rate is
``sum_i p_i (1 - exp(-p_i T_C))``. ``static_hit_rate`` is a cache that holds the ``C`` most
probable rows for ever: the best any cache can do without knowing the future.

Taught in chapter 07 (appendix 07d, memory tiers).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from course_utils.workload.data import synthetic

__all__ = [
    "LRUCache",
    "CachedEmbeddingBag",
    "capacity",
    "cache_tables",
    "id_probabilities",
    "measured_hit_rate",
    "che_hit_rate",
    "static_hit_rate",
]


class LRUCache:
    """``capacity`` slots on ``device`` in front of a host table ``host [N, D]`` (written back to).

    ``slots [C, D]``: the cached rows (a leaf tensor: train it in place of the table);
    ``row_of_slot [C]`` and ``slot_of_row [N]`` map between them (-1: empty, not cached);
    ``stamp [C]``: the batch that last used each slot (-1: never). Counters: ``lookups`` (ids
    looked up), ``misses`` (rows copied in), ``writebacks`` (rows written back to the host).
    """

    def __init__(self, host: torch.Tensor, capacity: int, device: torch.device | str = "cpu"):
        if host.dim() != 2:
            raise ValueError(f"host must be a table [N, D], got shape {tuple(host.shape)}")
        if not 1 <= capacity <= host.shape[0]:
            raise ValueError(f"capacity must be 1 .. {host.shape[0]} rows (the table's), got {capacity}")
        self.host, self.capacity = host, int(capacity)
        self.slots = torch.zeros(capacity, host.shape[1], dtype=host.dtype, device=device)
        self.row_of_slot = torch.full((capacity,), -1, dtype=torch.int64)
        self.slot_of_row = torch.full((host.shape[0],), -1, dtype=torch.int64)
        self.stamp = torch.full((capacity,), -1, dtype=torch.int64)
        self.batches = self.lookups = self.misses = self.writebacks = 0

    @torch.no_grad()
    def prefetch(self, ids: torch.Tensor) -> int:
        """Bring the rows of ``ids`` (any shape, int64, on the CPU) into the cache; return how many
        were missing (each copied from the host once, however often the batch uses it)."""
        self.batches += 1
        unique = torch.unique(ids.reshape(-1))
        if unique.numel() > self.capacity:
            raise ValueError(
                f"a batch uses {unique.numel()} distinct rows but the cache holds {self.capacity}: "
                "give it more slots or look up smaller batches"
            )
        slots = self.slot_of_row[unique]
        self.stamp[slots[slots >= 0]] = self.batches  # hits: used now
        missing = unique[slots < 0]
        if missing.numel():
            # the oldest slots (empty ones first, stamp -1), ties broken by slot number
            age = self.stamp * self.capacity + torch.arange(self.capacity)  # distinct keys
            victims = torch.topk(age, missing.numel(), largest=False, sorted=True).indices
            old = self.row_of_slot[victims]
            held = old >= 0
            self.host[old[held]] = self.slots[victims[held]].to(self.host.device)  # write back
            self.slot_of_row[old[held]] = -1
            self.slots[victims] = self.host[missing].to(self.slots.device)  # copy in
            self.row_of_slot[victims], self.slot_of_row[missing] = missing, victims
            self.stamp[victims] = self.batches
            self.writebacks += int(held.sum())
        self.lookups += ids.numel()
        self.misses += missing.numel()
        return missing.numel()

    def slot_ids(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` (any shape) as slot numbers; every row must be cached (``prefetch`` first)."""
        slots = self.slot_of_row[ids]
        if (slots < 0).any():
            raise KeyError("some ids are not cached: call prefetch(ids) before looking them up")
        return slots.to(self.slots.device)

    @torch.no_grad()
    def flush(self) -> None:
        """Write every cached row back to the host table (the cache keeps them)."""
        held = self.row_of_slot >= 0
        self.host[self.row_of_slot[held]] = self.slots[held].to(self.host.device)

    @property
    def hit_rate(self) -> float:
        """Lookups served by rows already cached, over all lookups so far."""
        return 1.0 - self.misses / max(self.lookups, 1)


class CachedEmbeddingBag(nn.Module):
    """``nn.EmbeddingBag(N, D, mode="sum")`` whose rows live in ``host [N, D]``, served through an
    ``LRUCache`` of ``capacity`` rows; its one parameter, ``weight``, is the cache's ``slots [C, D]``.

    ``forward(ids [B, L] int64) -> [B, D]``: brings the rows in, then sums each bag's cached rows,
    the same numbers in the same order as ``nn.EmbeddingBag``. Train it with an optimizer without
    per-row state (SGD): state kept per slot would not follow a row to the host and back.
    Call ``cache.flush()`` before reading ``host``.
    """

    def __init__(self, host: torch.Tensor, capacity: int):
        super().__init__()
        self.cache = LRUCache(host, capacity)
        self.weight = nn.Parameter(self.cache.slots)
        self.cache.slots = self.weight.data  # one storage: the optimizer's updates are the cache's
        self.num_embeddings, self.embedding_dim = host.shape

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        self.cache.prefetch(ids)
        return F.embedding_bag(self.cache.slot_ids(ids), self.weight, mode="sum")


def capacity(rows: int, load_factor: float, batch: int) -> int:
    """Slots of a table's cache: ``ceil(load_factor * rows)``, but at least one batch's ids
    (a cache must hold every row of the batch it serves), and at most the table."""
    if not 0 < load_factor <= 1:
        raise ValueError(f"load_factor is a fraction of the rows in (0, 1], got {load_factor!r}")
    return min(rows, max(math.ceil(load_factor * rows), batch))


def cache_tables(model: nn.Module, load_factor: float, batch: int) -> list[LRUCache]:
    """Put each table of a DLRM (``model.embeddings``, ``EmbeddingBag``s) behind a cache of
    ``capacity(rows, load_factor, batch)`` slots, in place; the tables become the caches' host
    tables. Returns the caches (``flush()`` them before reading ``cache.host``)."""
    for t, bag in enumerate(model.embeddings):
        rows = bag.num_embeddings
        model.embeddings[t] = CachedEmbeddingBag(
            bag.weight.detach().clone(), capacity(rows, load_factor, batch)
        )
    return [bag.cache for bag in model.embeddings]


def _count_mod(bound: int, modulus: int, lo: int, hi: int) -> int:
    """How many x in ``[0, bound)`` have ``x % modulus`` in ``[lo, hi)`` (``0 <= lo <= hi <= modulus``)."""
    full, rest = divmod(bound, modulus)
    return full * (hi - lo) + max(0, min(hi, rest) - lo)


def id_probabilities(cardinality: int) -> np.ndarray:
    """``[N]`` float64: the probability of each id of a table of ``cardinality`` rows in the
    synthetic click logs, from the generator's integer arithmetic (``synthetic._octave_ids``):
    octave ``L`` (ids ``2**L - 1 ..``) gets weight ``_OCTAVE_WEIGHT`` (its last one less) out of
    the total, picked by the low 32 bits of a draw modulo the total, and an id inside the octave by
    the high 32 bits modulo its width. Modulo bias included: exact."""
    levels = int(cardinality).bit_length()
    weight = synthetic._OCTAVE_WEIGHT
    last_lo = (1 << (levels - 1)) - 1
    total = (levels - 1) * weight + (weight * (cardinality - last_lo)) // (1 << (levels - 1))
    probs = np.empty(cardinality, dtype=np.float64)
    for octave in range(levels):
        lo = (1 << octave) - 1
        width = min(1 << octave, cardinality - lo)
        picks = (octave * weight, (octave + 1) * weight if octave < levels - 1 else total)
        p_octave = _count_mod(1 << 32, total, *picks) / 2**32
        if width & (width - 1) == 0:  # a power of two: uniform inside the octave
            probs[lo : lo + width] = p_octave / width
        else:
            full, rest = divmod(1 << 32, width)
            probs[lo : lo + width] = p_octave * (full + (np.arange(width) < rest)) / 2**32
    return probs


def measured_hit_rate(ids: torch.Tensor, capacity: int, batch: int, warm_up: int) -> float:
    """Hit rate of an ``LRUCache`` of ``capacity`` slots over ``ids [S]`` (one table's), looked up
    ``batch`` at a time, counted after the first ``warm_up`` batches (which fill the cache)."""
    cache = LRUCache(torch.empty(int(ids.max()) + 1, 0), capacity)
    for step, part in enumerate(ids.split(batch)):
        if step == warm_up:
            cache.lookups = cache.misses = 0
        cache.prefetch(part)
    return cache.hit_rate


def che_hit_rate(probs: np.ndarray, capacity: int) -> tuple[float, float]:
    """``(hit rate, T_C)`` of an LRU cache of ``capacity`` rows under independent requests with
    probabilities ``probs [N]`` (Che's approximation, module docstring); ``T_C`` in requests."""
    p = np.asarray(probs, dtype=np.float64)
    if not 0 < capacity < np.count_nonzero(p):
        raise ValueError(f"capacity must be between 1 and the {np.count_nonzero(p)} rows that occur")

    def filled(t: float) -> float:
        return float(np.sum(-np.expm1(-p * t)))

    lo, hi = 0.0, 1.0
    while filled(hi) < capacity:
        hi *= 2.0
    for _ in range(200):  # bisection: filled(t) grows with t
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if filled(mid) < capacity else (lo, mid)
    t = 0.5 * (lo + hi)
    return float(np.sum(p * -np.expm1(-p * t))), t


def static_hit_rate(probs: np.ndarray, capacity: int) -> float:
    """Hit rate of a cache holding the ``capacity`` most probable rows for ever."""
    return float(np.sort(np.asarray(probs, dtype=np.float64))[::-1][:capacity].sum())
