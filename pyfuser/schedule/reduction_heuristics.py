"""Heuristics of the reduction-family schedulers: thread shape, unroll, persistence, grid.

Inputs are plain numbers (the collapsed group extents seen when planning, the vector width the
layout allows, the bytes each vector step holds, the device's SM count); the output fills a
`ReductionParams`. The lowering is correct for any choice; the choices are part of the kernel's
size class (signature), so a kernel built for one shape serves every shape that picks the same.

Inner (reduced axes innermost): a row of `nv` vectors is split over a team of `bdimx` threads
(a power of two, 1..1024), each holding `steps` vectors when persistent (about 8, so that every
thread has 8 loads in flight and the team is small: fewer shuffle steps; a pure reduction's
team has at least enough threads for a step to read 128 bytes of the row, where it has them),
and `bdimy` rows share
a block of at least 128 threads. A row stays in registers when its data needs at most 64
registers a thread (32 with 1024 threads: 64 K registers an SM); otherwise it is streamed,
`unroll` vectors a step, about 16 vectors a thread (a warp per row of 2 K floats: no shared
memory, no barrier), a wider team only when there are too few rows to fill the GPU, and re-read
for each later pass (from L2 when the rows in flight fit). Pure reductions stream, unless the
scheduler asks for a held row (`held_plan`: a row per SM or more, not online pairs or picks).
Outer (kept axes innermost): `bdimx` threads (up to 32) span the columns, `bdimy` threads split the
reduced index (256 threads a block), `unroll` rows a step; persistent when a thread's share of
the column block fits the same register budget.
Grid: inner kernels take a block per row block (no cap); outer kernels at most `waves` x SMs x
resident blocks (the kernel grid-strides over the column blocks).

Rows too long for a block's registers are split over a thread-block cluster of 2-8 blocks of 256
threads on sm_90, each holding its share in registers and combining through distributed shared
memory: the row is still read once.
A row's cluster stages its held loads in shared memory with asynchronous copies (`cp.async`,
sm_80+) where they fit STAGE_BYTES a block: every thread issues all its copies at once, waits,
then reads its own vectors back (one vector read a step; no barrier); the registers they
would take are free (more blocks an SM) and shared memory holds bytes in flight besides the
register file. Such a block asks for registers for 6 blocks an SM (`min_blocks`, 40 registers a
thread) where 6 blocks' staged rows fit the SM's shared memory and no value is kept in registers
between passes (those spill under 40).
Outer pure reductions with few column blocks split the reduced index over blockIdx.z (a grid
reduction through a workspace), until the grid covers every SM twice.

Tuning knobs (speed only): $PYFUSER_RED_BDIMX, $PYFUSER_RED_BDIMY (powers of two),
$PYFUSER_RED_UNROLL, $PYFUSER_RED_STEPS (0 turns persistence off, any other value forces it),
$PYFUSER_RED_WAVES, $PYFUSER_RED_SPLITS, $PYFUSER_RED_CLUSTER (blocks a row's cluster, a power
of two up to 16, forcing one), $PYFUSER_RED_STAGE (0: never stage held loads in shared memory;
1: stage them in every persistent inner kernel where they fit), $PYFUSER_RED_STAGE_BYTES (the
bytes a block may stage, STAGE_BYTES by default; past 48 KB the kernel's shared arrays are
dynamic shared memory: codegen/kernel_shared.py), $PYFUSER_RED_HOLD (0: pure reductions always
streamed; 1: held wherever they fit, any number of rows; by default a row per SM or more, not
online pairs or picks: `held_plan`), $PYFUSER_RED_TEAM_BYTES (the bytes of a row a team step
reads at least, TEAM_BYTES by default, 0: no floor: `_team_floor`), $PYFUSER_RED_MIN_BLOCKS
(blocks an SM for __launch_bounds__, capping registers), $PYFUSER_RED_KEEP=0 (normalizations
recompute costly values in each pass instead of keeping them in registers); the last two apply
to the reduction and persistent kernels planned here, not to the inner-outer ones
(schedule/inner_outer.py); $PYFUSER_RED_FULL (0: every inner kernel checks its bounds; 1: none
does where its rows are whole, also where the default keeps the checks); $PYFUSER_RED_FENCE=1
(staged rows of whole steps check no bounds but step under a uniform true condition:
ReductionParams.fence; off by default); $PYFUSER_RED_GRID_BLOCKS=N (a row's cluster kernel
launches at most N blocks, each cluster looping over rows) and $PYFUSER_RED_PREFETCH=1 (such a
loop issues the next row's staged copies at the end of this row: ReductionParams.prefetch);
$PYFUSER_RED_SPLIT_CLUSTER=1 (a cluster row's barrier at the end of the row split into an arrive
after its combine and a wait at the row's end: codegen/reduction_kernels.py; off by default);
$PYFUSER_RED_CLUSTER_PUSH=0 (a cluster row's partials read through cluster barriers instead of
pushed to every rank and counted on mbarriers: ReductionParams.push, on by default);
$PYFUSER_CLUSTERS=0 never uses clusters.
"""
from __future__ import annotations

