"""Indices of a reduction-family kernel's positions (a mixin of ReductionLowering: the kernel
shapes, reduction_kernels.py and reduction_outer.py, place the threads and give the group
indices; this module turns group indices into element indices, offsets and the values computed
from indices):
- group extents (`e<i>`, `group_extent`; the group indices `g<i>` of a linear index are
  Emitter.decompose's); an access's stride along a group (`gstride`);
- an access's element offset at group indices (`offset`): a gathered access (an embedding's
  table) adds its row's index (`gather_index`, checked), a slice's, pad's or cat's operand the
  shift along each shifted axis (schedule/reduction_resize);
- the `ax<k>` Lets (`resize_lets`, named by `axis_var`): the index along each reference axis
  that a pad, cat or shifted load bounds or shifts along, at the vector's first lane; kept axes
  once a row (inner) or column vector (outer), reduced axes in every step (at_step);
  KeyIndexing.key_index reads them for the bounds and the shifted indices;
- the index along a reference axis at a position (`axis_index`) and what is computed from it:
  iotas, shifted ones too (`iota_expr`), and Philox random numbers (`rng_expr`).

Invariants: a position is (group index exprs, lane); only the innermost group's V lanes are
consecutive elements, so only there is the lane added to an index; indices are in the kernel's
index type (`nidx_t`, `nidx_dtype`) and cast once into a value's dtype; a gathered index is one
value a row (reduction_graph refuses one that changes along the reduced axes).

The class mixing it in provides `p` (ReductionParams), `g` (the reduction graph), `ref` (the
reference TensorView), `V`, `loads`, `it`, `kidx` (the kept groups' indices, set by the kernel
shape) and the Emitter / KeyIndexing methods (extent_expr, stride, ptr, scalar, node_expr,
checked_index, random_number, key_index, minus_terms).
"""
from __future__ import annotations

from ..ir.dtypes import DataType
from ..schedule import reduction_resize as RS
from ..schedule.pointwise_graph import index_value_node
from . import kernel_ir as K
from .reduction_memory import _c


