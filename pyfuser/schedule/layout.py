"""Tensor layout facts: the kernel signature, index-type choice and eager-like output layouts.

`signature(fusion, inputs)` is the cache key of a generated kernel. It holds exactly the facts the
pointwise scheduler's *correctness* decisions read (collapsing axes, vector width, index type):
per tensor input its dtype, rank, which axes have size 1, which have stride 0, its stride order
(axes by decreasing stride), which neighbours in that order are contiguous, whether the innermost
stride is 1, the power of two (capped at 16) dividing each size and stride and the data pointer's
byte alignment (capped at 16); per scalar input its Python type; whether 64-bit indexing is
needed; and, when views have extents bound at run time (a `-1` size), per such extent whether it
is 1 and the power of two (capped at 16) dividing it (`view_extent_facts`); and, when slices,
pads or cats are in the fusion, per axis of their outputs whether it is 0, 1 or its input's
extent (`resize_extent_facts`). Sizes themselves are not in it.

Invariant: every decision `plan_kernel` takes that affects correctness is a function of these
facts; heuristic choices (1-D vs 2-D, unroll) may also look at sizes, and are valid for any size.
"""
from __future__ import annotations

import math

import torch

INDEX32_LIMIT = 2 ** 31 - 2 ** 20  # slack for the last block's overshoot of the linear index


def p2(n: int, cap: int = 16) -> int:
    """The largest power of two dividing n, capped at `cap` (0 counts as divisible by anything)."""
    n = int(n)
    if n == 0:
        return cap
    return min(n & -n, cap)


def stride_order(sizes, strides) -> tuple:
    """Axes whose size is not 1, outermost (largest stride) first; ties keep axis order."""
    axes = [i for i, s in enumerate(sizes) if s != 1]
    return tuple(sorted(axes, key=lambda i: (-strides[i], i)))


def row_major(sizes, strides) -> bool:
    """Dense row-major over the axes of size > 1 (what the stride order, contiguity flags and
    unit inner stride of tensor_facts say together)."""
    expect = 1
    for n, st in zip(reversed(sizes), reversed(strides)):
        if n == 1:
            continue
        if st != expect:
            return False
        expect *= n
    return True


def tensor_facts(x: torch.Tensor) -> tuple:
    sizes, strides = tuple(x.shape), tuple(x.stride())
    order = stride_order(sizes, strides)
    contig = tuple(strides[a] == strides[b] * sizes[b] for a, b in zip(order, order[1:]))
    inner_unit = bool(order) and strides[order[-1]] == 1
    size1 = tuple(s == 1 for s in sizes)
    zero = tuple(st == 0 and s != 1 for s, st in zip(sizes, strides))
    sp2 = tuple(p2(s) for s in sizes)
    stp2 = tuple(0 if s == 1 else p2(st) for s, st in zip(sizes, strides))
    ptr = p2(x.data_ptr()) if x.numel() else 16
    return (str(x.dtype), x.dim(), size1, zero, order, contig, inner_unit, sp2, stp2, ptr)


def span(x: torch.Tensor) -> int:
    """Number of elements from the first to one past the last element `x` can address."""
    if x.numel() == 0:
        return 0
    return 1 + sum((s - 1) * st for s, st in zip(x.shape, x.stride()))


def needs_int64(inputs, out_numel: int) -> bool:
    spans = [span(x) for x in inputs if isinstance(x, torch.Tensor)]
    return max(spans + [int(out_numel)]) >= INDEX32_LIMIT


def symbolic_view_extents(fusion) -> list:
    """Extent Scalars of view outputs that are bound at run time (not constants), in expr order:
    their facts are in the signature, so schedulers may decide on them."""
    from ..ir import exprs as E
    return [d.extent for e in fusion.exprs if isinstance(e, E.ViewOp)
            for d in e.outputs[0].logical if not d.extent.is_const]


