"""Global accesses of the pointwise-family schedulers (pointwise, reduction, inner-outer): one
`Access` per load of a tensor input, store of an output or random op, its effective stride per
reference axis (affine, through views whose offset stays linear, shifted by a slice / pad /
cat, or gathered at an index), then `collapse` (neighbouring reference axes every access holds
contiguously become one group) and `vector_width` (the widest vector every vectorized access
and the inner extent allow).

Invariant: every decision here reads only facts `layout.signature` puts in the signature
(strides and their order, alignment, extents' facts), so a kernel planned from them serves every
input of that signature.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..ir.tensor import TensorView
from . import layout as L
from .pointwise_gather import gather_ok
from .pointwise_graph import gathered, index_leaves, is_affine, shift_affine


@dataclass
class Access:
    """One global memory access: a load of a tensor input or a store of an output."""
    node: object                # graph Node (loads) or the output's Node (stores)
    seg: int                    # segment tensor index (inputs first, then outputs)
    tv: TensorView              # the clone's TensorView
    is_store: bool
    itemsize: int
    sizes: tuple
    strides: tuple
    eff: dict = field(default_factory=dict)      # R axis -> (stride, tensor axis or ("rm", view, i))
    linear: bool = False        # a load through a view whose offset is affine after all (_linear_view)
    mode: str = "general"       # "vector" / "bcast" / "strided" / "general"
    row_invariant: bool = False  # 2-D: offset does not depend on the row
    ptr_align: int = 16         # byte alignment of the data pointer (capped at 16)
    rng: int | None = None      # a random op's numbers (no memory): its number k in the kernel;
                                # indexed as a dense row-major tensor of its shape would be
    shifts: dict = field(default_factory=dict)   # R axis -> (off, minus): a slice / pad / cat
                                                 # operand read at r_k + off - sizes of minus
    cache: str = ""             # this access's cache policy where the scheduler chooses one per
                                # access (reduction kinds; schedule/cache_policy.py)
    gather: tuple | None = None  # (j, index node): axis j read at the index's value, the others
                                 # affine (eff); pointwise_graph.gathered

    @property
    def affine(self) -> bool:
        """The offset is a sum over R axes of index * eff stride (collapsible, vectorizable)."""
        return self.linear or self.node.affine

    @property
    def shiftable(self) -> bool:
        """Not affine, but its offset is an affine one plus a constant (eff and shifts, which
        _access fills only for such a load): it collapses and vectorizes like an affine access
        where the shifts allow (pointwise_resize.index_vec_ok), its load guarded by the
        operand's bounds."""
        return bool(self.shifts)

    @property
    def gathered(self) -> bool:
        """Not affine, but its offset is an affine one (eff) plus the index's value times the
        stride of the gathered axis: it collapses and vectorizes like an affine access where
        the index is the same along the vectors (pointwise_gather.gather_ok)."""
        return self.gather is not None


def collect_accesses(clone, fusion, graph, inputs, bindings, orders, view_extent,
                     orig_of) -> list[Access]:
    """The loads of tensor inputs, random ops and stores of outputs of a pointwise schedule."""
    tensor_inputs = clone.tensor_inputs()
    actual = [x for v, x in zip(fusion.inputs, inputs) if isinstance(v, TensorView)]
    out = []
    for node in graph.loads:
        i = tensor_inputs.index(node.tv)
        x = actual[i]
        a = make_access(node, i, node.tv, False, x.element_size(), tuple(x.shape), tuple(x.stride()))
        a.ptr_align = L.p2(x.data_ptr()) if x.numel() else 16
        if not node.affine:
            eff = _linear_view(node.key, a.sizes, a.strides, view_extent)
            if eff is not None:
                a.eff, a.linear = eff, True
        out.append(a)
    # random ops numbered in expr order (as the evaluator numbers them)
    exprs = {id(n.expr) for n in graph.rngs}
    numbers = {i: k for k, i in enumerate(id(e) for e in clone.exprs if id(e) in exprs)}
    for node in graph.rngs:
        # random numbers at an element's row-major index: indexed like a dense row-major
        # tensor of their shape, so they collapse and vectorize with the other accesses
        k = numbers[id(node.expr)]
        sizes = tuple(axis_size(d, orig_of, bindings) for d in node.tv.logical)
        a = make_access(node, -1 - k, node.tv, False, 1, sizes, L.strides_for(sizes, range(len(sizes))))
        if not node.affine:
            eff = _linear_view(node.key, a.sizes, a.strides, view_extent)
            if eff is not None:
                a.eff, a.linear = eff, True
        a.rng = k
        out.append(a)
    nin = len(tensor_inputs)
    for oi, (o, node) in enumerate(zip(clone.outputs, graph.outputs)):
        sizes = tuple(bindings.shape(fusion.outputs[oi]))
        strides = L.strides_for(sizes, orders[oi])
        out.append(make_access(node, nin + oi, o, True, o.dtype.itemsize, sizes, strides))
    return out


def axis_size(d, orig_of, bindings) -> int:
    """The run-time size of an axis of the clone."""
    s = d.full_extent
    return int(s.value) if s.is_const else int(bindings.value(orig_of[id(s)]))


