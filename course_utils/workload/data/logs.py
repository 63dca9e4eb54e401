"""The click-log container every chapter passes around, and mini-batches of it.

Taught in chapter 01.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from course_utils.runtime.checks import check_whole

__all__ = ["ClickLogs", "Batch", "batches", "dense_columns", "sparse_columns"]


def dense_columns(n: int) -> list[str]:
    """Criteo's names for the dense (integer) columns: ``I1 .. In``."""
    return [f"I{i + 1}" for i in range(n)]


def sparse_columns(n: int) -> list[str]:
    """Criteo's names for the categorical columns: ``C1 .. Cn``."""
    return [f"C{i + 1}" for i in range(n)]


class Batch(NamedTuple):
    """One mini-batch as torch tensors.

    dense: ``[B, n_dense]`` float32, sparse: ``[B, n_sparse]`` int64, label: ``[B]`` float32.
    """

    dense: object
    sparse: object
    label: object


@dataclass
class ClickLogs:
    """Rows of a click log, column-stacked as numpy arrays.

    dense:  ``[N, n_dense]`` float32, model-ready (``log1p`` of the raw counts).
    sparse: ``[N, n_sparse]`` int64, row ``i`` column ``t`` is an id in ``[0, cardinalities[t])``.
    label:  ``[N]`` float32, 1.0 = clicked.
    prob:   ``[N]`` float32, the true click probability (NaN where unknown, e.g. real logs).
    cardinalities: number of distinct ids per categorical column (embedding table rows).
    """

    dense: np.ndarray
    sparse: np.ndarray
    label: np.ndarray
    prob: np.ndarray
    cardinalities: tuple

    def __post_init__(self):
        self.cardinalities = tuple(int(c) for c in self.cardinalities)
        n = len(self.label)
        for name in ("dense", "sparse", "prob"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"{name} has {len(getattr(self, name))} rows but label has {n}; "
                    "all columns must have the same number of rows."
                )
        if self.sparse.ndim != 2 or self.sparse.shape[1] != len(self.cardinalities):
            raise ValueError(
                f"sparse has shape {self.sparse.shape} but there are "
                f"{len(self.cardinalities)} cardinalities; need one column per table."
            )

    # --- shape ---------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.label)

    @property
    def n_dense(self) -> int:
        return self.dense.shape[1]

    @property
    def n_sparse(self) -> int:
        return self.sparse.shape[1]

    @property
    def ctr(self) -> float:
        """Click-through rate: the fraction of rows with label 1."""
        return float(self.label.mean())

    def __repr__(self) -> str:
        return (
            f"ClickLogs({len(self)} rows, {self.n_dense} dense, {self.n_sparse} sparse, "
            f"ctr={self.ctr:.3f}, largest table {max(self.cardinalities, default=0):,} rows)"
        )

    # --- slicing -------------------------------------------------------------
    def __getitem__(self, rows) -> ClickLogs:
        """Rows by slice, integer array or boolean mask: ``logs[:1000]``, ``logs[idx]``."""
        if isinstance(rows, (int, np.integer)):
            rows = [rows]  # one row, still a ClickLogs
        return ClickLogs(
            self.dense[rows], self.sparse[rows], self.label[rows], self.prob[rows], self.cardinalities
        )

    def split(self, fraction: float) -> tuple[ClickLogs, ClickLogs]:
        """The first ``fraction`` of rows and the rest (no shuffling: rows are already i.i.d.)."""
        if not 0.0 < fraction < 1.0:
            raise ValueError(f"fraction must be strictly between 0 and 1, got {fraction}.")
        cut = int(round(len(self) * fraction))
        return self[:cut], self[cut:]

    @staticmethod
    def concat(parts: Sequence[ClickLogs]) -> ClickLogs:
        """Stack several ClickLogs with the same cardinalities, in order."""
        if not parts:
            raise ValueError("concat needs at least one ClickLogs.")
        cards = parts[0].cardinalities
        if any(p.cardinalities != cards for p in parts):
            raise ValueError("concat: the parts have different cardinalities.")
        return ClickLogs(
            *(np.concatenate([getattr(p, f) for p in parts]) for f in ("dense", "sparse", "label", "prob")),
            cards,
        )

    # --- conversions ---------------------------------------------------------
    def to_torch(self) -> Batch:
        """All rows as one :class:`Batch` of tensors (shares memory with the numpy arrays)."""
        import torch

        return Batch(
            torch.from_numpy(np.ascontiguousarray(self.dense)),
            torch.from_numpy(np.ascontiguousarray(self.sparse)),
            torch.from_numpy(np.ascontiguousarray(self.label)),
        )

    def to_pandas(self):
        """A DataFrame with columns ``label, prob, I1..I13, C1..C26`` (Criteo's names)."""
        import pandas as pd

        cols = {"label": self.label, "prob": self.prob}
        cols.update(zip(dense_columns(self.n_dense), self.dense.T, strict=False))
        cols.update(zip(sparse_columns(self.n_sparse), self.sparse.T, strict=False))
        return pd.DataFrame(cols)

    @classmethod
    def from_pandas(cls, df, cardinalities) -> ClickLogs:
        """The inverse of :meth:`to_pandas` (``prob`` may be absent: then NaN)."""
        n_sparse = len(cardinalities)
        dcols = [c for c in df.columns if re.fullmatch(r"I\d+", str(c))]
        scols = sparse_columns(n_sparse)
        missing = [c for c in ["label", *scols] if c not in df.columns]
        if missing:
            raise ValueError(f"DataFrame lacks columns {missing[:5]}; expected label, I1.., C1..C{n_sparse}.")
        prob = (
            df["prob"].to_numpy(np.float32) if "prob" in df.columns else np.full(len(df), np.nan, np.float32)
        )
        return cls(
            df[dcols].to_numpy(np.float32),
            df[scols].to_numpy(np.int64),
            df["label"].to_numpy(np.float32),
            prob,
            tuple(cardinalities),
        )

    # --- the ceiling -----------------------------------------------------------
    def bayes_auc(self) -> float:
        """AUC of the true click probability against the labels: no model can beat it
        (in expectation), so it is the ceiling a trained model is measured against."""
        if np.isnan(self.prob).any():
            raise ValueError(
                "these logs have no true click probability (real data?); "
                "bayes_auc exists only for synthetic logs."
            )
        from course_utils.workload.metrics import auc

        return auc(self.label, self.prob)

    def batches(
        self, batch_size: int, *, shuffle: bool = False, seed: int = 0, drop_last: bool = False
    ) -> Iterator[Batch]:
        """Mini-batches as torch tensors; see :func:`batches`."""
        return batches(self, batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last)


def batches(
    logs: ClickLogs, batch_size: int, *, shuffle: bool = False, seed: int = 0, drop_last: bool = False
) -> Iterator[Batch]:
    """Yield :class:`Batch` es of ``batch_size`` rows (the last one smaller unless ``drop_last``).

    With ``shuffle=True`` the row order is a permutation drawn from
    ``numpy.random.Generator(PCG64(seed))``: the same seed, the same batches.
    Pass ``seed=epoch`` (or ``base_seed + epoch``) for a new order every epoch.
    """
    import torch

    check_whole("batch_size", batch_size)
    n = len(logs)
    order = np.random.Generator(np.random.PCG64(seed)).permutation(n) if shuffle else None
    stop = n - n % batch_size if drop_last else n
    for start in range(0, stop, batch_size):
        rows = slice(start, start + batch_size) if order is None else order[start : start + batch_size]
        yield Batch(
            torch.from_numpy(np.ascontiguousarray(logs.dense[rows])),
            torch.from_numpy(np.ascontiguousarray(logs.sparse[rows])),
            torch.from_numpy(np.ascontiguousarray(logs.label[rows])),
        )