import dataclasses
import os

from .pointwise_heuristics import sm_count
from .reduction_resize import guarded

REG_BUDGET = 64          # registers of persistent data per thread (<= 1024-thread blocks: 32)
STEPS_TARGET = 8         # vectors per thread in a persistent row ...
STEP_REGS = 40           # ... unless they would take more registers than this
STREAM_VECTORS = 16      # streamed rows: vectors a thread (steps of `unroll` vectors)
TEAM_BYTES = 128         # an inner row's team step reads this many bytes of the row at least
CLUSTER_BLOCK = 256      # threads of each block of a row's cluster
MAX_CLUSTER = 16         # blocks a cluster at most (sm_90; above 8 the size is non-portable)
MIN_BLOCK = 128          # threads per block at least (rows share blocks)
STAGE_BYTES = 40 * 1024  # shared memory a block stages held loads in, at most (static: 48 KB)
MAX_STAGE_BYTES = 200 * 1024  # ... past 48 KB in dynamic shared memory (codegen/kernel_shared.py)
CLUSTER_MIN_BLOCKS = 6   # blocks an SM a staged cluster row asks registers for (launch bounds) ...
CLUSTER_STAGE_BYTES = 36 * 1024  # ... when its staged bytes let that many share an SM's 228 KB


def _pow2ceil(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def _env(name):
    v = os.environ.get(name)
    return int(v) if v not in (None, "") else None


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


def _regs_per_step(p, accesses, held, kept) -> float:
    """Registers one vector step of the persistent data takes: the loads held for a pass or
    more (`held`: reduction_graph.held_loads; half and bfloat16 two to a register) and the
    values kept between passes (`kept`, in their compute type)."""
    loads = sum(p.vec * a.itemsize for a in accesses if not a.is_store and id(a.node) in held)
    return (loads + sum(p.vec * n.tv.dtype.compute.itemsize for n in kept)) / 4


def stageable(p, a, held) -> bool:
    """Load access `a` goes to shared memory by async copies in a plan that stages (`held`:
    reduction_graph.held_loads): a contiguous vector of 4, 8 or 16 bytes held a pass or more,
    not under a bounds test (a pad's or cat's operand: reduction_resize.guarded; every async
    copy a thread issues lands before any is read, unguarded)."""
    return (getattr(p, "stage", False) and not a.is_store and a.mode == "vector"
            and id(a.node) in held and p.vec * a.itemsize in (4, 8, 16)
            and not guarded(a.node.key))


def _stage(p, accesses, held, knobs, kept=()) -> None:
    """Stage the held loads of a persistent inner kernel in shared memory (module docstring):
    by default on a row's cluster, with $PYFUSER_RED_STAGE=1 wherever they fit; `kept`: the
    values held in registers between passes (reduction_graph.recompute_costly)."""
    k = knobs["stage"]
    p.stage = False
    if k == 0 or not p.persistent or p.kind != "inner" or (k is None and p.cluster == 1) \
            or not async_copy_capable():
        return
    p.stage = True
    staged = [a for a in accesses if stageable(p, a, held)]
    per_step = sum(p.vec * a.itemsize for a in staged)
    # H200, rows of 65536 on a cluster, registers -> staged: float32 layer_norm 197 -> 171 µs,
    # rms_norm 168 -> 148, softmax even; bfloat16 rms_norm 91 -> 85, layer_norm and softmax
    # even (within 2%). Rows that fit a block: even or slower (bfloat16 softmax 8192x3072
    # 33.7 -> 35.7 µs), so not by default
    nbytes = per_step * p.steps * p.bdimx * p.bdimy
    budget = STAGE_BYTES if knobs["stage_bytes"] is None else knobs["stage_bytes"]
    if per_step == 0 or nbytes > budget:
        p.stage = False
    elif p.cluster > 1 and knobs["min_blocks"] is None and nbytes <= CLUSTER_STAGE_BYTES \
            and not kept:
        # H200, rows of 65536 staged on a cluster, 5 blocks an SM (48 registers) -> 6 (40):
        # layer_norm 171 -> 165 µs float32, 103 -> 95 bfloat16; rms_norm and softmax 1-3%
        # faster; 8 blocks (32 registers) slower than 6 on layer_norm (docs/benchmarks.md).
        # Not where values stay in registers between passes (steps x vec of each kept value,
        # not staged): 40 registers spill them (ptxas, sm_90, 4 x 65536: log_softmax(gelu(x))
        # 108 bytes a thread bfloat16, 120 float32; layer norm of gelu(x + bias) and dropout +
        # residual + layer norm, bfloat16, 80 and 76), where the default takes 74-92, no spill
        p.min_blocks = CLUSTER_MIN_BLOCKS


def _major_at_least(major: int) -> bool:
    """The current GPU's compute capability is `major`.x or later (no GPU: True, for the sm_90
    the kernels are compiled for)."""
    try:
        import torch
        if torch.cuda.is_available():
            return torch.cuda.get_device_capability(torch.cuda.current_device())[0] >= major
    except Exception:  # noqa: BLE001 - a device query is best effort
        pass
    return True


def async_copy_capable() -> bool:
    """`cp.async`: compute capability 8.0 or later."""
    return _major_at_least(8)


def _budget(threads: int) -> int:
    return REG_BUDGET if threads < 1024 else REG_BUDGET // 2


def choose(p, ext: list, g, accesses, normalization: bool, kept=(), force=None,
           pure=None) -> None:
    """Fill the thread shape, unroll and persistence of `p`; `normalization`: plan a persistent
    row where it fits; `kept`: the nodes a persistent kernel keeps in registers between passes
    (reduction_graph.recompute_costly); `force`: knob values a caller fixes over the
    environment's (schedule/tail.py: the tail's block is its head's); `pure`: a pure
    reduction's plan (by default: not a normalization). An inner plan's team gets `_team_floor`
    unless it is a normalization whose statistics merge as Welford triples or online pairs
    (`_merges_cheaply`)."""
    groups_r = [e for e, r in zip(ext, p.reduced) if r]
    groups_k = [e for e, r in zip(ext, p.reduced) if not r]
    from .reduction_graph import held_loads, load_passes
    passes = load_passes(g)
    held = held_loads(g, passes)
    per_step = _regs_per_step(p, accesses, held, kept)
    knobs = {k: _env(f"PYFUSER_RED_{k.upper()}") for k in ("bdimx", "bdimy", "unroll", "steps",
                                                           "waves", "splits", "cluster",
                                                           "stage", "min_blocks", "full",
                                                           "fence", "prefetch", "cluster_push",
                                                           "grid_blocks", "stage_bytes",
                                                           "team_bytes")}
    knobs.update(force or {})
    if p.kind == "inner":
        narrow = min((a.itemsize for a in accesses
                      if not a.is_store and g.level.get(id(a.node)) == "full"), default=4)
        pure = not normalization if pure is None else pure
        floor = pure or _merges_cheaply(g)
        _inner(p, groups_r, groups_k, per_step, normalization, knobs,
               p.vec * narrow if floor else 0)
    else:
        _outer(p, groups_r, groups_k, per_step, normalization, knobs)
    mb = knobs["min_blocks"]
    if mb is not None:
        if mb < 0 or mb > 32:
            raise ValueError(f"$PYFUSER_RED_MIN_BLOCKS={mb}: 0 to 32")
        p.min_blocks = mb
    for k in ("stage", "full", "fence", "prefetch", "cluster_push"):
        if knobs[k] not in (None, 0, 1):
            raise ValueError(f"$PYFUSER_RED_{k.upper()}={knobs[k]}: 0 or 1")
    sb = knobs["stage_bytes"]
    if sb is not None and not 0 <= sb <= MAX_STAGE_BYTES:
        raise ValueError(f"$PYFUSER_RED_STAGE_BYTES={sb}: 0 to {MAX_STAGE_BYTES}")
    _stage(p, accesses, held, knobs, kept)
    # no bounds checks where every team's positions are in bounds (`full`, set by _inner):
    # fewer instructions, and fewer registers where every full-size load is held (softmax
    # 8192x3072 bfloat16: 54 -> 40). Not for staged rows (without the checks' branches ptxas
    # reads every staged vector back at once: 100-113 registers, or spills under the 40 of six
    # blocks an SM), nor for persistent rows that read another tensor step by step in a later
    # pass (a layer norm's weight and bias: ptxas loads all of them at the pass's start, 48 ->
    # 96 registers for rms_norm 32768x256 bfloat16, 10% slower on the H200). A load read step
    # by step in the first pass is no such load: a held pure reduction's (one pass, its loads
    # all in flight at once without the checks: H200, held bfloat16 sums of rows of 32-256
    # 12.6-22.7 -> 10.1-14.6 µs, float32 rows of 32-64 21.7-28.5 -> 16.5-22.1 µs)
    first = {k: v[0] for k, v in passes.items()}
    stepwise = any(not a.is_store and id(a.node) not in held and g.level.get(id(a.node)) == "full"
                   and first.get(id(a.node), 0) > 0 for a in accesses)
    # $PYFUSER_RED_FENCE=1: staged rows that would be full check no bounds but keep a uniform
    # branch a step (ptxas sm_90, rows of 65536, 40 registers, no spill: layer_norm bfloat16
    # 1528 -> 1448 SASS instructions a thread, float32 1056 -> 1000, softmax 2272 -> 2208 /
    # 1408 -> 1352; without any branch 132-564 bytes of spills in bfloat16). Off by default:
    # H200, rms_norm 1024x65536 float32 146 -> 160 µs with it, the other rows of 65536 within
    # 0-1.5% (docs/benchmarks.md)
    p.fence = p.full and p.stage and p.kind == "inner" and knobs["fence"] == 1 and \
        knobs["full"] != 0
    if knobs["full"] == 1:
        p.full = p.full and not p.stage
    else:
        p.full = p.full and not p.stage and knobs["full"] is None and \
            not (p.persistent and stepwise)
    for d in (p.bdimx, p.bdimy):
        if d & (d - 1):
            raise ValueError(f"reduction thread shape ({p.bdimx}, {p.bdimy}): powers of two only")
    c = knobs["cluster"]
    if c is not None and (c < 1 or c > MAX_CLUSTER or c & (c - 1)):
        raise ValueError(f"$PYFUSER_RED_CLUSTER={c}: a power of two from 1 to {MAX_CLUSTER}")
    w = knobs["waves"]
    # inner: a block per row block, no cap (blocks start as others finish, so one block's loads
    # overlap another's combine, and the last wave is balanced by the hardware; H200, rows of
    # 3072: softmax / layer_norm / log_softmax float32 89-92% -> 96-98% of a copy, bfloat16
    # softmax 77% -> 83%; the same for a row's cluster: H100, layer norm of 65536-long rows
    # +10%). Outer: one wave, the kernel grid-strides over the column blocks.
    waves = (0 if p.kind == "inner" else 1) if w is None else w
    p.max_blocks = waves * sm_count() * max(1, 2048 // (p.bdimx * p.bdimy)) if waves > 0 else 0
    # $PYFUSER_RED_GRID_BLOCKS=N: a row's cluster kernel launches at most N blocks (whole
    # clusters, at least one), each cluster looping over rows; $PYFUSER_RED_PREFETCH=1: such a
    # loop issues the next row's staged copies at the end of this row (experiments: neither is
    # on by default)
    gb = knobs["grid_blocks"]
    if gb is not None and p.cluster > 1:
        if gb < 1:
            raise ValueError(f"$PYFUSER_RED_GRID_BLOCKS={gb}: at least 1")
        p.max_blocks = max(1, gb // p.cluster) * p.cluster
    p.prefetch = knobs["prefetch"] == 1 and p.cluster > 1 and p.stage and p.kind == "inner"
    # a row's cluster combines by pushes counted on mbarriers (codegen/reduction_cluster_push.py)
    # instead of two cluster barriers a row. H200, rows of 65536, three runs each way (µs,
    # barriers -> pushes): layer_norm float32 158 -> 150, bfloat16 87 -> 83, softmax 152 -> 140
    # and 81 -> 79, rms_norm bfloat16 83 -> 78, but rms_norm float32 144 -> 152 (not explained:
    # docs/reductions.md). $PYFUSER_RED_CLUSTER_PUSH=0: the barriers
    p.push = knobs["cluster_push"] != 0 and p.cluster > 1 and p.kind == "inner" and p.bdimy == 1


def held_plan(p, ext: list, g, accesses, force=None):
    """A pure reduction's plan `p` (streamed, as `choose` made it), or a copy of it planned
    persistent (its row in one block's registers: never a cluster, never staged) where
    `_holds_rows` says so and the row fits."""
    if not _holds_rows(g, p, ext):
        return p
    held = dataclasses.replace(p)
    choose(held, ext, g, accesses, True, [], force, pure=True)
    return held if held.persistent and held.cluster == 1 and not held.stage else p


def _holds_rows(g, p, ext) -> bool:
    """Whether a pure inner reduction is planned as a persistent one, its row's vectors spread
    over the team all at once (where they fit one block's registers, no cluster, no staging)
    instead of streamed in `unroll`-vector steps: measured faster or even on an H200 (4 ops x 9
    shapes x 2 dtypes, interleaved rounds; docs/reductions.md, Held pure reductions) once its
    one pass checks no bounds (`choose`'s `full`) and short rows get several threads
    (`_team_floor`): float32 rows of 128 17-20 -> 14-15 µs, 32768x256 3-6% faster; bfloat16
    `var_mean` rows of 32-64 17.3-18.2 -> 10.4-11.6 µs and sums of rows of 1024-16384 2-14%
    faster than streamed, short rows' sums and maxima within 5% of it. Not online pairs or picks
    (cross-entropy held: 85% -> 77-79% of a copy in bfloat16). Only with at least a row per SM:
    a few rows, a loss's total sum above all, stay streamed, whose plan widens the team; a held
    plan's size class also follows the row's length step by step, so under dynamic shapes a
    total sum of a varying tensor would compile a kernel per size. $PYFUSER_RED_HOLD=0 never
    holds them, =1 holds every such reduction (any number of rows)."""
    knob = os.environ.get("PYFUSER_RED_HOLD")
    if p.kind != "inner" or g.online or g.picks or knob == "0":
        return False
    return knob == "1" or _prod(e for e, r in zip(ext, p.reduced) if not r) >= sm_count()


def _persistent(p, n: int, team: int, per_step: float, threads: int, knobs) -> None:
    """Hold `n` vectors (inner) / rows (outer) over `team` threads in registers if they fit
    (`steps` = ceil(n / team): every n of this size class is covered; at least 1: an empty
    reduced extent still gets a kernel with arrays, whose loads its bounds then skip)."""
    steps = max(1, -(-n // team))
    forced = knobs["steps"]
    if forced == 0:
        return
    if forced is not None or steps * per_step <= _budget(threads):
        p.persistent, p.steps, p.unroll = True, steps, 1


def cluster_capable() -> bool:
    """Thread-block clusters: a GPU of compute capability 9.0 or later (no GPU: the sm_90 the
    kernels are compiled for); $PYFUSER_CLUSTERS=0 turns them off."""
    return os.environ.get("PYFUSER_CLUSTERS") != "0" and _major_at_least(9)


def _cluster(p, nv: int, per_step: float, knobs) -> None:
    """A row too long for one block's registers is split over a cluster of C blocks of
    CLUSTER_BLOCK threads (C <= 8, the portable cluster size), each holding its share in
    registers: the smallest C giving at most STEPS_TARGET vectors a thread within the budget
    (fewer registers: more blocks an SM to overlap one row's reductions with another's loads)."""
    if not cluster_capable():
        return
    for c in (knobs["cluster"],) if knobs["cluster"] else (2, 4, 8):
        steps = max(1, -(-nv // (c * CLUSTER_BLOCK)))       # (an empty row: one step)
        fits = steps * per_step <= _budget(CLUSTER_BLOCK) and (steps <= STEPS_TARGET or c == 8)
        if fits or knobs["cluster"]:
            p.persistent, p.steps, p.unroll = True, steps, 1
            p.bdimx, p.cluster = CLUSTER_BLOCK, c
            return


def _merges_cheaply(g) -> bool:
    """Whether a normalization's row statistics are plain reductions (an RMS norm's sum of
    squares), not Welford triples (a layer norm's) or online pairs (softmax's max and sum of
    exp): only then does its team get `_team_floor`. Each doubling of a team adds a combine
    round; a plain sum's is one shuffle and an add, a Welford or online merge's several
    shuffles and a division or an exp. H200, bfloat16 32768x256, floor against none, two
    rounds each: rms_norm 13.2-14.0 against 14.3-14.8 µs, layer_norm 15.8 against 14.3-14.4,
    softmax 13.0-13.8 against 12.5-13.8 (docs/benchmarks.md, thirty-first session)."""
    from ..ir import exprs as E
    return not g.online and not any(isinstance(e, E.WelfordOp) for e in g.reduces)


def _team_floor(nv: int, vec_bytes: int, knobs) -> int:
    """The fewest threads an inner row has: enough for a step to read TEAM_BYTES of the row
    ($PYFUSER_RED_TEAM_BYTES; 0 turns the floor off) in vectors of `vec_bytes` (the narrowest
    full-size load's), at most the row's vectors. A short row read by one thread in 16-byte
    vectors has each warp load touch 32 rows' lines at once; H200, held pure reductions, rows of
    32-128 float32 or 64-128 bfloat16: 12-22 -> 10-15 µs with 4-8 threads a row instead of 1-4;
    rms_norm 32768x256 bfloat16 14.3-15.2 -> 12.7-14.0 µs (docs/reductions.md, A short row's
    team). Normalizations had been left out of it for a CLIP training step whose gradients
    looked further from float64 with it; over 5 input sets each way the ratio of their error
    to eager's moves as much between inputs as between plans (medians 0.8-1.4 without the
    floor, 1.0-1.5 with it), and a layer norm of rows of 32 is as close to float64 with 8
    threads a row as with 4 (docs/reductions.md); what keeps layer norms and softmax out of
    it now is speed (`_merges_cheaply`)."""
    want = TEAM_BYTES if knobs.get("team_bytes") is None else knobs["team_bytes"]
    if want < 0:
        raise ValueError(f"$PYFUSER_RED_TEAM_BYTES={want}: 0 or more")
    return max(1, min(_pow2ceil(nv), _pow2ceil(-(-want // max(vec_bytes, 1)))))


def _inner(p, groups_r, groups_k, per_step, normalization, knobs, vec_bytes=0) -> None:
    """`vec_bytes`: the row's vector bytes, for `_team_floor` (0: no floor)."""
    rlen = groups_r[-1] if groups_r else 1
    nro = _prod(groups_r[:-1])
    rows = _prod(groups_k)
    nv = nro * max(1, -(-rlen // p.vec))      # outer reduced groups share one linear index
    p.persistent, p.steps, p.unroll = False, 0, knobs["unroll"] or 4
    target = max(2, min(STEPS_TARGET, int(STEP_REGS // max(per_step, 1))))
    floor = _team_floor(nv, vec_bytes, knobs) if vec_bytes else 1
    p.bdimx = knobs["bdimx"] or min(1024, max(floor, _pow2ceil(-(-nv // target))))
    if normalization:
        _persistent(p, nv, p.bdimx, per_step, max(p.bdimx, MIN_BLOCK), knobs)
        # a row filling a 1024-thread block alone (one row an SM at a time: its loads do not
        # overlap another row's combine) goes to a cluster too, where one fits (H100, bfloat16
        # rows of 65536: softmax 52% -> 57% of a copy, layer_norm 68% -> 76%; docs/benchmarks.md)
        whole_sm = p.persistent and p.bdimx >= 1024
        if (not p.persistent or whole_sm or knobs["cluster"]) and knobs["steps"] != 0 \
                and not knobs["bdimx"]:
            _cluster(p, nv, per_step, knobs)
    if not p.persistent and not knobs["bdimx"]:
        # streamed: about STREAM_VECTORS vectors a thread (unroll-wide steps, several loads in
        # flight each); a wider team only when the rows are too few to fill the GPU
        team = max(floor, _pow2ceil(-(-nv // STREAM_VECTORS)))
        while team < 512 and -(-rows * team // MIN_BLOCK) < 2 * sm_count() and team < nv:
            team *= 2
        p.bdimx = max(1, min(512, team))
    p.bdimy = knobs["bdimy"] or max(1, min(MIN_BLOCK // p.bdimx, _pow2ceil(rows)))
    while p.bdimx > 1 and p.bdimx * p.bdimy < 32:     # shuffles name the full warp
        p.bdimy *= 2
    if p.cluster > 1:
        p.bdimy = 1                                   # a cluster per row
    team_step = p.steps * p.cluster * p.bdimx if p.persistent else p.unroll * p.bdimx
    # (an empty row is no whole step: nv counts it as one vector, which its loads must skip)
    p.whole = rlen > 0 and nv > 0 and rlen % p.vec == 0 and \
        (nv == team_step if p.persistent else nv % team_step == 0)
    p.full = p.whole and rows % p.bdimy == 0
    p.reason = (f"inner: {rows} rows of {rlen} x {nro}, {nv} vectors a row, "
                + (f"persistent ({p.steps} vectors a thread)" if p.persistent else "streamed"))


def _outer(p, groups_r, groups_k, per_step, normalization, knobs) -> None:
    cols = groups_k[-1] if groups_k else 1
    nko = _prod(groups_k[:-1])
    nr = _prod(groups_r)
    nvc = max(1, -(-cols // p.vec))
    p.bdimx = knobs["bdimx"] or min(32, _pow2ceil(nvc))
    p.bdimy = knobs["bdimy"] or max(1, min(256 // p.bdimx, _pow2ceil(nr)))
    # pure reductions: 8 rows a step (H200, column sums of 8192x3072: bfloat16 73% -> 79% of a
    # copy, float32 85% -> 86%: more loads in flight for the few blocks a column block gets)
    p.persistent, p.steps, p.unroll = False, 0, knobs["unroll"] or (4 if normalization else 8)
    if normalization:
        _persistent(p, nr, p.bdimy, per_step, p.bdimx * p.bdimy, knobs)
    else:
        # few column blocks: split the reduced index over blockIdx.z (a grid reduction), each
        # split at least 4 steps long, until the grid fills every SM twice
        blocks = -(-cols // (p.bdimx * p.vec)) * max(1, nko)
        longest = max(1, nr // (p.bdimy * p.unroll * 4))
        p.splits = knobs["splits"] or max(1, min(-(-2 * sm_count() // max(blocks, 1)), longest, 65535))
    p.reason = (f"outer: {nko} x {cols} columns over {nr} reduced, "
                + (f"persistent ({p.steps} rows a thread)" if p.persistent else "streamed")
                + (f", split {p.splits} ways" if p.splits > 1 else ""))