def view_extent_facts(fusion, bound) -> tuple:
    """(is 1, power of two dividing it) of each symbolic view extent; () when there are none.
    `bound()` gives the fusion's bindings for the inputs (called only where needed)."""
    extents = symbolic_view_extents(fusion)
    if not extents:
        return ()
    b = bound()
    return tuple((int(b.value(s)) == 1, p2(int(b.value(s)))) for s in extents)


def resize_extent_facts(fusion, bound) -> tuple:
    """Per axis of each slice's, pad's and cat's output, whether its extent is 0, 1, or each of
    its inputs' extents at these sizes; () when there are none. The schedulers read these
    extents' values (an access of an axis of one element is a broadcast; a slice taking its
    whole axis reads contiguous rows, so the axes collapse), and the extents are computed from
    sizes and bounds when bound (`x[:, 2:]` has n - 2, `x[:, :m]` m): without the facts, a
    kernel planned where such an extent was 1 (n = 3) or the whole axis (m = n) served a later
    call of the same input facts where it is not (n = 5, m < n), and wrote one column or read
    the wrong rows (a recompile for a new size shares the region's Fusion). `bound()` gives
    the fusion's bindings for the inputs (called only where needed)."""
    from ..ir import exprs as E
    from ..ir.tensor import TensorView
    ops = [e for e in fusion.exprs if isinstance(e, (E.SliceOp, E.PadOp, E.CatOp))]
    if not ops:
        return ()
    b = bound()
    facts = []
    for e in ops:
        out = b.shape(e.outputs[0])
        ins = [b.shape(t) for t in e.inputs if isinstance(t, TensorView)]
        facts.append(tuple((o == 0, o == 1) + tuple(o == s[k] for s in ins)
                           for k, o in enumerate(out)))
    return tuple(facts)


def scalar_fact(x) -> str:
    if isinstance(x, torch.Tensor):
        return f"0-dim:{x.dtype}"
    return type(x).__name__


# ---- eager-like output layouts ----------------------------------------------------------------
def eager_output_orders(fusion, inputs, bindings) -> list[tuple]:
    """Per fusion output, its axes outermost-first as eager PyTorch would lay the result out.

    Computed by running the fusion op by op on meta tensors with the inputs' sizes and strides,
    so every op's layout rule (TensorIterator's stride-order propagation, reshape copies...) is
    PyTorch's own.
    """
    from ..ir import exprs as E
    from ..ir.tensor import TensorView
    exprs = fusion.used_exprs()
    if not any(isinstance(e, E.PermuteOp) for e in exprs) and all(
            x.is_contiguous() for v, x in zip(fusion.inputs, inputs) if isinstance(v, TensorView)):
        # Contiguous inputs and no permute: every elementwise, cast, broadcast, expand, view and
        # squeeze result is row-major in eager too; skip the meta run (a warm start pays for it).
        return [tuple(range(o.ndim)) for o in fusion.outputs]
    env = {}
    for v, x in zip(fusion.inputs, inputs):
        if isinstance(v, TensorView):
            env[v] = torch.empty_strided(tuple(x.shape), tuple(x.stride()), dtype=x.dtype,
                                         device="meta")
    for e in exprs:
        out = e.outputs[0]
        if not isinstance(out, TensorView):
            continue
        env[out] = _meta_expr(e, env, bindings)
        for other in e.outputs[1:]:          # Welford's m2 and n: laid out as its mean, in
            m = env[out]                     # their own dtypes (n counts: an integer)
            env[other] = m if m.dtype == other.dtype.torch else m.to(other.dtype.torch)
    orders = []
    for o in fusion.outputs:
        m = env[o]
        strides = tuple(m.stride())
        orders.append(tuple(sorted(range(m.dim()), key=lambda i: (-strides[i], i))))
    return orders


def _scalar_stand_in(s):
    if s.is_const:
        return s.value
    d = s.dtype
    return True if d.is_bool else (1.0 if d.is_floating else 1)


