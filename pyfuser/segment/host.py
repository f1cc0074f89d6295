"""Host segments: metadata-only ops at the edges of a Fusion, run as PyTorch views (no kernel).

A metadata expr (view/reshape, permute, broadcast = unsqueeze, squeeze, expand) only changes a
tensor's sizes and strides. When it sits at the boundary of a fusion there is no reason to run it
in a kernel: eager would alias, and a kernel fed the view sees a plain (possibly strided) tensor,
which indexes without div/mod and vectorizes.

`host_exprs(fusion, exprs)` picks them:
- input side (forward): a metadata expr whose tensor input is a fusion input or another host
  expr's output. A view is taken only when its input is known to be row-major contiguous (a
  fusion input declared contiguous, through views/squeezes/unsqueezes), so it never copies; a view
  of a permuted tensor stays in the kernel as index arithmetic.
  `x.contiguous()` of such a row-major input is x itself (eager returns its input then), so a
  view of it is a view of x, with eager's strides (a stride-0 expand stays stride-0).
- output side (backward): a metadata expr whose output only feeds host exprs and/or is a fusion
  output: the kernel writes its input and the host views the result.
A view in the middle, between compute ops, is in neither set and stays in the kernel.

`run_host(e, x, bindings)` applies one host expr to a tensor, through HOST_RUNNERS (keyed by
Expr class); view uses `reshape`, which is a view wherever torch would alias.

`host_layout(fusion, host)` gives, per host-produced value, its structural stride order
(outermost first) or None when unknown; the segmenter writes it into the `stride_order` of the
kernel sub-fusion's inputs so schedulers can tell a permuted input from a row-major one.

Invariant: everything here is a function of the Fusion alone (not of sizes), so the segmentation
it feeds can be cached per Fusion.
"""
from __future__ import annotations

from ..ir import exprs as E
from ..ir.tensor import TensorView


def _view(e, x, b):
    return x.reshape(b.shape(e.output))


HOST_RUNNERS = {
    E.ViewOp: _view,
    E.PermuteOp: lambda e, x, b: x.permute(e.dims),
    E.ExpandOp: lambda e, x, b: x.expand(b.shape(e.output)),
    E.SqueezeOp: lambda e, x, b: x.squeeze(tuple(e.dims)) if e.dims else x,
    E.BroadcastOp: lambda e, x, b: _unsqueeze(x, e.flags),
}
HOST_EXPRS = tuple(HOST_RUNNERS)


def _unsqueeze(x, flags):
    for axis, new in enumerate(flags):
        if new:
            x = x.unsqueeze(axis)
    return x


def run_host(e, x, bindings):
    if isinstance(e, E.SetOp):                           # an aliasing x.contiguous(): x itself
        return x
    return HOST_RUNNERS[type(e)](e, x, bindings)


def _aliasing_contiguous(e) -> bool:
    """`x.contiguous()` (not a clone), which eager answers with x itself when x is row-major."""
    return isinstance(e, E.SetOp) and e.contiguous and e.may_alias


# ---- structural layout ------------------------------------------------------------------------
# Each function maps the input's order (axes outermost first, None = unknown) to the output's.
def _order_view(e, order):
    return list(range(e.output.ndim)) if order == list(range(e.inputs[0].ndim)) else None


def _order_permute(e, order):
    if order is None:
        return None
    pos = {a: i for i, a in enumerate(order)}            # input axis -> rank (0 = outermost)
    return sorted(range(len(e.dims)), key=lambda j: pos[e.dims[j]])


def _order_broadcast(e, order):
    if order is None:
        return None
    new_of_old = [j for j, f in enumerate(e.flags) if not f]
    result = [new_of_old[a] for a in order]
    for j in (j for j, f in enumerate(e.flags) if f):   # size-1 axes: anywhere is right; keep
        at = next((i for i, k in enumerate(result) if k > j), len(result))   # row-major natural
        result.insert(at, j)
    return result


def _order_squeeze(e, order):
    if order is None:
        return None
    remap, k = {}, 0
    for a in range(e.inputs[0].ndim):
        if a not in e.dims:
            remap[a] = k
            k += 1
    return [remap[a] for a in order if a in remap]


LAYOUT_RULES = {
    E.ViewOp: _order_view,
    E.PermuteOp: _order_permute,
    E.BroadcastOp: _order_broadcast,
    E.SqueezeOp: _order_squeeze,
    E.ExpandOp: lambda e, order: None,                   # stride-0 axes: no dense order
    E.SetOp: lambda e, order: order,                     # only an aliasing contiguous() is host
}
# A view of a value with this property is a view (no copy) in torch, whatever the sizes.
KEEPS_ROW_MAJOR = {E.ViewOp, E.SqueezeOp, E.BroadcastOp, E.SetOp}


def input_order(tv: TensorView):
    """Declared stride order of a fusion input, outermost axis first (None: unknown)."""
    n = tv.ndim
    if tv.contiguity is not None and not all(c in (True, None) for c in tv.contiguity):
        return None
    if tv.stride_order is None:
        return list(range(n))
    return sorted(range(n), key=lambda a: -tv.stride_order[a])


def _row_major(tv: TensorView) -> bool:
    return input_order(tv) == list(range(tv.ndim)) and tv.contiguity is not None


# ---- choosing host exprs ----------------------------------------------------------------------
def host_exprs(fusion, exprs) -> set:
    """ids of the exprs (of `exprs`, topologically ordered) that run on the host."""
    host: set = set()
    avail = {id(t) for t in fusion.tensor_inputs()}
    row_major = {id(t) for t in fusion.tensor_inputs() if _row_major(t)}
    for e in exprs:                                      # input side
        alias = _aliasing_contiguous(e)
        if not (alias or type(e) in HOST_RUNNERS) or id(e.inputs[0]) not in avail:
            continue
        if (alias or isinstance(e, E.ViewOp)) and id(e.inputs[0]) not in row_major:
            continue
        host.add(id(e))
        avail.add(id(e.output))
        if type(e) in KEEPS_ROW_MAJOR and id(e.inputs[0]) in row_major:
            row_major.add(id(e.output))
    in_set = {id(e) for e in exprs}
    outputs = {id(o) for o in fusion.outputs}
    for e in reversed(exprs):                            # output side
        if id(e) in host or type(e) not in HOST_RUNNERS:
            continue
        uses = [u for u in e.output.uses if id(u) in in_set]
        if (uses or id(e.output) in outputs) and all(id(u) in host for u in uses):
            host.add(id(e))
    return host


def host_layout(fusion, exprs, host: set) -> dict:
    """id(value) -> structural order (outermost first) for fusion inputs and host outputs."""
    orders = {id(t): input_order(t) for t in fusion.tensor_inputs()}
    for e in exprs:
        if id(e) in host and id(e.inputs[0]) in orders:
            orders[id(e.output)] = LAYOUT_RULES[type(e)](e, orders[id(e.inputs[0])])
    return orders
