"""Lowering of a HorizontalSchedule: K pointwise bodies in one kernel, one block range each.

Each component's body is what the pointwise lowering (lowering.py) builds for its own schedule
(a 1-D kernel: leading Lets of extents and block counts, then the grid loop). This module puts
them in one kernel IR:

  prologue: every component's leading Lets (c<k>_ prefixed), among them c<k>_nbx, its block
            count (ceil(elements / chunk), from the sizes); hz_s<k> = hz_s<k-1> + c<k-1>_nbx,
            the first block of component k (0 for component 0);
  body:     per component k: if (hz_s<k> <= blockIdx.x && blockIdx.x < hz_s<k> + c<k>_nbx)
            { c<k>_hb = blockIdx.x - hz_s<k>; the component's grid loop, with blockIdx.x read
            as c<k>_hb and gridDim.x as c<k>_nbx (so it runs once, for block c<k>_hb) }.

Every name of a component's kernel IR (parameters, Lets, arrays, loop indices; not the lanes
index `v`, which the interpreter knows by name) gets the prefix c<k>_, and its parameter sources
are renumbered from the component's segment tensors to the fusion's (tensor inputs, then
outputs) and from the component Fusion's Scalars to the fusion's. The launch grid is the sum of
the block counts, computed from the tensors' shapes as the kernel computes them. The CPU
interpreter runs this kernel IR; CUDA C is printed from it.
"""
from __future__ import annotations

import dataclasses

from ..errors import SchedulerError
from ..ir.tensor import TensorView
from ..schedule import layout as L
from . import kernel_ir as K
from .kernel_ir_rename import Rename
from .cuda import full_source, kernel_body
from .kernel import GeneratedKernel, KernelPlan, LaunchConfig, Param
from .lowering import Lowering, kernel_name

MAX_GRID_X = 2 ** 31 - 1


# ---- renaming a component's kernel IR --------------------------------------------------------
_POINTWISE_STATEMENTS = (K.Let, K.Alloc, K.Loop, K.If, K.Load, K.Store, K.Assign, K.Comment)


class _Relocate(Rename):
    """A component's body under prefix `prefix`, its special registers as `specials` says (any
    other is refused), pointwise statements only."""

    def __init__(self, prefix: str, specials: dict):
        super().__init__(lambda n: prefix + n, specials, strict=True, what="horizontal lowering")

    def s(self, st):
        if not isinstance(st, _POINTWISE_STATEMENTS):
            raise SchedulerError(f"horizontal lowering: {type(st).__name__} in a pointwise body")
        return super().s(st)


def scalar_map(sub) -> dict:
    """id(Scalar of an extracted sub-Fusion) -> the fusion's Scalar of the same value: its
    inputs (what extract says feeds them, `sub` an Extracted) and the extents of its tensor
    inputs."""
    out = {}
    for v, orig in zip(sub.fusion.inputs, sub.inputs):
        out[id(v)] = orig
        if isinstance(v, TensorView):
            for d, od in zip(v.logical, orig.logical):
                out.setdefault(id(d.extent), od.extent)
    return out


def param_source(src, seg_of, scalars, what: str = "horizontal lowering"):
    """A sub-Fusion kernel's Param source as the fusion's kernel's: its segment tensors through
    `seg_of`, its scalars through `scalars` (scalar_map)."""
    kind = src[0]
    if kind in ("ptr", "stride", "size", "numel"):
        return (kind, seg_of[src[1]]) + tuple(src[2:])
    if kind == "scalar":
        orig = scalars.get(id(src[1]))
        if orig is None:
            raise SchedulerError(f"{what}: parameter scalar {src[1]} has no counterpart in the "
                                 "fusion")
        return ("scalar", orig)
    raise SchedulerError(f"{what}: parameter source {kind!r} is not supported")


def _component_inplace(fusion, comp, sched, components) -> dict:
    """{fusion output index: fusion input index} of the fusion's in-place outputs (aliases)
    that component `comp` computes and writes into their input itself (its pointwise schedule
    decides: schedule/pointwise_inplace.py). An input is read by one component at most (the
    components share no tensor); one that another component reads is not written in place (that
    block range would read what this one writes), one no component reads is only written."""
    from ..schedule.pointwise_inplace import pointwise_inplace
    aliases = getattr(fusion, "aliases", None) or {}
    sub = comp.sub
    pairs, back = [], {}
    for local, oi in enumerate(comp.outputs):
        i = aliases.get(fusion.outputs[oi])
        if i is None:
            continue
        j = next((j for j, v in enumerate(sub.inputs) if v is i), None)
        if j is None:
            if not any(v is i for c in components for v in c.sub.inputs):
                back[oi] = fusion.inputs.index(i)
            continue
        pairs.append((local, j))
    local_io = pointwise_inplace(sched, pairs)
    for local, j in local_io.items():
        back[comp.outputs[local]] = fusion.inputs.index(sub.inputs[j])
    return back