def _meta_expr(e, env, bindings):
    from ..ir import exprs as E
    from ..ir.base import Scalar
    from ..ir.ops import OPS
    from ..ir.tensor import TensorView

    def arg(v):
        return env[v] if isinstance(v, TensorView) else _scalar_stand_in(v)

    x = arg(e.inputs[0]) if e.inputs else None
    out = e.outputs[0]
    if isinstance(e, E.ElementwiseOp):
        args = [arg(v) for v in e.inputs]
        try:
            r = OPS[e.op_name].ref(*args)
        except (TypeError, RuntimeError):
            # a scalar where torch wants a tensor (`eq(0.0, t)`): as a 0-dim tensor, which
            # takes no part in the layout
            args = [a if isinstance(a, torch.Tensor) else torch.tensor(a, device="meta")
                    for a in args]
            r = OPS[e.op_name].ref(*args)
        if not isinstance(r, torch.Tensor) or list(r.shape) != bindings.shape(out):
            r = torch.empty(bindings.shape(out), dtype=out.dtype.torch, device="meta")
        # in the op's own dtype (a scalar's stand-in may promote otherwise), so the ops after it
        # see eager's dtypes
        return r if r.dtype == out.dtype.torch else r.to(out.dtype.torch)
    if isinstance(e, E.CastOp):
        return x.to(e.dtype.torch)
    if isinstance(e, E.SetOp):
        return x.clone(memory_format=torch.contiguous_format if e.contiguous else
                       torch.preserve_format)
    if isinstance(e, E.BroadcastOp):
        shape = []
        src = iter(x.shape)
        for f in e.flags:
            shape.append(1 if f else next(src))
        return x.reshape(shape) if x.is_contiguous() else _unsqueeze_all(x, e.flags)
    if isinstance(e, E.ExpandOp):
        return x.expand(bindings.shape(out))
    if isinstance(e, E.SqueezeOp):
        return x.squeeze(tuple(e.dims)) if e.dims else x
    if isinstance(e, E.ViewOp):
        return x.reshape(bindings.shape(out))
    if isinstance(e, E.PermuteOp):
        return x.permute(e.dims)
    if isinstance(e, (E.FullOp, E.PhiloxUniformOp, E.IotaOp)):
        return torch.empty(bindings.shape(out), dtype=out.dtype.torch, device="meta")
    if isinstance(e, (E.IndexSelectOp, E.GatherOp)):    # a new row-major tensor, as eager's
        return x.new_empty(bindings.shape(out))
    if isinstance(e, E.SliceOp):                        # a view: the input's strides
        def bound(b):
            return int(bindings.value(b)) if isinstance(b, Scalar) else b
        return x[tuple(slice(bound(a), bound(b), s) for a, b, s in zip(e.starts, e.ends, e.steps))]
    if isinstance(e, E.CatOp):
        return torch.cat([env[v] for v in e.inputs], e.dim)
    if isinstance(e, E.PadOp) and any(s != 1 for s in e.steps):   # eager's slice_backward:
        return torch.zeros(bindings.shape(out), dtype=x.dtype, device="meta")  # new zeros
    if isinstance(e, E.PadOp):
        return torch.nn.functional.pad(x, [int(bindings.value(p)) if isinstance(p, Scalar) else p
                                           for pair in reversed(e.pads) for p in pair])
    if isinstance(e, (E.ReductionOp, E.WelfordOp)):   # every reduction lays out as sum does
        r = x.sum(dim=list(e.axes)) if e.axes else x.sum(dim=list(range(x.dim())))
        # in the reduction's own dtype (a bool min stays bool; sum would make it int64), so the
        # ops after it see eager's dtypes (a where taking it as its condition)
        return r if r.dtype == out.dtype.torch else r.to(out.dtype.torch)
    raise NotImplementedError(type(e).__name__)


def _unsqueeze_all(x, flags):
    for i, f in enumerate(flags):
        if f:
            x = x.unsqueeze(i)
    return x


def strides_for(sizes, order) -> tuple:
    """Dense strides for `sizes` with axes laid out outermost-first as in `order`."""
    strides = [0] * len(sizes)
    acc = 1
    for a in reversed(order):
        strides[a] = acc
        acc *= max(int(sizes[a]), 1)
    return tuple(strides)


def numel(sizes) -> int:
    return math.prod(int(s) for s in sizes)
