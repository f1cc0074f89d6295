"""TensorView: a tensor of the Fusion IR.

A TensorView has a dtype, a TensorDomain (root axes + scheduling transforms) and a memory type.
Fusion inputs also carry the layout promised by their definition: `contiguity` (one entry per
root axis; None for broadcast axes) and `stride_order` (stride_order[i] is the rank of axis i's
stride, largest = outermost; None means row-major).

Invariants:
- Printed name `T<n>_<m>` with m = g (fusion input/output), l (local) or s (shared).
- The root domain of a non-input is created by the Expr that defines it, never edited later.
"""
from __future__ import annotations

import enum

from .base import Val
from .dtypes import DataType
from .iterdomain import IterDomain, ParallelType, TensorDomain


class MemoryType(enum.Enum):
    Global = "g"
    Local = "l"
    Shared = "s"


class TensorView(Val):
    name_prefix = "T"

    def __init__(self, root: list[IterDomain], dtype: DataType, fusion=None):
        self.dtype = dtype
        self.domain = TensorDomain(root)
        self.memory_type = MemoryType.Local
        self.contiguity: list | None = None
        self.stride_order: list[int] | None = None
        super().__init__(fusion if fusion is not None else (root[0].fusion if root else None))

    def counter_key(self) -> str:
        return "TensorView"

    # --- shape -------------------------------------------------------------------------------
    @property
    def root(self) -> list[IterDomain]:
        return self.domain.root

    @property
    def leaf(self) -> list[IterDomain]:
        return self.domain.leaf

    @property
    def logical(self) -> list[IterDomain]:
        """The axes the tensor has as a PyTorch tensor (root minus reduction axes)."""
        return self.domain.no_reductions

    @property
    def ndim(self) -> int:
        return len(self.logical)

    # --- scheduling --------------------------------------------------------------------------
    def split(self, axis: int, factor, inner_split: bool = True) -> "TensorView":
        self.domain.split(axis, factor, inner_split)
        return self

    def merge(self, axis_o: int, axis_i: int | None = None) -> "TensorView":
        self.domain.merge(axis_o, axis_i)
        return self

    def reorder(self, old_to_new: dict[int, int]) -> "TensorView":
        self.domain.reorder(old_to_new)
        return self

    def axis(self, i: int) -> IterDomain:
        return self.domain.leaf[self.domain._norm(i)]

    def parallelize(self, axis: int, ptype: ParallelType) -> "TensorView":
        self.axis(axis).parallelize(ptype)
        return self

    # --- printing ----------------------------------------------------------------------------
    @property
    def name(self) -> str:
        mem = MemoryType.Global if self.fusion.is_boundary(self) else self.memory_type
        return f"T{self.number}_{mem.value}"

    def __str__(self) -> str:
        return f"{self.name}[ {', '.join(str(d) for d in self.leaf)} ]"

    def __repr__(self) -> str:
        return str(self)