class ReductionIndexing:
    """Extents, strides, offsets and index-derived values of ReductionLowering (module
    docstring)."""

    # ---- extents, strides, offsets ----------------------------------------------------------
    def group_extent(self, gi):
        e = _c(1)
        for k in self.p.groups[gi]:
            e = K.mul(e, self.extent_expr(self.ref.logical[k]))
        return e

    def gstride(self, a, gi):
        """Stride of access `a` along group gi (None: it does not move along it)."""
        st = a.eff.get(self.p.groups[gi][-1])
        if st is None or st[0] == 0:
            return None
        if a.mode == "vector" and gi == len(self.p.groups) - 1:
            return _c(1)
        return self.stride(a, st[1])

    def offset(self, a, idx: dict):
        """Offset (elements) of access `a` at group indices `idx`; a gathered access (an
        embedding's table) adds its row's index, read and checked inside the offset itself
        (gather_index), times the gathered axis' stride."""
        off = _c(0)
        if a.gathered:
            j, inode = a.gather
            off = K.mul(self.gather_index(a, inode, j, idx), self.stride(a, j))
        for gi, x in idx.items():
            s = self.gstride(a, gi)
            if s is not None:
                off = K.add(off, K.mul(x, s))
        for k, (shift, minus) in sorted(a.shifts.items()):   # a slice's, pad's or cat's operand
            if (shift or minus) and a.eff.get(k, (0,))[0] != 0:
                off = K.add(off, K.mul(self.minus_terms(_c(shift), minus),
                                       self.stride(a, a.eff[k][1])))
        return off

    def resize_lets(self, idx=None, reduced: bool = False) -> list:
        """Lets ax<k> of the reference axes that a pad, cat or shifted load bounds or shifts
        along (KeyIndexing.key_index reads them), at the vector's first lane: the kept ones
        from the kept groups' indices (`self.kidx`), once a row (inner) or column vector
        (outer), before the row-level loads; with `reduced`, the reduced ones from a step's
        position `idx`, in each step (at_step), before its loads."""
        idx = self.kidx if idx is None else idx
        return [K.Let(self.axis_var(k), "nidx_t", self.axis_index(k, (idx, _c(0))))
                for k in sorted(RS.apart(self.g)) if (k in self.g.R) == reduced]

    def axis_var(self, k: int) -> str:
        return f"ax{k}"          # (r<i> names the inner kernel's per-row reduction results)

    def gather_index(self, a, inode, j, idx: dict):
        """The index a gathered access reads along its axis j at group indices `idx` (one
        value a row: reduction_graph refuses an index that changes along the reduced axes):
        computed through its chain (pointwise_graph.index_leaves) from the index tensors'
        elements (K.Elem) and the iotas' values, checked (Emitter.checked_index), in the index
        type."""
        memo: dict = {}

        def computed(node):
            node = index_value_node(node)
            hit = memo.get(id(node))
            if hit is None:
                if node.kind == "load":
                    ia = next(x for x in self.loads if x.node is node)
                    hit = K.Elem(self.ptr(ia), self.offset(ia, idx))
                elif node.kind == "iota":
                    hit = self.iota_expr(node, (idx, _c(0)))
                else:
                    hit = self.node_expr(node, computed)
                memo[id(node)] = hit
            return hit
        dt = index_value_node(inode).tv.dtype
        value = self.checked_index(a, j, computed(inode))
        return value if dt is self.nidx_dtype else K.Convert("cast", value, dt, self.nidx_dtype)

    def _prod(self, gis):
        e = _c(1)
        for gi in gis:
            e = K.mul(e, K.Var(f"e{gi}"))
        return e

    @property
    def nidx_dtype(self):
        return DataType.Int if self.it == "int64_t" else DataType.Int32

    # ---- indices along the reference axes, and values computed from them -------------------
    def axis_index(self, k: int, where):
        """The index along reference axis k at this position: from its group's index (plus the
        lane, in the innermost group, whose V lanes are consecutive elements) by the extents of
        the group's inner axes."""
        idx, lane = where
        gi = next((i for i, g in enumerate(self.p.groups) if k in g), None)
        if gi is None:                                    # a dropped size-1 axis
            return _c(0)
        gidx = idx[gi]
        if gi == len(self.p.groups) - 1 and self.V > 1:
            gidx = K.add(gidx, lane)
        group = self.p.groups[gi]
        pos = group.index(k)
        below = _c(1)
        for a in group[pos + 1:]:
            below = K.mul(below, self.extent_expr(self.ref.logical[a]))
        x = gidx if pos == len(group) - 1 else K.Bin("/", gidx, below)
        return x if pos == 0 else K.Bin("%", x, self.extent_expr(self.ref.logical[k]))

    def iota_expr(self, node, where):
        """start + (index along the iota's reference axis) * step, in the iota's dtype. An iota
        read at a shifted index (a slice's, pad's or cat's operand: reduction_resize allows
        "sh" entries over one reference axis) takes the shifted index of the vector's first
        lane (KeyIndexing.key_index, from the ax<k> Lets) plus the lane where vectors run
        along that axis."""
        c = node.key[0]
        dt = node.tv.dtype
        if c == 0:
            i = _c(0)
        elif c[0] == "r":
            i = self.axis_index(c[1], where)
        else:
            i = self.key_index(c)
            k = RS.shift_axis(c)
            if self.V > 1 and self.p.groups and list(self.p.groups[-1])[-1:] == [k]:
                i = K.add(i, where[1])
        i = K.Convert("cast", i, DataType.Int if self.it == "int64_t" else DataType.Int32, dt)
        start, step = (self.scalar(x) for x in node.args)
        return K.Op("add", (start, K.Op("mul", (i, step), dt)), dt)

    def rng_expr(self, node, where):
        """The random number of a PhiloxUniformOp at this position (Emitter.random_number) at
        the element's row-major index in the op's own shape (its axes line up with the reference
        axes of its key; broadcast axes have extent 1). Where that index is the reference
        domain's and V is a multiple of 4, lanes share quads: the index is lane 0's."""
        idx, lane = where
        quads = self.V % 4 == 0 and self._dense_in_reference(node)
        index, stride = None, None
        for d, c in reversed(list(zip(node.tv.logical, node.key))):
            if c != 0:
                term = self.axis_index(c[1], (idx, _c(0)) if quads else where)
                term = term if stride is None else K.mul(term, stride)
                index = term if index is None else K.add(index, term)
            ext = self.extent_expr(d)
            stride = ext if stride is None else K.mul(stride, ext)
        index = K.Convert("cast", index if index is not None else _c(0),
                          DataType.Int if self.it == "int64_t" else DataType.Int32, DataType.Int)
        value = self.random_number(len(self.g.rng_numbers), self.g.rng_numbers[id(node.expr)],
                                   node.expr.digits, index, lane if quads else None)
        dt = node.tv.dtype
        return K.Convert("cast", value, DataType.Float, dt) if dt is DataType.Double else value

    def _dense_in_reference(self, node) -> bool:
        """Whether random node's row-major index is the reference domain's (its shape is the
        reference's, no broadcast axis, and the groups are consecutive reference axes in
        order): then the innermost group's V lanes are consecutive indices and lane 0's index
        is a multiple of V (the group's index steps by V and its extent is a multiple of V)."""
        order = [k for grp in self.p.groups for k in grp]
        return tuple(node.key) == tuple(("r", i) for i in range(self.g.n)) and \
            order == sorted(order) and all(grp == list(range(grp[0], grp[0] + len(grp)))
                                           for grp in self.p.groups)
