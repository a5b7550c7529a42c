"""Row-sparse gradients (MXNet ``row_sparse``, MindSpore sparse gradients of LazyAdam)."""
from __future__ import annotations

import numpy as np


class RowSparse:
    """The gradient of a parameter that is zero except on some rows of its first axis.

    ``rows[k]`` is the gradient of row ``indices[k]``; ``rows`` has shape
    ``(len(indices),) + param.shape[1:]``. Duplicate indices are allowed and their rows
    are summed (``coalesce``), as torch does for sparse COO gradients. With
    ``lazy_update`` an optimizer updates only the listed rows (and their states);
    otherwise the gradient is used as the dense array ``to_dense``."""

    __slots__ = ("indices", "rows")

    def __init__(self, indices, rows):
        self.indices = np.asarray(indices)
        self.rows = np.asarray(rows)

    def coalesce(self) -> "RowSparse":
        """Sorted unique indices; rows of repeated indices summed."""
        uniq, inverse = np.unique(self.indices, return_inverse=True)
        if len(uniq) == len(self.indices):
            order = np.argsort(self.indices, kind="stable")
            return RowSparse(self.indices[order].astype(np.int64),
                             np.ascontiguousarray(self.rows[order]))
        summed = np.zeros((len(uniq),) + self.rows.shape[1:], self.rows.dtype)
        np.add.at(summed, inverse.reshape(-1), self.rows)
        return RowSparse(uniq.astype(np.int64), summed)

    def to_dense(self, shape: tuple[int, ...]) -> np.ndarray:
        dense = np.zeros(shape, self.rows.dtype)
        np.add.at(dense, self.indices, self.rows)
        return dense

    def __repr__(self) -> str:
        return f"RowSparse({len(self.indices)} rows of {self.rows.shape[1:]}, {self.rows.dtype})"
