"""Lowering of the reduction-family schedules (reduction, inner / outer persistent) to kernel IR:
what both kernel shapes share (reduction_kernels.py and reduction_outer.py have the two
shapes; reduction_memory.py the buffers, loads, stores and workspaces; reduction_index.py the
extents, strides and offsets of a position, the indices of resized axes (ax<k>) and the iota
and random values computed from indices; reduction_accumulators.py the accumulators).

Names: `e<i>` collapsed group extents, `g<i>` a thread's index in group i, `row` / `col` the kept
index a thread works on, `j` (inner) or `r` (outer) its position along the reduced index, `acc*`
accumulators, `T<n>_r` loaded elements, `t<n>` values of Fusion ops, `t<n>_k` values kept between
passes, `red*` shared memory, `ws*` workspaces of a grid reduction.

A kernel runs the schedule's passes over the reduced index (reduction_graph: a pass accumulates
the reductions whose inputs exist by then, and writes the full-size outputs that exist by then);
between passes the threads combine their partials (one_pass):
- a *persistent* kernel holds its share of the row (inner) or column block (outer) in registers:
  `steps` vectors a thread. A load used by several passes (or by a Welford statistic) is read once,
  at the start of the first pass needing it; a load used by one pass only is read step by step
  in that pass; values costly to compute again (schedule.kept: softmax's exp) are kept;
  a plan that stages (ReductionParams.stage) holds the held loads in shared memory instead, as
  `cp.async` copies all issued before one AsyncWait; each thread reads back only its own
  elements, so no barrier is needed;
- a *streamed* kernel reads again in every pass, `unroll` vectors a step, all loads of a step
  issued before the first use.
Online pairs (reduction_patterns.OnlinePair: a max and the sum of exp(x - max) in one pass) are
accumulated in chunks too: the max of the step loop's values, the running sum rescaled to the new
max, then the sum of exp(x - max) over the chunk (`pair_chunk`); then (max, sum) partials combine
once across lanes, threads, warps and cluster ranks.
Welford statistics are accumulated in chunks: the values of a step loop get their exact mean and
m2 in registers (computed again from the loaded registers, no copy), and the chunk is merged into
the running (mean, m2, n) with Chan's formula: a division per chunk, not per element.

Every `__syncthreads` and shuffle is outside the per-thread predicates (row_ok, col_ok, j < rlen):
control flow around them is block-uniform, so threads past the end take part with empty
partials.
"""
from __future__ import annotations

from ..ir.dtypes import DataType
from ..schedule import reduction_graph as RG
from ..schedule import reduction_patterns as RP
from ..schedule.reduction_heuristics import stageable
from . import kernel_ir as K
from .emitter import Emitter
from .pointwise_index import KeyIndexing
from .reduction_accumulators import Accumulators
from .reduction_combine import Combiner
from .reduction_index import ReductionIndexing
from .reduction_memory import ReductionMemory, _c, _guard

MAX_GRID_X = 2 ** 31 - 1
MAX_GRID_Y = 65535


def _and(*conds):
    out = None
    for c in conds:
        if c is None:
            continue
        out = c if out is None else K.Bin("&&", out, c)
    return out


def _lane_dependent(expr):
    """A known value that reads lane v (and step s) of an array: resolved for the lane and step
    of each use (the lanes loop's v, or a Welford chunk's unrolled q)."""
    return lambda step, lane, expr=expr: _subst(expr, {"v": lane, "s": step})


def _subst(x, env):
    if isinstance(x, K.Var) and env.get(x.name) is not None:
        return env[x.name]
    if isinstance(x, K.ArrayRef):
        return K.ArrayRef(x.name, tuple(_subst(i, env) for i in x.index))
    if isinstance(x, K.Convert):
        return K.Convert(x.kind, _subst(x.arg, env), x.src, x.dst)
    if isinstance(x, K.Op):
        return K.Op(x.name, tuple(_subst(a, env) for a in x.args), x.compute)
    if isinstance(x, K.Bin):
        return K.Bin(x.op, _subst(x.a, env), _subst(x.b, env))
    return x


