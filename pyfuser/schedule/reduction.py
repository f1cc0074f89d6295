"""The reduction-family schedulers: pure reductions, and inner / outer persistent normalizations.

All three take fusions that redu_graph.analyze accepts (one reduction domain, reductions and
pointwise ops around them) and produce one `ReductionSchedule`, lowered by
codegen/reduction_lowering.py into one kernel:

- "reduction": a pure reduction (sum, amax, var_mean, ...; full-size outputs that do not depend
  on a reduction are written in the same pass). Any layout. Streamed in steps, except inner
  rows that fit a block's registers, a row per SM or more, not online pairs or picks
  (reduction_heuristics.held_plan).
- "inner_persistent": a normalization (softmax, layer_norm, rms_norm, log_softmax, ...) whose
  reduced axes are innermost in memory (run-time check). A row is read once and held in
  registers when it fits (`persistent`), else re-read from L2 / memory pass by pass.
- "outer_persistent": a normalization with any other layout (reduced axes outside, e.g. over
  the batch of a channels-last tensor). Columns are held on chip when they fit, else re-read.

The plan (`schedule(fusion, inputs)`):
1. the reference domain is the reductions' input shape; size-1 axes whose size is a signature
   fact are dropped; the axes are ordered as the largest full-size input lays them out, and
   neighbouring axes of the same class (kept K / reduced R) that every access holds contiguously
   are collapsed into groups;
2. "inner" when the innermost group is reduced: a team of `bdimx` threads (a warp or a block
   slice) reduces one row of the kept index, `bdimy` rows per block, the row's inner group in
   vectors of `vec` elements; "outer" otherwise: `bdimx` threads span `bdimx * vec` columns of
   the innermost kept group and `bdimy` threads split the reduced index;
3. vector width as in the pointwise scheduler (16 bytes of the widest tensor that moves along
   the innermost group, where the inner extent, strides and alignment allow; a per-row int64
   target index does not narrow the vectors of bfloat16 logits);
4. heuristics (reduction_heuristics.py) pick the thread shape, the unroll and whether the row
   (inner) or column block (outer) is held in registers for the whole kernel (`steps` vectors per
   thread), from the sizes; those choices are part of the kernel's signature (`size_class`).

Invariant: the correctness of a plan depends only on the layout signature and the size class;
the kernel loops over any number of rows and any row length of that class.
"""
from __future__ import annotations

import os

from .. import dump as D
from ..errors import SchedulerError
from ..ir.base import Scalar
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import cache_policy
from . import layout as L
from . import reduction_graph as RG
from . import reduction_resize as RS
from .pointwise import _add_cat_extents, _extent_classes, _known_extent_ids
from .pointwise_access import make_access, vector_width
from .pointwise_graph import index_axes_of, shift_levels
from .reduction_heuristics import choose, held_plan, stageable
from .reduction_params import ReductionParams, ReductionSchedule


# ---- compile checks ---------------------------------------------------------------------------
def _graph(fusion, online: bool = True, picks: bool = True):
    """The fusion's ReductionGraph (cached on it; dropped when the fusion changes), or the
    reason it has none; `online=False`: the graph without online pairs, `picks=False`: without
    picks (reduction_patterns' module docstring)."""
    key = ("_pyfuser_reduction_graph" if online else "_pyfuser_reduction_graph_two_pass") + \
        ("" if picks else "_no_picks")
    cached = fusion.__dict__.get(key)
    if cached is None:
        try:
            cached = RG.analyze(fusion, online, picks)
        except RG.NotAReduction as e:
            cached = str(e)
        fusion.__dict__[key] = cached
    return cached


def _common_refusals(fusion):
    if not fusion.outputs:
        return "the fusion has no outputs"
    for v in list(fusion.inputs) + list(fusion.outputs):
        if v.dtype.is_complex:
            return f"complex dtype {v.dtype.name} of {v.name}"
    g = _graph(fusion)
    if isinstance(g, str):
        return g
    for e in fusion.used_exprs():
        for v in e.inputs + e.outputs:
            dt = getattr(v, "dtype", None)
            if dt is not None and dt.is_complex:
                return f"complex dtype {dt.name} of {v.name}"
    for o, node in zip(fusion.outputs, g.outputs):
        if node.kind == "load":
            return f"output {o.name} is an input (no compute)"
    return None


