"""IterDomains and TensorDomains: the axes of a tensor and the transforms schedulers apply.

An IterDomain is one axis: a start (always 0 here), an extent (a Scalar, constant or symbolic),
an IterType (iteration, broadcast, reduction) and a ParallelType. Split and Merge are the
IterDomain transforms; each records its inputs and outputs so the TransformPrinter and the
lowering can replay the history from the root domain to the leaf (loop) domain.

Invariants:
- `TensorDomain.root` never changes after creation; `leaf` starts equal to root and changes only
  through split/merge/reorder; `transforms` lists the applied Split/Merge in order.
- Broadcast IterDomains have extent 1 (constant) unless expanded.
"""
from __future__ import annotations

import enum

from .base import Scalar, Val
from .dtypes import DataType


class IterType(enum.Enum):
    Iteration = "i"
    Broadcast = "b"
    Reduction = "r"


class ParallelType(enum.Enum):
    Serial = "S"
    BIDx = "blockIdx.x"
    BIDy = "blockIdx.y"
    BIDz = "blockIdx.z"
    TIDx = "threadIdx.x"
    TIDy = "threadIdx.y"
    TIDz = "threadIdx.z"
    Vectorize = "V"
    Unroll = "UR"
    Unswitch = "US"

    @property
    def is_block(self) -> bool:
        return self.name.startswith("BID")

    @property
    def is_thread(self) -> bool:
        return self.name.startswith("TID")


class IterDomain(Val):
    """One axis of a TensorView. Printed `iS3{i5}`: type letter, parallel type, number, extent."""

    def __init__(self, extent: Scalar, iter_type: IterType = IterType.Iteration,
                 parallel: ParallelType = ParallelType.Serial, fusion=None, expanded_extent=None):
        self.start = 0
        self.extent = extent
        self.iter_type = iter_type
        self.parallel = parallel
        # A broadcast axis made real by `expand`: the extent it is iterated over.
        self.expanded_extent = expanded_extent
        super().__init__(fusion if fusion is not None else extent.fusion)

    def counter_key(self) -> str:
        return "IterDomain"

    @property
    def full_extent(self) -> Scalar:
        """The extent the axis is iterated over: an expanded broadcast axis' expanded extent
        (its `extent` is 1), else `extent`."""
        return self.expanded_extent if self.expanded_extent is not None else self.extent

    def known_size(self) -> int | None:
        """The axis' size when it is a compile-time constant, else None (a symbolic extent,
        bound only at run time). An expanded broadcast axis has its expanded size."""
        s = self.full_extent
        return int(s.value) if s.is_const else None

    @property
    def is_broadcast(self) -> bool:
        return self.iter_type is IterType.Broadcast

    @property
    def is_size_one_broadcast(self) -> bool:
        """A broadcast axis not expanded: size 1, it meets an axis of any extent (an expanded one
        is iterated over its expanded extent, as an iteration axis is)."""
        return self.iter_type is IterType.Broadcast and self.expanded_extent is None

    @property
    def is_reduction(self) -> bool:
        return self.iter_type is IterType.Reduction

    @property
    def name(self) -> str:
        return f"{self.iter_type.value}{self.parallel.value}{self.number}"

    def __str__(self) -> str:
        return f"{self.name}{{{self.full_extent}}}"

    __repr__ = __str__

    def clone(self, iter_type: IterType | None = None) -> "IterDomain":
        return IterDomain(self.extent, iter_type or self.iter_type, fusion=self.fusion,
                          expanded_extent=self.expanded_extent)

    def parallelize(self, ptype: ParallelType) -> "IterDomain":
        self.parallel = ptype
        return self


class Split:
    """`in` -> (outer, inner); `factor` is the inner extent (inner_split) or the outer one."""

    def __init__(self, in_id: IterDomain, factor: int | Scalar, inner_split: bool = True):
        f = factor if isinstance(factor, Scalar) else Scalar(DataType.Int, int(factor), in_id.fusion)
        self.factor, self.inner_split, self.input = f, inner_split, in_id
        other = Scalar(DataType.Int, None, in_id.fusion)  # ceilDiv(extent, factor), symbolic
        if in_id.extent.is_const and f.is_const:
            other = Scalar(DataType.Int, -(-in_id.extent.value // f.value), in_id.fusion)
        outer_ext, inner_ext = (other, f) if inner_split else (f, other)
        self.outer = IterDomain(outer_ext, in_id.iter_type, fusion=in_id.fusion)
        self.inner = IterDomain(inner_ext, in_id.iter_type, fusion=in_id.fusion)
        self.outputs = [self.outer, self.inner]

    def __str__(self) -> str:
        kind = "inner" if self.inner_split else "outer"
        return f"Split: {self.input} by factor {self.factor} -> {self.outer}, {self.inner}, {kind} split"


class Merge:
    """(outer, inner) -> out, with extent outer.extent * inner.extent."""

    def __init__(self, outer: IterDomain, inner: IterDomain):
        self.outer, self.inner = outer, inner
        ext = Scalar(DataType.Int, None, outer.fusion)
        if outer.extent.is_const and inner.extent.is_const:
            ext = Scalar(DataType.Int, outer.extent.value * inner.extent.value, outer.fusion)
        both_bcast = outer.is_broadcast and inner.is_broadcast
        itype = IterType.Broadcast if both_bcast else (
            IterType.Reduction if outer.is_reduction or inner.is_reduction else IterType.Iteration)
        self.out = IterDomain(ext, itype, fusion=outer.fusion)
        self.outputs = [self.out]

    def __str__(self) -> str:
        return f"Merge: {self.outer} and {self.inner} -> {self.out}"


class TensorDomain:
    """The root domain of a TensorView plus the transforms that produced its leaf domain."""

    def __init__(self, root: list[IterDomain]):
        self.root = list(root)
        self.leaf = list(root)
        self.transforms: list = []

    def split(self, axis: int, factor, inner_split: bool = True) -> "TensorDomain":
        axis = self._norm(axis)
        s = Split(self.leaf[axis], factor, inner_split)
        self.leaf[axis:axis + 1] = [s.outer, s.inner]
        self.transforms.append(s)
        return self

    def merge(self, axis_o: int, axis_i: int | None = None) -> "TensorDomain":
        axis_o = self._norm(axis_o)
        axis_i = axis_o + 1 if axis_i is None else self._norm(axis_i)
        assert axis_o != axis_i, "merge needs two different axes"
        m = Merge(self.leaf[axis_o], self.leaf[axis_i])
        lo, hi = sorted((axis_o, axis_i))
        del self.leaf[hi]
        self.leaf[lo] = m.out
        self.transforms.append(m)
        return self

    def reorder(self, old_to_new: dict[int, int]) -> "TensorDomain":
        n = len(self.leaf)
        mapping = {self._norm(k): v % n for k, v in old_to_new.items()}
        assert len(set(mapping.values())) == len(mapping), "reorder targets must be distinct"
        result: list = [None] * n
        for old, new in mapping.items():
            result[new] = self.leaf[old]
        rest = iter(self.leaf[i] for i in range(n) if i not in mapping)
        self.leaf = [r if r is not None else next(rest) for r in result]
        return self

    def _norm(self, axis: int) -> int:
        n = len(self.leaf)
        if not -n <= axis < n:
            raise IndexError(f"axis {axis} out of range for a domain of {n} axes")
        return axis % n

    @property
    def no_reductions(self) -> list[IterDomain]:
        """The root axes a tensor is stored with (reduction axes are gone after the op)."""
        red = IterType.Reduction          # (the test inline: called for every `logical`)
        return [d for d in self.root if d.iter_type is not red]