def make_access(node, seg, tv, is_store, itemsize, sizes, strides) -> Access:
    a = Access(node, seg, tv, is_store, itemsize, sizes, strides)
    if node.affine:
        for j, c in enumerate(node.key):
            if c != 0 and sizes[j] != 1:
                a.eff[c[1]] = (strides[j], j)
    elif not is_store and node.kind == "load" and gathered(node.key) is not None:
        a.gather = gathered(node.key)
        for j, c in enumerate(node.key):
            if c != 0 and j != a.gather[0] and sizes[j] != 1:
                a.eff[c[1]] = (strides[j], j)
    elif not is_store and node.kind == "load":
        shifts = shift_affine(node.key)
        if shifts is not None and shifts:
            for j, (k, off, minus) in shifts.items():
                if sizes[j] != 1:
                    a.eff[k] = (strides[j], j)
                    a.shifts[k] = (off, minus)
    return a


def _linear_view(key, sizes, strides, view_extent):
    """R axis -> (coefficient, ("rm", view, i)) for a load read through views between compute
    ops whose offset is affine in R after all, else None.

    That is the case when the key is ("vd", view, key_out, j) for every axis j of the tensor (its
    axes are the view input's, through elementwise ops; 0 where the view's input is a size-1
    broadcast axis, never where the tensor alone is broadcast), the tensor is dense row-major
    (stride order, contiguity and unit inner stride: signature facts), and key_out (where the
    view's output is read) is affine, or is itself such a key of a later view, and so on until
    an affine one. A view keeps the row-major linear index, so the offset is the last view's
    output's linear index at its affine key: sum of r_k * (product of that output's extents after
    axis i) over the axes i read at r_k. Every extent of that output must be a signature fact (a
    constant, an input's extent or a view extent bound at run time, whose facts the signature
    also holds); the access's relations to other accesses' strides (collapsing, vector width)
    then follow from signature facts, as for any input."""
    if not L.row_major(sizes, strides):
        return None
    hop = _view_hop(key)
    if hop is None:
        return None
    view, key_out = hop
    while not is_affine(key_out):          # the view's output reaches a later view's input
        hop = _view_hop(key_out)
        if hop is None:
            return None
        view, key_out = hop
    exts = [view_extent(d.extent) for d in view.outputs[0].logical]
    if not all(proven for _, proven in exts):
        return None
    eff, coef = {}, 1
    for i in range(len(key_out) - 1, -1, -1):
        c, n = key_out[i], exts[i][0]
        if c != 0 and n != 1:
            if c[1] in eff:
                return None               # one R axis at two axes of the view: not a stride
            eff[c[1]] = (coef, ("rm", view, i))
        coef *= n
    return eff


def _view_hop(key):
    """(view, key_out) when `key` reads every axis j of a view's input as ("vd", view, key_out,
    j) (0 only where that input axis is a size-1 broadcast); else None."""
    vds = [c for c in key if c != 0]
    if not vds or not all(isinstance(c, tuple) and c[0] == "vd" for c in vds):
        return None
    _, view, key_out, _ = vds[0]
    src = view.inputs[0].logical
    if len(key) != len(src):
        return None
    for j, c in enumerate(key):
        if c == 0:                        # only where the view's input has extent 1 too
            if not src[j].is_size_one_broadcast:
                return None
        elif c[1] is not view or c[2] != key_out or c[3] != j:
            return None
    return view, key_out


def collapse(order, shape, accesses, apart=frozenset()) -> list[list[int]]:
    groups: list[list[int]] = []
    affine = [a for a in accesses if a.affine or a.shiftable or a.gathered]
    for k in order:
        if groups and k not in apart and groups[-1][-1] not in apart:
            prev = groups[-1][-1]
            if all(a.eff.get(prev, (0,))[0] == a.eff.get(k, (0,))[0] * shape[k] for a in affine):
                groups[-1].append(k)
                continue
        groups.append([k])
    return groups


def vector_width(groups, ext, accesses, inner_proven: bool) -> int:
    if not groups or not inner_proven or \
            any(not (a.affine or a.shiftable or a.gathered) for a in accesses):
        return 1
    inner_k = groups[-1][-1]
    outer_ks = [g[-1] for g in groups[:-1]]
    if any(a.gathered and not gather_ok(a, inner_k) for a in accesses):
        return 1
    # a gathered access's index is one element a vector (gather_ok): the widths of the loads it
    # is computed from do not count
    indices = {id(n) for a in accesses if a.gathered for n in index_leaves(a.gather[1])}
    vec = 16 // max(a.itemsize for a in accesses if id(a.node) not in indices)
    while vec > 1:
        ok = ext[-1] % vec == 0
        for a in accesses:
            if not ok:
                break
            if a.eff.get(inner_k, (0,))[0] == 1:
                ok = a.ptr_align % min(vec * a.itemsize, 16) == 0 and all(a.eff.get(k, (0,))[0] % vec == 0 for k in outer_ks)
                if a.gathered:          # each gathered row starts on a vector boundary too
                    ok = ok and a.strides[a.gather[0]] % vec == 0
        if ok:
            return vec
        vec //= 2
    return 1
