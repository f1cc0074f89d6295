"""What a reduction-family kernel needs at launch, beside its kernel IR: the launch
configuration from the bound sizes (grid over rows / column blocks, splits over blockIdx.z) and
the sizes of a grid reduction's workspaces; `plan_reduction_kernel` puts the three together.

Invariants: a persistent kernel's size class covers the row it is launched on (else an
AssertionError, never a partial result); an empty output launches no block; max / min over an
empty reduced axis raise, as eager does.
"""
from __future__ import annotations

from ..errors import ExecuteError
from ..ir import exprs as E
from ..schedule import layout as L
from ..schedule import reduction_graph as RG
from .kernel import LaunchConfig
from .reduction_lowering import MAX_GRID_X, MAX_GRID_Y


def plan_reduction_kernel(sched, name: str):
    """(kernel IR, launch_config, workspace sizes) of a reduction-family schedule."""
    from .reduction_kernels import InnerKernel
    from .reduction_outer import OuterKernel
    low = (InnerKernel if sched.params.kind == "inner" else OuterKernel)(sched)
    kir = low.build(name)
    sched.inplace_pairs = list(low.inplace)
    return kir, launch_fn(sched), workspace_fn(sched, low.workspaces) if low.workspaces else None


def workspace_fn(sched, workspaces):
    """(bindings, tensors) -> [(elements, torch dtype, kind)] of the grid reduction's buffers:
    "partials" (per partial value [other kept x splits x columns], any contents) and
    "semaphores" (one per column block; zero before a launch, left zero by it)."""
    p = sched.params
    ref = RG.reductions(sched.fusion)[0].inputs[0]

    def sizes(bindings, tensors):
        shape = bindings.shape(ref)
        kept = [L.numel(shape[k] for k in g) for g, r in zip(p.groups, p.reduced) if not r]
        cols, nko = kept[-1], L.numel(kept[:-1])
        ncb = -(-cols // (p.bdimx * p.vec))
        return [(max(1, nko * p.splits * cols) if kind == "partials" else max(1, nko * ncb),
                 dt.torch, kind) for _, dt, kind in workspaces]
    return sizes


def launch_fn(sched):
    p = sched.params
    groups, reduced = p.groups, p.reduced
    ref = RG.reductions(sched.fusion)[0].inputs[0]
    minmax = [e.info.name for e in sched.graph.reduces
              if isinstance(e, E.ReductionOp) and e.info.name in ("max", "min")]

    def launch_config(bindings, tensors) -> LaunchConfig:
        shape = bindings.shape(ref)
        ext = [L.numel(shape[k] for k in g) for g in groups]
        red = [x for x, r in zip(ext, reduced) if r]
        kept = [x for x, r in zip(ext, reduced) if not r]
        block = (p.bdimx, p.bdimy, 1)
        if minmax and L.numel(shape[k] for k in sched.graph.R) == 0 and any(
                t.numel() for t in tensors[len(tensors) - len(sched.fusion.outputs):]):
            raise ExecuteError(f"{minmax[0]}(): cannot reduce over a dimension of size 0 "
                               "(eager raises too)")
        if L.numel(shape) == 0 and L.numel(shape[k] for k in sched.graph.K) == 0:
            return LaunchConfig((0, 1, 1), block)
        cap = p.max_blocks or MAX_GRID_X
        if p.kind == "inner":
            rows = L.numel(kept)
            if p.persistent and red:    # the row: every reduced group (one linear index)
                _check_cover(L.numel(red), p.steps * p.bdimx * p.vec * p.cluster)
            if rows == 0:
                return LaunchConfig((0, 1, 1), block)
            C = p.cluster                            # whole clusters: one per row block
            return LaunchConfig((min(-(-rows // p.bdimy), cap // C, MAX_GRID_X // C) * C, 1, 1),
                                block)
        cols = kept[-1] if kept else 1
        nko = L.numel(kept[:-1])
        if p.persistent:
            _check_cover(L.numel(red), p.steps * p.bdimy)
        if cols == 0 or nko == 0:
            return LaunchConfig((0, 1, 1), block)
        gx = min(-(-cols // (p.bdimx * p.vec)), MAX_GRID_X)
        if p.splits > 1:      # the grid reduction needs every (column block, other kept) block
            return LaunchConfig((gx, min(nko, MAX_GRID_Y), p.splits), block)
        gy = min(nko, MAX_GRID_Y, max(1, cap // gx))
        return LaunchConfig((gx, gy, 1), block)
    return launch_config


def _check_cover(n, covered) -> None:
    if n > covered:
        raise AssertionError(f"persistent kernel holds {covered} elements a row but the row has "
                             f"{n}: its size class does not match these sizes")