def _pure(fusion) -> bool:
    """Whether the fusion is a pure reduction, judged without picks: a pick of a loaded value
    is a row value from the first pass, so a full-size value computed from it would look pure,
    and the reduction scheduler's split grid cannot run the two passes that an outer kernel
    (which plans without picks) needs."""
    return _graph(fusion, picks=False).is_pure_reduction


def pure_by_picks(fusion) -> bool:
    """Whether the fusion is a pure reduction only through its picks: torch.compile's
    cross-entropy, nll_loss of a log_softmax, picks (x - max) - log(sum) from the row's one
    (max, sum) pass, where summing it over the row would need a second pass. Only fusions
    whose outputs are all row values (one with a full-size output, of a pick or not, stays a
    normalization's).
    The reduction scheduler takes it when the plan keeps its picks (an inner kernel:
    `_pick_layout`), the normalization schedulers otherwise."""
    g = _graph(fusion)
    return not isinstance(g, str) and bool(g.picks) and g.is_pure_reduction and \
        all(g.level[id(o)] == "row" for o in g.outputs) and not _pure(fusion)


def reduction_check(fusion) -> tuple[bool, str]:
    why = _common_refusals(fusion)
    if why:
        return False, why
    if not _pure(fusion) and not pure_by_picks(fusion):
        return False, "a reduction result flows back into full-size values (a normalization)"
    return True, ""


_NO_PICKS = ("this layout reads no picks (an outer kernel, or a pick's load not affine), and "
             "without them the fusion takes two passes (a normalization)")


def _pick_layout(fusion, inputs, bindings) -> tuple[bool, str]:
    """The reduction scheduler's run check: the lookup rule (_gather_layout), and for a
    fusion that is a pure reduction only through its picks, a layout whose plan keeps them
    (the layout alone: no heuristics run)."""
    ok, why = _gather_layout(fusion, inputs, bindings)
    if not ok or not pure_by_picks(fusion):
        return ok, why
    g = _graph(fusion)
    _, _, _, accesses, p = _layout(fusion, list(inputs), g)
    return (True, "") if _picks_kept(g, p, accesses) else (False, _NO_PICKS)


def normalization_check(fusion) -> tuple[bool, str]:
    why = _common_refusals(fusion)
    if why:
        return False, why
    if _pure(fusion):
        return False, "a pure reduction (the reduction scheduler's)"
    return True, ""


def _inner_layout(fusion, inputs, bindings) -> tuple[bool, str]:
    g = _graph(fusion)
    order, _ = _order_and_drops(fusion, g, inputs, bindings)
    if not order:
        return True, ""
    # (a lookup's index never changes along the reduced axes: reduction_graph refuses that,
    # so a reduced innermost axis needs no _gather_layout check)
    return (True, "") if order[-1] in g.R else \
        (False, "the innermost axis in memory is kept, not reduced")


def _gather_layout(fusion, inputs, bindings) -> tuple[bool, str]:
    """A lookup's loads move along the innermost axis in memory (the vectors' axis) with one
    index for the whole vector: its index must not change along that axis (an outer
    reduction's kept innermost axis may be a gathered one)."""
    g = _graph(fusion)
    axes = index_axes(g)
    if not axes:
        return True, ""
    order, _ = _order_and_drops(fusion, g, inputs, bindings)
    if order and order[-1] in axes:
        return False, "a lookup's index changes along the innermost axis in memory"
    return True, ""


def outer_split() -> bool:
    """$PYFUSER_OUTER_SPLIT=1: a streamed outer normalization on too few blocks is cut into a
    split reduction and pointwise kernels (_outer_grid; off by default until measured)."""
    return os.environ.get("PYFUSER_OUTER_SPLIT", "0") == "1"


