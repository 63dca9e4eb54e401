"""A DLRM-style click model, and the memory arithmetic of any size of it.

    dense  [B, n_dense] --bottom MLP--> x [B, D] ----------------------------+
    sparse [B, T] --one EmbeddingBag per table--> e [B, T, D]                |
    z = [x, e_1 .. e_T]  [B, T+1, D];  pairwise dots z_i . z_j (i < j)  [B, P]  |
    top MLP([x, dots])  [B, D + P]  -->  logit [B]                        <--+

with ``P = (T + 1) T / 2``. The model is made of parts, each a module of its own:
the sparse arch ``model.embeddings`` (``EmbeddingTables``: the tables and their lookup),
the bottom MLP ``model.bottom``, the interaction ``model.interaction`` (``DotInteraction``)
and the top (over) MLP ``model.top``. Later chapters shard the first and replicate the
others (``sharding.hybrid.DenseArch`` is made of the same three parts).

Taught in chapter 01.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from course_utils.runtime.checks import check_choice, check_ids, check_sizes, check_whole, check_width

__all__ = [
    "DLRMConfig",
    "DLRM",
    "EmbeddingTables",
    "DotInteraction",
    "memory_report",
    "OPTIMIZERS",
    "OPTIMIZER_STATE_COPIES",
    "format_bytes",
]

#: The optimizers the course trains with, by name: ``(torch class, its options besides lr,
#: extra float copies of every parameter it keeps)``. ``train.make_optimizer`` builds them,
#: ``memory_report`` and ``sharding.MemoryBudget`` count their state.
OPTIMIZERS = {
    "sgd": (torch.optim.SGD, {}, 0),
    "sgd_momentum": (torch.optim.SGD, {"momentum": 0.9}, 1),
    "adagrad": (torch.optim.Adagrad, {}, 1),
    "adam": (torch.optim.Adam, {}, 2),
    "adamw": (torch.optim.AdamW, {}, 2),
}

#: Extra float copies of every parameter an optimizer keeps.
OPTIMIZER_STATE_COPIES = {name: copies for name, (_, _, copies) in OPTIMIZERS.items()}


@dataclass(frozen=True)
class DLRMConfig:
    """The size of a DLRM: enough to count its parameters without building it.

    cardinalities: rows of each embedding table (one table per categorical column).
    embedding_dim: D, the width of every embedding and of the bottom MLP's output.
    bottom_mlp: hidden widths of the bottom MLP (n_dense -> ... -> D).
    top_mlp: hidden widths of the top MLP (D + P -> ... -> 1).
    """

    cardinalities: tuple
    n_dense: int = 13
    embedding_dim: int = 16
    bottom_mlp: tuple = (64,)
    top_mlp: tuple = (64, 32)

    def __post_init__(self):
        cards = check_sizes(self.cardinalities)
        check_whole("embedding_dim", self.embedding_dim)
        check_whole("n_dense", self.n_dense)
        object.__setattr__(self, "cardinalities", cards)
        object.__setattr__(self, "bottom_mlp", tuple(int(w) for w in self.bottom_mlp))
        object.__setattr__(self, "top_mlp", tuple(int(w) for w in self.top_mlp))

    @property
    def n_tables(self) -> int:
        return len(self.cardinalities)

    @property
    def n_interactions(self) -> int:
        """P: pairwise dot products among the T + 1 vectors."""
        return (self.n_tables + 1) * self.n_tables // 2

    def bottom_widths(self) -> list[int]:
        return [self.n_dense, *self.bottom_mlp, self.embedding_dim]

    def top_widths(self) -> list[int]:
        return [self.embedding_dim + self.n_interactions, *self.top_mlp, 1]

    def embedding_parameter_count(self) -> int:
        return sum(self.cardinalities) * self.embedding_dim

    def dense_parameter_count(self) -> int:
        """Weights and biases of both MLPs."""
        return sum(
            a * b + b
            for widths in (self.bottom_widths(), self.top_widths())
            for a, b in zip(widths[:-1], widths[1:], strict=False)
        )

    def build(self, seed: int = 0, sparse_gradients: bool = False) -> DLRM:
        """Allocate the model (check ``memory_report(config)`` first for big ones)."""
        return DLRM(
            self.cardinalities,
            n_dense=self.n_dense,
            embedding_dim=self.embedding_dim,
            bottom_mlp=self.bottom_mlp,
            top_mlp=self.top_mlp,
            seed=seed,
            sparse_gradients=sparse_gradients,
        )


def _mlp(widths: Sequence[int], last_relu: bool) -> nn.Sequential:
    layers = []
    for i, (a, b) in enumerate(zip(widths[:-1], widths[1:], strict=False)):
        layers.append(nn.Linear(a, b))
        if last_relu or i < len(widths) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


class EmbeddingTables(nn.ModuleList):
    """The sparse arch: one ``EmbeddingBag`` per table, ``forward(sparse [B, T]) -> [B, T, D]``.

    A ``ModuleList`` of the bags, so that a table's weight is ``embeddings.<t>.weight``,
    in a DLRM's ``state_dict`` as everywhere else (and a slice is an ``EmbeddingTables`` too).
    """

    def __init__(self, bags: Iterable[nn.EmbeddingBag] = ()):
        super().__init__(bags)
        rows = [bag.num_embeddings for bag in self]
        self.register_buffer("cardinalities", torch.tensor(rows, dtype=torch.int64), persistent=False)

    def forward(self, sparse: torch.Tensor) -> torch.Tensor:
        """Look up one id per table per row: ``sparse [B, T] int64 -> [B, T, D]``."""
        check_ids(sparse, self.cardinalities, name="sparse")
        return torch.stack([bag(sparse[:, t : t + 1]) for t, bag in enumerate(self)], dim=1)


class DotInteraction(nn.Module):
    """The interaction of ``T`` tables' vectors with the bottom MLP's: ``forward([B, D], [B, T, D])
    -> [B, D + P]``, the bottom output followed by the strictly upper triangle of the Gram matrix
    of the ``T + 1`` vectors (row-major order: pairs (0,1), (0,2), .., (T-1,T)). No parameters."""

    def __init__(self, n_tables: int):
        super().__init__()
        upper_i, upper_j = torch.triu_indices(n_tables + 1, n_tables + 1, offset=1)
        self.register_buffer("upper_i", upper_i, persistent=False)
        self.register_buffer("upper_j", upper_j, persistent=False)

    def forward(self, bottom_out: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        z = torch.cat([bottom_out.unsqueeze(1), embedded], dim=1)  # [B, T+1, D]
        gram = torch.bmm(z, z.transpose(1, 2))  # [B, T+1, T+1]
        return torch.cat([bottom_out, gram[:, self.upper_i, self.upper_j]], dim=1)


class DLRM(nn.Module):
    """Embedding bags + bottom MLP + dot interaction + top MLP -> one logit per row.

    Parts: ``embeddings`` (``EmbeddingTables``), ``bottom`` (MLP), ``interaction``
    (``DotInteraction``) and ``top`` (MLP); the parameters are named ``embeddings.<t>.weight``,
    ``bottom.<i>.weight``, ``top.<i>.bias``, ...

    Initialisation is deterministic given ``seed`` (and independent of the
    global torch RNG), as in the DLRM reference code: a table of ``n`` rows
    ``U(-1/sqrt(n), 1/sqrt(n))`` (rarely seen rows of big tables start near 0),
    linear weights Xavier-uniform, biases zero.

    sparse_gradients: tables get sparse gradients (only the rows a batch used),
    which SGD and Adagrad accept (Adam does not); see chapter 01.
    """

    def __init__(
        self,
        cardinalities: Sequence[int],
        *,
        n_dense: int = 13,
        embedding_dim: int = 16,
        bottom_mlp: Sequence[int] = (64,),
        top_mlp: Sequence[int] = (64, 32),
        seed: int = 0,
        sparse_gradients: bool = False,
    ):
        super().__init__()
        self.config = DLRMConfig(
            tuple(cardinalities), n_dense, embedding_dim, tuple(bottom_mlp), tuple(top_mlp)
        )
        cfg = self.config
        self.embeddings = EmbeddingTables(
            nn.EmbeddingBag(c, embedding_dim, mode="sum", sparse=sparse_gradients) for c in cfg.cardinalities
        )
        self.bottom = _mlp(cfg.bottom_widths(), last_relu=True)
        self.top = _mlp(cfg.top_widths(), last_relu=False)
        self.interaction = DotInteraction(cfg.n_tables)
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        for bag in self.embeddings:
            bound = bag.num_embeddings**-0.5
            bag.weight.uniform_(-bound, bound, generator=gen)
        for layer in [*self.bottom, *self.top]:
            if isinstance(layer, nn.Linear):
                nn.init.xavier_uniform_(layer.weight, generator=gen)
                layer.bias.zero_()

    # --- the two parts, separately addressable --------------------------------
    def embedding_parameters(self) -> Iterator[nn.Parameter]:
        """The embedding tables' weights (sharded in later chapters)."""
        return self.embeddings.parameters()

    def dense_parameters(self) -> Iterator[nn.Parameter]:
        """The MLPs' weights and biases (replicated with DDP in later chapters)."""
        yield from self.bottom.parameters()
        yield from self.top.parameters()

    # --- forward, in three steps -----------------------------------------------
    def embed(self, sparse: torch.Tensor) -> torch.Tensor:
        """Look up one id per table per row: ``sparse [B, T] int64 -> [B, T, D]`` (``EmbeddingTables``)."""
        return self.embeddings(sparse)

    def interact(self, bottom_out: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """Dot interaction: ``[B, D]`` and ``[B, T, D]`` -> ``[B, D + P]`` (``DotInteraction``)."""
        return self.interaction(bottom_out, embedded)

    def interact_and_predict(self, bottom_out: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
        """Everything after the lookups: ``[B, D]``, ``[B, T, D]`` -> logit ``[B]``.
        A model-parallel DLRM looks embeddings up elsewhere and calls this."""
        return self.top(self.interaction(bottom_out, embedded)).squeeze(1)

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """``dense [B, n_dense] float32``, ``sparse [B, T] int64`` -> logit ``[B]`` float32."""
        check_width(dense, "dense", self.config.n_dense)
        return self.interact_and_predict(self.bottom(dense), self.embed(sparse))


def format_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``: binary units (1 GiB = 2**30 bytes), three significant figures."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1024


def memory_report(config, optimizer: str = "adam", bytes_per_value: int = 4, readable: bool = False):
    """Parameters and training memory per part, computed from the configuration alone.

    config: a :class:`DLRMConfig` or a :class:`DLRM` (only its config is used),
        so a model far too big to allocate can be reported.
    optimizer: one of :data:`OPTIMIZER_STATE_COPIES` (state = copies x parameters).
    Gradients are counted dense (one value per parameter). Activations are not
    counted (they scale with the batch, not with the tables).
    Returns a DataFrame indexed ``embeddings, dense, total`` with columns
    ``parameters, weights, gradients, optimizer_state, training_total`` (bytes),
    or, with ``readable=True``, the same as text (``"2.1 GiB"``).
    """
    import pandas as pd

    cfg = config.config if isinstance(config, DLRM) else config
    check_choice("optimizer", optimizer, OPTIMIZER_STATE_COPIES)
    copies = OPTIMIZER_STATE_COPIES[optimizer]
    rows = {"embeddings": cfg.embedding_parameter_count(), "dense": cfg.dense_parameter_count()}
    rows["total"] = rows["embeddings"] + rows["dense"]
    table = pd.DataFrame(
        {
            "parameters": rows,
            "weights": {k: v * bytes_per_value for k, v in rows.items()},
            "gradients": {k: v * bytes_per_value for k, v in rows.items()},
            "optimizer_state": {k: v * bytes_per_value * copies for k, v in rows.items()},
        }
    )
    table["training_total"] = table["weights"] + table["gradients"] + table["optimizer_state"]
    table = table.astype("int64")
    if readable:
        return table.apply(
            lambda col: col.map((lambda n: f"{n:,}") if col.name == "parameters" else format_bytes)
        )
    return table