class ReductionLowering(Accumulators, ReductionMemory, ReductionIndexing, KeyIndexing, Emitter):
    """The shared machinery; a kernel shape (reduction_kernels.py, reduction_outer.py) provides:
    `kernel_body()`, `position(step_expr) -> (lets, cond, guarded lets, index)`,
    `step_expr(var, streamed)`, `wrap_streamed(loop) -> statements`, `combine(reds, out) ->
    {id(e): partial exprs}`, `row_values(q, known, out) -> known`, `LANE_WELFORD` (Welford
    statistics per lane (outer) or one per thread (inner))."""

    LANE_WELFORD = False

    def __init__(self, sched):
        super().__init__(sched)
        p = self.p
        self.g = sched.graph
        self.V = p.vec
        self.kg = [i for i, r in enumerate(p.reduced) if not r]
        self.rg = [i for i, r in enumerate(p.reduced) if r]
        self.ref = RG.reductions(sched.fusion)[0].inputs[0]
        self.loads = [a for a in sched.accesses if not a.is_store]
        self.stores = [a for a in sched.accesses if a.is_store]
        self.comb = Combiner(DataType.Int32 if self.it == "int" else DataType.Int)
        self.shared: list = []
        self.workspaces: list = []        # (name, dtype, kind) of the workspace buffers
        self.lvl = self.g.level
        self.avail = self.g.avail
        self.shared_buf = getattr(sched, "shared", {})
        self.names = self._names()
        self.plans = [self.pass_plan(q) for q in range(RG.total_passes(self.g))]
        self.kept = self._kept()
        self.pass_long = RG.held_loads(self.g)
        self.staged = {id(a.node) for a in self.loads if stageable(p, a, self.pass_long)}
        self.staged_reads = None      # inside at_step: {copy name: (access, step)} read there
        self.packed_bufs: set = set()  # register buffers allocated packed (`buffer`)
        self.rcps: dict = {}          # id(denominator Node) -> the row's (y, ys, ds) Vars
        self.inplace = self._inplace()
        sched.inplace_tvs = {i for pair in self.inplace for i in pair}

    def _inplace(self) -> list:
        """(output TensorView id, input TensorView id) of the fusion's in-place outputs this
        kernel writes into their input's storage itself: per-row outputs (running statistics)
        whose input is read only per row, as one element of the same row. Every thread of the
        row reads it before the row's combines; the writer stores after them, behind a barrier
        (`sync_before_inplace`); with a cluster the store must follow a cluster combine."""
        aliases = getattr(self.s.fusion, "aliases", None) or {}
        out = []
        for o, i in aliases.items():
            st = [a for a in self.stores if a.tv is o]
            ld = [a for a in self.loads if a.tv is i]
            if len(st) != 1 or o.dtype is not i.dtype or o.ndim != i.ndim or \
                    self.lvl[id(st[0].node)] != "row" or \
                    any(self.lvl[id(a.node)] != "row" for a in ld) or \
                    (self.p.cluster > 1 and self.avail[id(st[0].node)] == 0):
                continue
            out.append((id(o), id(i)))
        return out

    def sync_before_inplace(self, q: int) -> list:
        """A block barrier before pass q's per-row stores when one of them is in place."""
        if any(self.lvl[id(a.node)] == "row" and self.avail[id(a.node)] == q and
               any(id(a.tv) == o for o, _ in self.inplace) for a in self.stores):
            return [K.Sync()]
        return []

    # ---- names and plans ----------------------------------------------------------------------
    def _names(self) -> dict:
        seen, out = {}, {}
        for node in self.g.nodes:
            n = seen.get(node.tv.number, 0)
            seen[node.tv.number] = n + 1
            out[id(node)] = f"t{node.tv.number}" + (f"_{n}" if n else "")
        for a in self.loads:
            out[("buf", id(a.node))] = f"T{a.tv.number}_r" + out[id(a.node)][len(f"t{a.tv.number}"):]
        for nid, rep in self.shared_buf.items():        # a cat's operands: one buffer
            out[("buf", nid)] = out[("buf", rep)]
        return out

    def pass_plan(self, q: int):
        """(reduce exprs accumulated in pass q, (store access, node) of the full outputs written
        in it, full nodes computed, {id(reduce expr): its input node})."""
        _, out_nodes, full = RG.pass_nodes(self.g, q)
        reds = RG.pass_reductions(self.g, q)       # an online pair in place of its max and sum
        outs = [(a, a.node) for a in self.stores if any(a.node is n for n in out_nodes)]
        inputs = {}
        for e in reds:
            if isinstance(e, RG.OnlinePair):
                inputs[id(e)] = e.x
        for n in self.g.nodes:
            if n.kind == "reduce" and any(n.expr is e for e in reds):
                inputs.setdefault(id(n.expr), n.args[0])
        return reds, outs, full, inputs

    def _kept(self) -> dict:
        """{id(node): (name, first pass)} of the values a persistent kernel keeps."""
        out = {}
        for n in getattr(self.s, "kept", []):
            first = min(q for q, plan in enumerate(self.plans) if any(m is n for m in plan[2]))
            out[id(n)] = (self.names[id(n)] + "_k", first)
        return out

    def row_nodes(self, q: int) -> list:
        """Row-level nodes whose value exists from pass q on (computed once, before pass q)."""
        return [n for n in self.g.nodes if self.lvl[id(n)] == "row" and self.avail[id(n)] == q
                and n.kind != "load"]

    # ---- the storing thread -----------------------------------------------------------------
    def owner(self, a, idx: dict):
        """None, or the condition under which this thread stores output access `a` at group
        indices `idx`: index 0 of each group (but the vector group) the output does not move
        along. Such an output is broadcast along that group (every index of it computes the
        same element), and one thread stores it rather than every one: two threads storing one
        element race (the interpreter's race check flags them)."""
        last = len(self.p.groups) - 1
        return _and(*[K.Bin("==", x, _c(0)) for gi, x in idx.items()
                      if gi != last and self.gstride(a, gi) is None])

    # ---- values -------------------------------------------------------------------------------
    def emit_nodes(self, nodes, known: dict, load_expr, out: list, where=None) -> dict:
        """Lets of `nodes` (in order) given `known` values; loads through `load_expr(node)`;
        `where` = (group index exprs, lane) of the position, for iota and random values."""
        vals = dict(known)
        for node in nodes:
            if id(node) in vals:
                continue
            if node.kind in ("set", "alias"):
                vals[id(node)] = vals[id(node.args[0])]
                continue
            if node.kind == "load":
                expr = load_expr(node)
            elif node.kind == "iota":
                expr = self.iota_expr(node, where)
            elif node.kind == "rng":
                expr = self.rng_expr(node, where)
            elif node.kind == "pick":
                expr = self.pick_expr(node, vals, where, out)
            elif node.kind == "cat" and id(node.args[-1]) in self.shared_buf:
                expr = vals[id(node.args[0])]         # the operands' one buffer: the cat's value
            elif node.kind in ("pad", "cat"):         # by the axes' indices ax<k>
                expr = self.resize_expr(node, lambda x: vals[id(x)])
            elif node.kind == "reduce":
                raise AssertionError(f"reduction result {node.tv.name} used before its pass ends")
            elif id(node) in self.g.shifted_exps:    # exp of x - max(x): never positive
                expr = K.Op("exp_shifted", (vals[id(node.args[0])],), node.tv.dtype)
            elif id(node) in self.g.shifted_quotients and \
                    id(self.g.shifted_quotients[id(node)]) in self.rcps:
                num, den = node.args                 # softmax's quotient: the row's reciprocal
                expr = K.Op("div_rcp", (vals[id(num)], *self.rcps[id(den)]), node.tv.dtype)
            else:
                expr = self.node_expr(node, lambda x: vals[id(x)])
            name = self.names[id(node)]
            out.append(K.Let(name, K.REGISTER_CTYPE[node.tv.dtype], expr))
            vals[id(node)] = K.Var(name)
        return vals

    def pick_expr(self, node, vals, where, out):
        """A pick's value (reduction_patterns.Pick) for this row: 0.0 + X at position `index` along
        the reduced axis, read as one element where the row is in bounds and 0 <= index <
        extent, else 0.0 (what the sum of where(iota == index, X, 0) gives). Inner kernels
        (the scheduler plans picks for them only): the row's kept-group indices are where[0]."""
        pk = self.g.picks[id(node)]
        dt = node.tv.dtype
        name = self.names[id(node)]
        idt = pk.index.tv.dtype
        pos = vals[id(pk.index)]
        pos = pos if idt is DataType.Int else K.Convert("cast", pos, idt, DataType.Int)
        out.append(K.Let(name + "_at", "int64_t", pos))
        at = K.Var(name + "_at")
        ext = K.Convert("cast", self.extent_expr(self.ref.logical[pk.axis]), self.nidx_dtype,
                        DataType.Int)
        cond = _and(getattr(self, "row_ok", None),
                    K.Bin("<=", K.Const(0, "int64_t", DataType.Int), at), K.Bin("<", at, ext))
        a = next(x for x in self.loads if x.node is pk.load)
        off = self.offset(a, dict(where[0]) if where else {})
        gi = next((i for i, grp in enumerate(self.p.groups) if pk.axis in grp), None)
        if gi is not None:                  # the reduced group is [axis] alone (one axis)
            off = K.add(off, K.mul(K.Convert("cast", at, DataType.Int, self.nidx_dtype),
                                   self.gstride(a, gi)))
        buf, acc = name + "_e", name + "_p"
        chain = []
        n = pk.x
        while n is not pk.load:
            chain.append(n)
            n = RP.chain_arg(n, pk.axis)
        got = {id(pk.load): K.Convert("load", K.ArrayRef(buf, (_c(0),)), a.tv.dtype, a.tv.dtype)}
        inside = [K.Load(buf, (_c(0),), self.ptr(a), off, 1)]
        for c in reversed(chain):           # the chain's other arguments: row values (vals)
            got[id(c)] = got[id(c.args[0])] if c.kind in ("set", "alias") else \
                self.node_expr(c, lambda x: got[id(x)] if id(x) in got else vals[id(x)])
        # the value in registers: a half / bfloat16 pick (a weight[target]) is a float rounded
        # to its dtype, as the sum's result would be, never a half / bfloat16 register
        cdt = dt.compute
        zero = K.Const(0.0, K.REGISTER_CTYPE[dt], cdt)
        total = K.Op("add", (zero, got[id(pk.x)]), cdt)
        if dt.is_reduced_float:
            total = K.Convert("round", total, DataType.Float, dt)
        inside.append(K.Assign(acc, (), total))
        out += [K.Alloc(buf, a.tv.dtype, (1,)), K.Alloc(acc, cdt, ()), K.Assign(acc, (), zero),
                *_guard(cond, inside)]
        return K.ArrayRef(acc, ())

    def lane_values(self, nodes, known, step, lane, out, idx=None) -> dict:
        """Lets of `nodes` for lane `lane` of vector step `step` at group indices `idx` (loads
        from their buffers); known values that depend on the lane or step are resolved first."""
        known = {k: (v(step, lane) if callable(v) else v) for k, v in known.items()}

        def load(node):
            a = next(x for x in self.loads if x.node is node)
            st = step if (not self.p.persistent or id(node) in self.pass_long) else _c(0)
            if id(node) in self.staged:
                return self.staged_value(a, st, lane)
            return self.load_value(a, self.lane_index(a, st, lane))
        return self.emit_nodes(nodes, known, load, out, (idx or {}, lane or K.Var("v")))

    # ---- the kernel ---------------------------------------------------------------------------
    def build(self, name: str) -> K.Kernel:
        for a in sorted(self.s.accesses, key=lambda a: a.seg):
            self.ptr(a)
        for gi in range(len(self.p.groups)):
            self.prologue.append(K.Let(f"e{gi}", "nidx_t", self.group_extent(gi)))
        body = self.kernel_body()
        body = self.shared + self.prologue + body
        return K.Kernel(name, self.params(), self.tensors, self.it, (self.p.bdimx, self.p.bdimy, 1),
                        body, getattr(self.p, "min_blocks", 0),
                        cluster=getattr(self.p, "cluster", 1))

    def lanes(self, body) -> K.Loop:
        return K.Loop("v", _c(0), _c(self.V), _c(1), "lanes", body)

    def unroll(self, var, n, body) -> K.Loop:
        return K.Loop(var, _c(0), _c(n), _c(1), "unroll", body)

    # ---- one pass -------------------------------------------------------------------------------
    def one_pass(self, q, known, out) -> dict:
        """Pass q: accumulate its reductions, write its full outputs, combine the partials;
        returns the known values after it (row values of pass q + 1 included)."""
        reds, outs, full, inputs = self.plans[q]
        if not reds and not outs:
            return self.row_values(q + 1, known, out)
        self.init_accs(reds, out)
        start = len(out)
        self.packing = {}
        chunks = [e for e in reds if self.chunked(e)]
        steps_needed = len(chunks) < len(reds) or outs or any(
            first == q for _, first in self.kept.values())
        if self.p.persistent:
            out += self.pass_long_loads(q)
            s = K.Var("s")
            if steps_needed:
                out.append(self.unroll("s", self.p.steps, self.at_step(
                    self.step_expr(s, False), lambda idx: self.step_body(q, s, idx, known, True))))
            for e in chunks:
                self.chunk(e, q, known, "s", self.p.steps, False, out)
        else:
            u = K.Var("u")
            loads = [a for a in self.loads if any(n is a.node for n in full)]
            it_body = self.buffers(loads, self.p.unroll)
            it_body.append(self.unroll("u", self.p.unroll, self.at_step(
                self.step_expr(u, True), lambda idx: [self.load_stmt(a, (u,), self.offset(a, idx), q)
                                                      for a in loads])))
            if steps_needed:
                it_body.append(self.unroll("u", self.p.unroll, self.at_step(
                    self.step_expr(u, True), lambda idx: self.step_body(q, u, idx, known, False))))
            for e in chunks:
                self.chunk(e, q, known, "u", self.p.unroll, True, it_body)
            out += self.wrap_streamed(K.Loop("it", _c(0), K.Var("niter"), _c(1), "serial", it_body,
                                             "vector steps of the reduced index"))
        init, fold = self.packed_twins()
        self.packing = None
        out[start:start] = init
        out += fold
        mark = len(out)
        partials, out = self.combine(reds, out)
        tail = out
        syncs = [i for i in range(mark, len(out)) if isinstance(out[i], K.Sync)]
        if syncs and self.warp0_tail(q):
            tail = out[syncs[-1] + 1:]
            del out[syncs[-1] + 1:]
        known = dict(known)
        for nid, (name, first) in self.kept.items():      # kept values: read in later passes
            if first == q:
                known[nid] = _lane_dependent(K.ArrayRef(name, (K.Var("s"), K.Var("v"))))
        for e in reds:
            known.update(self.bind_results(e, partials[id(e)], tail))
        known = self.row_values(q + 1, known, tail)
        if tail is not out:
            out.append(K.If(K.Bin("<", K.Special("threadIdx.x"), _c(32)), tail))
        return known

    def warp0_tail(self, q: int) -> bool:
        """Whether what follows pass q's last block barrier (the reads of the warps' partials
        in shared memory, the row's results, its row-level values and stores) runs in the
        row's first warp only: the inner kernel's last pass when every output is a row value
        (written by threadIdx.x 0). None here."""
        return False

    def bind_results(self, e, partial, out) -> dict:
        return self.result_exprs(e, partial)

    def step_body(self, q, step, idx, known, persistent) -> list:
        """One vector step of pass q: the pass's values lane by lane, accumulated (not Welford),
        kept, stored. Persistent kernels read loads of this pass only here, step by step."""
        reds, outs, full, inputs = self.plans[q]
        body: list = []
        if persistent:
            step_loads = [a for a in self.loads
                          if id(a.node) not in self.pass_long and any(n is a.node for n in full)]
            body += self.buffers(step_loads, 1)
            body += [self.load_stmt(a, (_c(0),), self.offset(a, idx)) for a in step_loads]
        lanes: list = []
        vals = self.lane_values(full, known, step, None, lanes, idx)
        for n in full:
            hit = self.kept.get(id(n))
            if persistent and hit is not None and hit[1] == q:
                lanes.append(K.Assign(hit[0], (step, K.Var("v")), vals[id(n)]))
        words: list = []
        for e in reds:
            if not self.chunked(e):
                self.accumulate(e, vals[id(inputs[id(e)])], inputs[id(e)], lanes, words)
        self.step_extra(q, step, vals, lanes)
        after: list = []
        for a, node in outs:
            if a is None:                   # consumed by step_extra, not stored
                continue
            body.append(K.Alloc(f"T{a.tv.number}_w", a.tv.dtype, (self.V,)))
            inside, st = self.store_stmts(a, vals[id(node)], self.offset(a, idx), True)
            lanes += inside
            after += _guard(self.owner(a, idx), st)
        return body + [self.lanes(lanes)] + words + after

    def step_extra(self, q, step, vals, lanes: list) -> None:
        """A subclass's own work in a step of pass q, on the step's values (`vals`), appended to
        `lanes` (the inner-outer kernel's column sums); none here."""
