"""The inner_outer_persistent scheduler: row reductions and column sums of one domain, one kernel.

A layer norm's backward (dx from two sums over each row, dweight and dbias from sums over the
rows) used to be two kernels, the second reading dy and x again. This scheduler takes fusions
inner_outer_graph.analyze accepts and plans one persistent kernel (codegen/inner_outer_lowering.py):

- the inner part is the inner-persistent normalization kernel (reduction_kernels.InnerKernel):
  a team of `bdimx` threads holds a row in registers (`steps` vectors of `vec` elements a
  thread), `bdimy` rows a block, the kernel grid-striding over row blocks; dx is written from
  the registers;
- a thread owns the same columns in every row it touches, so it adds the outer reductions'
  inputs into per-column partials in registers (`steps` x `vec` per sum) across all its rows;
- after the rows the block's teams combine their partials (a halving tree in shared memory),
  each block writes one partial row to a workspace, and the column sums are finished inside the
  same kernel (see the lowering's docstring: the last blocks to arrive share the columns).

Compile check: analyze() (the reason of a refusal goes to `segmenter_logging`). Run check: the
normalized axes are innermost in memory and one group, and the row plus the column partials fit
the register budget (64 K registers a block: rows up to 8 K float32 / 12 K bfloat16 elements)
(else the two-kernel path runs: the executor splits the segment, segment/split.py); the block's
shared memory fits.

Invariant: the plan's correctness depends on the layout signature and the size class only; the
grid (blocks, finishers) is computed from sizes at launch and the kernel is correct for any.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from .. import dump as D
from ..errors import SchedulerError
from ..ir.base import Scalar
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import layout as L
from . import reduction_graph as RG
from .inner_outer_graph import NotInnerOuter, analyze
from .pointwise import _known_extent_ids
from .pointwise_access import make_access, vector_width
from .pointwise_heuristics import sm_count
from .reduction import _classify, _collapse, index_axes
from .reduction_params import ReductionParams, ReductionSchedule

NAME = "inner_outer_persistent"
REG_BUDGET = 96          # registers a thread for held row vectors, kept values, column partials
STEPS_TARGET = 4         # vectors of the row a thread holds, about
MAX_VEC = 4              # elements a vector (half / bfloat16: 8-byte accesses)
BLOCK_TARGET = 256       # threads a block, about
SHARED_BUDGET = 40 * 1024  # bytes of static shared memory the combines may take
REGS_OVERHEAD = 40       # registers a thread besides the held data (addresses, loop state)


@dataclass
class InnerOuterParams(ReductionParams):
    fin_x: int = 1             # finishing: threads across column vectors (the rest split blocks)
    finishers: int = 1         # at most this many blocks finish the column sums (<= SMs)
    blocks_per_sm: int = 1     # grid cap: blocks_per_sm x SMs
    outer: int = 0             # column sums

    def size_class(self) -> tuple:
        return super().size_class() + (self.fin_x, self.finishers)


@dataclass
class InnerOuterSchedule(ReductionSchedule):
    io: object = None                         # the InnerOuterGraph
    col_accesses: list = field(default_factory=list)   # per-column loads and outputs


# ---- compile check ----------------------------------------------------------------------------
def _graph(fusion):
    cached = fusion.__dict__.get("_pyfuser_inner_outer_graph")
    if cached is None:
        try:
            cached = analyze(fusion)
        except NotInnerOuter as e:
            cached = str(e)
        fusion.__dict__["_pyfuser_inner_outer_graph"] = cached
    return cached


ENABLE_ENV = "PYFUSER_INNER_OUTER"


def compile_check(fusion) -> tuple[bool, str]:
    if os.environ.get(ENABLE_ENV) == "0":
        return False, f"turned off (${ENABLE_ENV}=0)"
    if not fusion.outputs:
        return False, "the fusion has no outputs"
    for e in fusion.used_exprs():
        for v in e.inputs + e.outputs:
            dt = getattr(v, "dtype", None)
            if dt is not None and dt.is_complex:
                return False, f"complex dtype {dt.name} of {v.name}"
    if getattr(fusion, "aliases", None):
        return False, "in-place outputs"
    io = _graph(fusion)
    if isinstance(io, str):
        return False, io
    for k, node in zip(io.inner_outputs, io.inner.outputs):
        if node.kind == "load":
            return False, f"output {fusion.outputs[k].name} is an input (no compute)"
    return True, ""


# ---- the plan ---------------------------------------------------------------------------------
def _env(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def _pow2ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _order_and_drops(io, inputs, bindings, accesses):
    """Reference axes ordered as the largest full-size input lays them out (outer first), after
    the other axes; size-1 axes whose size is a signature fact are dropped."""
    fusion, g = io.fusion, io.inner
    shape = bindings.shape(io.ref)
    known = _known_extent_ids(fusion)

    def proven(k):
        d = io.ref.logical[k]
        s = d.full_extent
        return s.is_const or id(s) in known

    dropped = [k for k in range(g.n) if shape[k] == 1 and proven(k)]
    best = None
    for a in accesses:
        if a.is_store or g.level.get(id(a.node)) != "full":
            continue
        if best is None or L.numel(a.sizes) > L.numel(best.sizes):
            best = a
    covered = []
    if best is not None:
        for j in L.stride_order(best.sizes, best.strides):
            c = best.node.key[j]
            if c != 0 and c[0] == "r" and c[1] not in dropped and c[1] not in covered:
                covered.append(c[1])
    rest = [k for k in range(g.n) if k not in dropped and k not in covered]
    return rest + covered, dropped, shape


def _accesses(io, inputs, bindings, orders) -> tuple[list, list]:
    """(accesses of the row kernel: loads of the inner graph, stores of its outputs;
    accesses of the column part: per-column loads, the column sums' outputs)."""
    fusion = io.fusion
    tins = fusion.tensor_inputs()
    actual = [x for v, x in zip(fusion.inputs, inputs) if isinstance(v, TensorView)]
    nin = len(tins)

    def load(node):
        i = tins.index(node.tv)
        x = actual[i]
        a = make_access(node, i, node.tv, False, x.element_size(), tuple(x.shape), tuple(x.stride()))
        a.ptr_align = L.p2(x.data_ptr()) if x.numel() else 16
        return a

    def store(k, node):
        o = fusion.outputs[k]
        sizes = tuple(bindings.shape(o))
        return make_access(node, nin + k, o, True, o.dtype.itemsize, sizes,
                       L.strides_for(sizes, orders[k]))

    row = [load(n) for n in io.inner.loads]
    row += [store(k, n) for k, n in zip(io.inner_outputs, io.inner.outputs)]
    col = [load(n) for n in io.col_loads] + [store(k, n) for k, n in io.col_outputs]
    return row, col


def _regs_per_step(p, io, accesses, kept) -> tuple[float, float]:
    """(registers of one vector step of the held row data, of the column partials)."""
    held = RG.held_loads(io.inner)
    loads = sum(p.vec * a.itemsize for a in accesses if not a.is_store and id(a.node) in held)
    kept_b = sum(p.vec * n.tv.dtype.compute.itemsize for n in kept)
    acc_b = sum(p.vec * e.outputs[0].dtype.compute.itemsize for e in io.outer)
    return (loads + kept_b) / 4, acc_b / 4


def plan(fusion, inputs) -> InnerOuterSchedule:
    """The schedule, or SchedulerError saying why these inputs do not fit (the run check)."""
    io = _graph(fusion)
    if isinstance(io, str):
        raise SchedulerError(f"{NAME} scheduler: {io}")
    g = io.inner
    inputs = list(inputs)
    bindings = bind(fusion, inputs)
    orders = L.eager_output_orders(fusion, inputs, bindings)
    row_acc, col_acc = _accesses(io, inputs, bindings, orders)
    order, dropped, shape = _order_and_drops(io, inputs, bindings, row_acc)
    R = set(io.I)
    p = InnerOuterParams(dropped=dropped, passes=g.n_passes, outer=len(io.outer))
    p.groups = _collapse(order, shape, row_acc + col_acc, R, index_axes(g))
    p.reduced = [g0[0] in R for g0 in p.groups]
    if p.groups and not p.reduced[-1]:
        raise SchedulerError(f"{NAME}: the innermost axis in memory is a row axis, not a "
                             "normalized one")
    if sum(p.reduced) > 1:
        raise SchedulerError(f"{NAME}: the normalized axes are not one contiguous group in memory")
    ext = [L.numel(shape[k] for k in g0) for g0 in p.groups]
    known = _known_extent_ids(fusion)
    inner_proven = all(io.ref.logical[k].extent.is_const or id(io.ref.logical[k].extent) in known
                       for k in (p.groups[-1] if p.groups else []))
    inner_k = p.groups[-1][-1] if p.groups else None
    moving = [a for a in row_acc + col_acc if a.eff.get(inner_k, (0,))[0] != 0]
    p.vec = vector_width(p.groups, ext, moving, inner_proven) if p.groups and moving else 1
    # column partials take registers per element: vectors of at most MAX_VEC elements (H200,
    # bfloat16 layer-norm backward 8192x3072: 8 -> 4 elements, 128 -> 70 registers, 2 -> 3
    # blocks an SM, 71.3 -> 60.5 µs); $PYFUSER_IO_VEC overrides the cap
    p.vec = max(1, min(p.vec, _env("PYFUSER_IO_VEC") or MAX_VEC))
    p.index_type = "int64_t" if L.needs_int64(inputs, L.numel(shape)) else "int"
    _classify(p, row_acc)
    _classify(p, col_acc)
    kept = RG.recompute_costly(g)
    rlen = ext[-1] if p.groups and p.reduced[-1] else 1
    rows = L.numel(x for x, r in zip(ext, p.reduced) if not r)
    row_regs, acc_regs = _regs_per_step(p, io, row_acc, kept)
    if not _choose(p, rlen, rows, row_regs + acc_regs) and kept:
        kept = []                       # recompute instead of keeping, if that fits
        row_regs, acc_regs = _regs_per_step(p, io, row_acc, kept)
        _choose(p, rlen, rows, row_regs + acc_regs)
    if not p.persistent:
        raise SchedulerError(f"{NAME}: {p.reason}")
    p.kept = len(kept)
    sched = InnerOuterSchedule(fusion, fusion, {id(v): v for v in fusion.vals if isinstance(v, Scalar)},
                               g, p, row_acc, orders, shape, NAME, kept, io=io, col_accesses=col_acc)
    D.dump("scheduler_params", NAME, lambda: _describe(sched))
    return sched


def shared_bytes(p) -> int:
    """Static shared memory of the two combines: the teams' halving tree and the finishing tree."""
    cols = p.steps * p.bdimx * p.vec
    tree = (p.bdimy // 2) * cols * 4 * p.outer
    fy = (p.bdimx * p.bdimy) // p.fin_x
    fin = (fy * p.fin_x * p.vec * 4 * p.outer) if fy > 1 else 0
    return tree + fin


def _budget(bdimx: int) -> int:
    """Registers of held data a thread may take in a block of max(bdimx, BLOCK_TARGET) threads:
    REG_BUDGET, and no more than the register file (64 K) shared by the block's threads leaves
    beside REGS_OVERHEAD (a 1024-thread block has 64 registers a thread in all)."""
    return min(REG_BUDGET, 65536 // max(bdimx, BLOCK_TARGET) - REGS_OVERHEAD)


def _choose(p, rlen: int, rows: int, per_step: float) -> bool:
    """Thread shape, steps, grid cap and finishing shape; p.persistent False (p.reason why) when
    the row and its column partials do not fit."""
    knob = {k: _env(f"PYFUSER_IO_{k.upper()}") for k in ("bdimx", "bdimy", "blocks")}
    nv = max(1, -(-rlen // p.vec))
    p.cluster, p.unroll, p.splits = 1, 1, 1
    bdimx = knob["bdimx"] or min(1024, _pow2ceil(-(-nv // STEPS_TARGET)))
    while not knob["bdimx"] and bdimx < 1024 and -(-nv // bdimx) * per_step > _budget(bdimx):
        bdimx *= 2
    steps = -(-nv // bdimx)
    p.bdimx, p.steps = bdimx, steps
    if steps * per_step > _budget(bdimx) and not knob["bdimx"]:
        p.persistent = False
        p.reason = (f"a row of {rlen} needs {steps * per_step:.0f} registers a thread for its "
                    f"vectors and column partials at {bdimx} threads (budget {_budget(bdimx)})")
        return False
    p.bdimy = knob["bdimy"] or max(1, min(BLOCK_TARGET // bdimx, _pow2ceil(rows)))
    while p.bdimx > 1 and p.bdimx * p.bdimy < 32:        # shuffles name the full warp
        p.bdimy *= 2
    for d in (p.bdimx, p.bdimy):
        if d & (d - 1) or p.bdimx * p.bdimy > 1024:
            raise SchedulerError(f"{NAME}: thread shape ({p.bdimx}, {p.bdimy}): powers of two "
                                 "of at most 1024 threads")
    threads = p.bdimx * p.bdimy
    regs = steps * per_step + REGS_OVERHEAD
    p.blocks_per_sm = knob["blocks"] or max(1, min(2048 // threads, int(65536 // (threads * regs))))
    p.max_blocks = p.blocks_per_sm * sm_count()
    p.finishers = max(1, sm_count())
    # the finishing shape from the row length and the grid cap only (not the row count), so
    # that a new batch size keeps the size class (and the kernel)
    nb = max(1, p.max_blocks)
    ncv = max(1, -(-rlen // p.vec))
    fins = max(1, min(nb, ncv, p.finishers))
    per_fin = -(-ncv // fins)
    p.fin_x = min(threads, max(_pow2ceil(per_fin), threads // _pow2ceil(nb)))
    while shared_bytes(p) > SHARED_BUDGET and p.fin_x < threads:
        p.fin_x *= 2
    if shared_bytes(p) > SHARED_BUDGET:
        p.persistent = False
        p.reason = f"the combines need {shared_bytes(p)} bytes of shared memory"
        return False
    p.persistent = True
    p.reason = (f"inner-outer: {rows} rows of {rlen}, {nv} vectors a row, {steps} a thread; "
                f"{p.outer} column sums, {p.blocks_per_sm} blocks an SM, finishing "
                f"{p.fin_x} x {threads // p.fin_x}")
    return True


def _describe(s: InnerOuterSchedule) -> str:
    p = s.params
    lines = [f"kind=inner-outer persistent={p.persistent} vec={p.vec} block=({p.bdimx}, {p.bdimy}) "
             f"steps={p.steps} kept={[n.tv.name for n in s.kept]} index={p.index_type} "
             f"passes={p.passes} outer={p.outer} blocks_per_sm={p.blocks_per_sm} "
             f"finishers<={p.finishers} fin_x={p.fin_x}",
             f"groups={p.groups} reduced={p.reduced} dropped={p.dropped} ({p.reason})"]
    for a in s.accesses + s.col_accesses:
        level = s.graph.level.get(id(a.node), "column")
        lines.append(f"  {'store' if a.is_store else 'load '} {a.tv.name}: mode={a.mode} "
                     f"level={level}")
    return "\n".join(lines)


def run_check(fusion, inputs, bindings) -> tuple[bool, str]:
    from .reduction import rows_cover_outputs
    ok, why = rows_cover_outputs(fusion, inputs, bindings)
    if not ok:
        return ok, why
    try:
        plan(fusion, inputs)
    except SchedulerError as e:
        return False, str(e)
    return True, ""


def scheduler():
    from .registry import Scheduler
    return Scheduler(NAME, compile_check, plan, run_check,
                     lambda f, i: plan(f, i).params.size_class())