def _outer_grid(fusion, inputs, bindings) -> tuple[bool, str]:
    """outer_persistent's run check: the lookup rule (_gather_layout), and, with
    PYFUSER_OUTER_SPLIT=1, a refusal of a streamed (not persistent) outer normalization whose
    kept columns fill fewer than a quarter of the multiprocessors with blocks while it reduces
    1024 rows or more. The plan splits no reduced axis over blocks: a training batch norm of 64
    channels over an NHWC tensor (ResNet-18's first, batch 8, 224 px: 25088 rows) was one block.
    Refused, the segment is cut into the other schedulers' kernels (segment/split.py): a
    reduction whose rows split over blocks, then a pointwise kernel reading its results."""
    ok, why = _gather_layout(fusion, inputs, bindings)
    if not ok or not outer_split():
        return ok, why
    from .pointwise_heuristics import sm_count
    p = schedule(fusion, inputs, "outer_persistent").params
    if p.kind != "outer" or p.persistent:
        return True, ""
    shape = _reference_shape(_graph(fusion), bindings)
    kept = rows = 1
    for group, red in zip(p.groups, p.reduced):
        for a in group:
            if red:
                rows *= int(shape[a])
            else:
                kept *= int(shape[a])
    blocks = -(-kept // max(p.bdimx * p.vec, 1))
    if 4 * blocks < sm_count() and rows >= 1024:
        return False, (f"an outer normalization of {kept} columns ({blocks} block(s)) streaming "
                       f"{rows} rows: split into a reduction and pointwise kernels")
    return True, ""


def index_axes(g) -> set:
    """Reference axes a lookup's index changes along (the keys of its load or iota): each is a
    group of its own (_collapse), so that a vector along the innermost group never crosses a
    change of index (an iota index, or a looked-up one, has no access of its own that would
    keep such axes apart), and none may be the innermost (_gather_layout)."""
    return set().union(*(index_axes_of(c[1]) for n in g.loads for c in n.key
                         if isinstance(c, tuple) and c[0] == "ix"))


# ---- layout -----------------------------------------------------------------------------------
def _reference_shape(g, bindings) -> list:
    return bindings.shape(RG.reductions(g.fusion)[0].inputs[0])


def _main_load(g, inputs):
    """(node, tensor) of the full-size load with the most elements (the layout reference)."""
    actual = [x for v, x in zip(g.fusion.inputs, inputs) if isinstance(v, TensorView)]
    tins = g.fusion.tensor_inputs()
    best = None
    for node in g.loads:
        if g.level[id(node)] != "full":
            continue
        x = actual[tins.index(node.tv)]
        if best is None or x.numel() > best[1].numel():
            best = (node, x)
    return best


def _order_and_drops(fusion, g, inputs, bindings):
    shape = _reference_shape(g, bindings)
    known = _known_extent_ids(fusion)
    ref_in = RG.reductions(fusion)[0].inputs[0]

    def proven(k):
        d = ref_in.logical[k]
        s = d.full_extent
        return s.is_const or id(s) in known

    dropped = [k for k in range(g.n) if shape[k] == 1 and proven(k)]
    main = _main_load(g, inputs)
    covered = []
    if main is not None:
        node, x = main
        sizes, strides = tuple(x.shape), tuple(x.stride())
        for j in L.stride_order(sizes, strides):
            lv = shift_levels(node.key[j])         # ("r", k), or k shifted (a resize operand)
            if lv is not None and lv[0] not in dropped and lv[0] not in covered:
                covered.append(lv[0])
    rest = [k for k in range(g.n) if k not in dropped and k not in covered]
    return rest + covered, dropped


def _collapse(order, shape, accesses, R, apart=frozenset()) -> list[list[int]]:
    """Neighbouring axes (in `order`) merge when both are reduced or both kept and every
    access is contiguous across them; an axis in `apart` (a lookup's index axis) stays alone."""
    groups: list[list[int]] = []
    for k in order:
        if groups:
            prev = groups[-1][-1]
            if (prev in R) == (k in R) and prev not in apart and k not in apart and all(
                    a.eff.get(prev, (0,))[0] == a.eff.get(k, (0,))[0] * shape[k] for a in accesses):
                groups[-1].append(k)
                continue
        groups.append([k])
    return groups


def _accesses(g, inputs, bindings, orders) -> list:
    fusion = g.fusion
    tins = fusion.tensor_inputs()
    actual = [x for v, x in zip(fusion.inputs, inputs) if isinstance(v, TensorView)]
    out = []
    for node in g.loads:
        i = tins.index(node.tv)
        x = actual[i]
        a = make_access(node, i, node.tv, False, x.element_size(), tuple(x.shape), tuple(x.stride()))
        a.ptr_align = L.p2(x.data_ptr()) if x.numel() else 16
        out.append(a)
    nin = len(tins)
    for oi, (o, node) in enumerate(zip(fusion.outputs, g.outputs)):
        sizes = tuple(bindings.shape(o))
        out.append(make_access(node, nin + oi, o, True, o.dtype.itemsize, sizes,
                           L.strides_for(sizes, orders[oi])))
    return out


def _classify(p: ReductionParams, accesses) -> None:
    """Each access's mode, and the cache policy of each load (`cache`). A kernel that writes no
    full-size output (a pure reduction: sums, var_mean, cross-entropy's logsumexp) reads its
    data through L2 with evict_first where the load moves along every axis (each element read
    once; reduction_lowering turns it into evict_last for a pass that a later pass reads again)
    so that its stream does not push out the dirty lines of earlier kernels' writes (H200, L2
    full of them as after do_bench's flush: row sums of 8192x3072 float32 34.5 -> 29.7 µs,
    bfloat16 21.2 -> 18.7, cross-entropy float32 156.7 -> 147.1). A normalization writing rows
    as large as its input was 2-4% slower so (layer_norm, rms_norm 8192x3072 float32): plain;
    loads broadcast along an axis (a layer norm's weight) stay plain. $PYFUSER_LOAD_CACHE
    overrides. Only contiguous vector loads take a policy (strided and per-row loads are
    plain); before sm_80 the prelude makes evict_first / evict_last accesses plain."""
    inner = p.groups[-1][-1] if p.groups else None
    axes = [k for g0 in p.groups for k in g0]

    def every_axis(a) -> bool:
        return bool(axes) and all(a.eff.get(k, (0,))[0] != 0 for k in axes)

    pure = not any(a.is_store and every_axis(a) for a in accesses)
    for a in accesses:
        s = a.eff.get(inner, (0,))[0] if inner is not None else 0
        a.mode = "bcast" if s == 0 else ("vector" if s == 1 else "strided")
        if not a.is_store and a.mode == "vector":      # the accesses a policy applies to
            a.cache = cache_policy.env_override("PYFUSER_LOAD_CACHE",
                                                "ef" if pure and every_axis(a) else "")


# ---- the plan ---------------------------------------------------------------------------------
def schedule(fusion, inputs, scheduler: str = "reduction", force=None) -> ReductionSchedule:
    """The plan (module docstring). A normalization with online pairs (softmax's max and sum of
    exp) is planned with two passes where that plan holds a row in one block's registers: the
    exp values are kept, one exp per element, which measured faster than the one-pass pair for
    rows that fit a block (bfloat16 softmax 8192x3072: 78% of a copy against 61%); rows on a
    cluster, streamed rows and pure reductions (logsumexp, cross-entropy) take the pair.
    $PYFUSER_RED_ONLINE=1 takes the pair wherever it applies, =0 nowhere. `force`: knob
    values fixed over the environment's (reduction_heuristics.choose)."""
    g = _graph(fusion)
    if isinstance(g, str):
        raise SchedulerError(f"{scheduler} scheduler: {g}")
    if g.online and scheduler != "reduction" and os.environ.get("PYFUSER_RED_ONLINE") != "1":
        two = _plan(fusion, inputs, scheduler, _graph(fusion, online=False), force)
        if two.params.persistent and two.params.cluster == 1:
            D.dump("scheduler_params", scheduler, lambda: _describe(two))
            return two
    sched = _plan(fusion, inputs, scheduler, g, force)
    D.dump("scheduler_params", scheduler, lambda: _describe(sched))
    return sched


def _layout(fusion, inputs, g):
    """The layout part of a plan, no heuristics: (bindings, output orders, reference shape,
    accesses with their modes, params with the groups, their reduced flags and the kind)."""
    bindings = bind(fusion, inputs)
    orders = L.eager_output_orders(fusion, inputs, bindings)
    shape = _reference_shape(g, bindings)
    order, dropped = _order_and_drops(fusion, g, inputs, bindings)
    accesses = _accesses(g, inputs, bindings, orders)
    R = set(g.R)
    p = ReductionParams(dropped=dropped, passes=g.n_passes, online=bool(g.online))
    p.groups = _collapse(order, shape, accesses, R, index_axes(g) | RS.apart(g))
    p.reduced = [g0[0] in R for g0 in p.groups]
    p.kind = "inner" if (not p.groups or p.reduced[-1]) else "outer"
    _classify(p, accesses)
    return bindings, orders, shape, accesses, p


def _picks_kept(g, p, accesses) -> bool:
    """Whether a plan of this layout reads the graph's picks: a pick reads one element of a
    row, in inner kernels, through an affine access (vector or strided, not shifted)."""
    return p.kind == "inner" and not any(
        a.mode not in ("vector", "strided") or a.shifts for a in accesses
        if any(a.node is pk.load for pk in g.picks.values()))


def _plan(fusion, inputs, scheduler: str, g, force=None) -> ReductionSchedule:
    inputs = list(inputs)
    bindings, orders, shape, accesses, p = _layout(fusion, inputs, g)
    ext = [L.numel(shape[k] for k in g0) for g0 in p.groups]
    known = _known_extent_ids(fusion)
    ref_in = RG.reductions(fusion)[0].inputs[0]
    proven = _proven(fusion, g, known)
    inner_proven = all(proven(ref_in.logical[k].extent) for k in (p.groups[-1] if p.groups else []))
    inner_k = p.groups[-1][-1] if p.groups else None
    moving = [a for a in accesses if a.eff.get(inner_k, (0,))[0] != 0]   # lanes move along it
    p.vec = vector_width(p.groups, ext, moving, inner_proven) if p.groups and moving else 1

    def size_of(d):     # an axis' size where the signature holds its facts, else None
        n = d.known_size()
        return n if n is not None else (bindings.value(d.full_extent)
                                         if id(d.full_extent) in known else None)
    # pads, cats and shifted loads keep vectors only where every vector lies on one side of
    # their bounds and shifts move by whole vectors (reduction_resize.vector_ok)
    while p.vec > 1 and not RS.vector_ok(g, accesses, p.groups, p.vec, size_of):
        p.vec //= 2
    p.index_type = "int64_t" if L.needs_int64(inputs, L.numel(shape)) else "int"
    if g.picks and not _picks_kept(g, p, accesses):
        if scheduler == "reduction" and not _pure(fusion):     # _pick_layout refuses these
            raise SchedulerError(f"reduction scheduler: {_NO_PICKS}")
        return _plan(fusion, inputs, scheduler, _graph(fusion, g.online_asked, picks=False),
                     force)
    keep = scheduler != "reduction" and os.environ.get("PYFUSER_RED_KEEP") != "0"
    kept = RG.recompute_costly(g) if keep else []
    choose(p, ext, g, accesses, scheduler != "reduction", kept, force)
    if kept and not p.persistent:          # persistent without keeping values, if that fits
        kept = []
        choose(p, ext, g, accesses, scheduler != "reduction", kept, force)
    if scheduler == "reduction":
        p = held_plan(p, ext, g, accesses, force)
    p.kept = len(kept) if p.persistent else 0
    sched = ReductionSchedule(fusion, fusion, {id(v): v for v in fusion.vals if isinstance(v, Scalar)},
                              g, p, accesses, orders, shape, scheduler,
                              kept if p.persistent else [], RS.shared_buffers(g, accesses))
    return sched


def _proven(fusion, g, known):
    """Whether an extent Scalar's facts are the signature's: a constant or an input's (or a
    view's) extent, or, with pads and cats in the kernel, one an elementwise op joins with
    such an extent, or a cat's of such operands (pointwise._add_cat_extents)."""
    if not RS.resized(g):
        return lambda s: s.is_const or id(s) in known
    uf = _extent_classes(fusion, cats=True)
    classes = {id(uf["find"](d.extent)) for t in fusion.tensor_inputs() for d in t.logical}
    _add_cat_extents(fusion, uf, classes)
    return lambda s: s.is_const or id(s) in known or id(uf["find"](s)) in classes


def _describe(s: ReductionSchedule) -> str:
    p = s.params
    held = RG.held_loads(s.graph)
    lines = [f"kind={p.kind} persistent={p.persistent} vec={p.vec} block=({p.bdimx}, {p.bdimy}) "
             f"unroll={p.unroll} steps={p.steps} splits={p.splits} cluster={p.cluster} "
             f"stage={p.stage} "
             f"kept={[n.tv.name for n in s.kept]} "
             f"index={p.index_type} passes={p.passes} online={p.online}"
             + (f" picks={[n.tv.name for n in s.graph.nodes if id(n) in s.graph.picks]}"
                if s.graph.picks else ""),
             f"groups={p.groups} reduced={p.reduced} dropped={p.dropped} ({p.reason})"]
    for a in s.accesses:
        lines.append(f"  {'store' if a.is_store else 'load '} {a.tv.name}: mode={a.mode} "
                     f"level={s.graph.level[id(a.node)]}"
                     + ("" if a.is_store else f" cache={a.cache or 'plain'}")
                     + (" staged" if stageable(p, a, held) else ""))
    return "\n".join(lines)


def rows_cover_outputs(fusion, inputs, bindings) -> tuple[bool, str]:
    """A run check of every reduction-family scheduler: the kernel iterates over the kept axes
    of the reduction's input (its rows), so where those are empty no output may have elements.
    An output along a broadcast axis that a slice (or an expand) made empty for the reduction,
    `v = x * 2` of a [1, n] x returned beside `v[0:0].sum(-1)`, was stored by no row: its
    memory was never written (FX dynamic seed 918735). Refused, the segment is cut into kernels
    of their own (segment/split.py): a pointwise one writes v."""
    import math
    red = RG.reductions(fusion)
    if not red:
        return True, ""
    shape = bindings.shape(red[0].inputs[0])
    if math.prod(int(n) for a, n in enumerate(shape) if a not in red[0].axes):
        return True, ""
    for o in fusion.outputs:
        if isinstance(o, TensorView) and math.prod(int(n) for n in bindings.shape(o)):
            return False, (f"the reduction has no rows and output {o.name} has elements "
                           f"(its rows are not the reduction's)")
    return True, ""


def _both(check):
    def run(fusion, inputs, bindings):
        ok, why = rows_cover_outputs(fusion, inputs, bindings)
        return (ok, why) if not ok or check is None else check(fusion, inputs, bindings)
    return run


def _entry(name, compile_check, run_check=None):
    from .registry import Scheduler
    return Scheduler(name, compile_check, lambda f, i: schedule(f, i, name),
                     _both(run_check),
                     lambda f, i: schedule(f, i, name).params.size_class())


def schedulers() -> list:
    return [_entry("reduction", reduction_check, _pick_layout),
            _entry("inner_persistent", normalization_check, _inner_layout),
            _entry("outer_persistent", normalization_check, _outer_grid)]