# ---- the kernel ------------------------------------------------------------------------------
def build(hs, name: str):
    """(kernel IR, per component (index of its reference segment tensor, chunk elements));
    fills `hs.inplace` with the in-place outputs the kernel writes into their inputs."""
    params, tensors, prologue, body, refs = [], {}, [], [], []
    hs.inplace = {}
    bid = K.Special("blockIdx.x")
    start = None
    for k, (comp, sched) in enumerate(zip(hs.components, hs.schedules)):
        p = sched.params
        if p.kind != "1d":
            raise SchedulerError(f"horizontal lowering: component {k} is {p.kind}, not 1-D")
        hs.inplace.update(_component_inplace(hs.fusion, comp, sched, hs.components))
        kir = Lowering(sched).build(f"c{k}")
        pre = f"c{k}_"
        hb, nbx = K.Var(pre + "hb"), K.Var(pre + "nbx")
        rel = _Relocate(pre, {"blockIdx.x": hb, "gridDim.x": nbx, "threadIdx.x": K.Special("threadIdx.x")})
        seg_of, scalars = hs.seg_of[k], scalar_map(comp.sub)
        for q in kir.params:
            params.append(Param(rel.name(q.name), q.ctype, param_source(q.source, seg_of, scalars)))
        for tname, t in kir.tensors.items():
            tensors[rel.name(tname)] = dataclasses.replace(t, name=rel.name(tname), seg=seg_of[t.seg])
        stmts = rel.block(kir.body)
        lead = 0
        while lead < len(stmts) and isinstance(stmts[lead], K.Let):
            lead += 1
        if not any(isinstance(x, K.Let) and x.name == nbx.name for x in stmts[:lead]):
            raise SchedulerError(f"horizontal lowering: component {k} has no block count")
        prologue += stmts[:lead]
        if start is None:
            cond = K.Bin("<", bid, nbx)
            first = K.Const(0, "nidx_t")
        else:
            prologue.append(K.Let(f"hz_s{k}", "nidx_t", start))
            first = K.Var(f"hz_s{k}")
            cond = K.Bin("&&", K.Bin("<=", first, bid), K.Bin("<", bid, K.add(first, nbx)))
        inner = [K.Let(hb.name, "nidx_t", bid if start is None else K.Bin("-", bid, first))]
        body.append(K.Comment(f"component {k}: " + ", ".join(e.op_name for e in comp.exprs)))
        body.append(K.If(cond, inner + stmts[lead:]))
        start = nbx if start is None else K.add(first, nbx)
        refs.append((seg_of[len(sched.fusion.tensor_inputs())], p.unroll * p.block * p.vec))
    p = hs.params
    kir = K.Kernel(name, params, tensors, p.index_type, p.block, prologue + body, p.min_blocks)
    return kir, refs


def launch_fn(refs, block: int):
    def launch_config(bindings, tensors) -> LaunchConfig:
        total = 0
        for seg, chunk in refs:
            total += -(-L.numel(tensors[seg].shape) // chunk)
        if total == 0:
            return LaunchConfig((0, 1, 1), (block, 1, 1))
        if total > MAX_GRID_X:
            raise SchedulerError(f"horizontal kernel: {total} blocks exceed the grid's x limit")
        return LaunchConfig((total, 1, 1), (block, 1, 1))
    return launch_config


def plan_horizontal(fusion, inputs, hs) -> KernelPlan:
    name = "pf_hz" + kernel_name(fusion)[2:]
    kir, refs = build(hs, name)
    header = f"// pyfuser horizontal kernel: {hs.params.as_dict()}\n"
    kernel = GeneratedKernel(name, full_source(kir, header), list(kir.params),
                             launch_fn(refs, hs.params.block), hs.params.as_dict())
    orders = [None] * len(fusion.outputs)
    for comp, sched in zip(hs.components, hs.schedules):
        for local, oi in enumerate(comp.outputs):
            orders[oi] = sched.out_orders[local]
    plan = KernelPlan(fusion, "horizontal", hs.params, kernel, kir, kernel_body(kir), orders)
    plan.schedule = hs
    plan.inplace = dict(hs.inplace)
    return plan
