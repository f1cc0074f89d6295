"""Lowering: a PointwiseSchedule -> kernel IR (loop nest, indices, predicates, loads, stores).

Kernel shape (T threads, V lanes, U unrolled vectors / rows per thread):
  1-D  for bx (grid-stride over blocks):
         for u < U: i = ((bx*U + u)*T + tid)*V; if (i < n): group indices from i; loads [u]
         for u < U: same i and predicate; lanes: compute; stores
  2-D  for by, bx (grid-stride): g_inner = (bx*T + tid)*V; if (g_inner < e_inner):
         row-invariant loads (bias-like operands) once;
         for u < U: o = by*U + u; if (o < e_outer): outer group indices from o; loads [u]
         for u < U: same; lanes: compute; stores
Slices, pads and cats read their operands at shifted indices (pointwise_graph's "sh" key entries:
the reference index plus a constant, clamped into the operand where it may fall outside; a
stepped slice's index times its step, "st", a stepped pad's operand at the index less its low
side divided by its step, "dv"); a pad or cat node selects, by the consumer's index, the
operand's value or the pad value (a `where`; a stepped pad keeps the operand only at every
step-th index), so no load is ever out of bounds and no element is computed twice per output.
With vectors (only where every vector lies on one side of each such bound:
schedule/pointwise_resize.index_vec_ok) the shifted loads are vector loads at the affine offset
plus the shift, guarded by the bounds test of the vector's first element, and an iota along the
vectors adds each lane.
Random numbers (PhiloxUniformOp) are computed where a load would be, from the element's row-major
index in the random op's shape (its access's offset, as if it were a dense tensor) and the
launch's seed and offset (kernel parameters pf_seed, pf_offset).
All loads of one thread are issued before its first use (bytes in flight), indices are div/mod
free except the decomposition of the linear (1-D) or row (2-D) index into collapsed groups, done
once per vector or row. Values are computed op by op exactly as the Fusion says (no reassociation);
half/bf16 values live in float registers and are rounded where an op produces half/bf16.
"""
from __future__ import annotations

from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.dtypes import DataType
from ..schedule.pointwise_graph import INDEX_KINDS, index_value_node
from . import kernel_ir as K
from .emitter import Emitter, op_compute_dtype  # noqa: F401  (op_compute_dtype: re-exported)
from .pointwise_index import KeyIndexing

THREAD, STEP, LANE = 0, 1, 2      # where a node's value is computed (see Lowering.node_levels)


def kernel_name(fusion) -> str:
    names = []
    for e in fusion.used_exprs():
        if isinstance(e, (E.ElementwiseOp, E.CastOp, E.FullOp, E.ReductionOp, E.WelfordOp,
                          E.PhiloxUniformOp)) \
                and e.op_name not in names:
            names.append(e.op_name)
    if not names:
        names = ["copy"]
    return "pf_" + "_".join(names[:4]) + ("_etc" if len(names) > 4 else "") + "_kernel"


def _gathered_affine(a) -> bool:
    """A gathered access addressed as an affine one plus its index times the gathered axis'
    stride (pointwise.Access.gathered); in `general` mode its offset is summed axis by axis."""
    return a.gathered and a.mode != "general"


class Lowering(KeyIndexing, Emitter):
    def __init__(self, sched):
        super().__init__(sched)
        self.ref_seg = len(sched.fusion.tensor_inputs())
        self.need_r = any(not (a.affine or _gathered_affine(a)) for a in sched.accesses) or \
            any(n.kind in INDEX_KINDS for n in sched.graph.nodes)
        self.arrays: dict = {}          # id(load node) -> (its register array, its Access)
        self.ix_vars: dict = {}         # id(index node) -> the Let of its value (load_stmt)
        # random numbers: per graph node its access (a dense row-major index, no memory)
        self.rng_access = {id(a.node): a for a in sched.accesses if a.rng is not None}
        self.n_rng = len({a.rng for a in self.rng_access.values()})

    def extent(self, k: int):
        return self._param(self.size_params, f"n{k}", self.it, ("size", self.ref_seg, k))

    def offset(self, a, group_vars):
        """Offset (elements) of access `a` for lane 0 at the current group indices (a shiftable
        access: the affine offset plus its constant shifts, unclamped: its load is guarded)."""
        off = self.const(0)
        if a.affine or a.shiftable or _gathered_affine(a):
            if a.gathered:
                j, inode = a.gather
                off = K.mul(self.ix_vars[id(inode)], self.stride(a, j))
            for g, gv in zip(self.p.groups, group_vars):
                st = a.eff.get(g[-1])
                if st is None or st[0] == 0:
                    continue
                s = self.const(1) if (a.mode == "vector" and g is self.p.groups[-1]) else self.stride(a, st[1])
                off = K.add(off, K.mul(gv, s))
            for k, (shift, minus) in sorted(a.shifts.items()):
                if (shift or minus) and a.eff.get(k, (0,))[0] != 0:
                    s = self.minus_terms(self.const(shift), minus)
                    off = K.add(off, K.mul(s, self.stride(a, a.eff[k][1])))
            return off
        for j, c in enumerate(a.node.key):
            if a.sizes[j] != 1 and c != 0:
                off = K.add(off, K.mul(self.key_index(c), self.stride(a, j)))
        return off

    def stride(self, a, j):
        """A random op's index is row-major over its shape: the stride of its axis j is the
        product of its later extents (no parameter); any other access's is the Emitter's."""
        if a.rng is None or isinstance(j, tuple):
            return super().stride(a, j)
        st = self.const(1)
        for d in a.tv.logical[j + 1:]:
            st = K.mul(st, self.extent_expr(d))
        return st

    def rng_value(self, a, gvars):
        """The random number of access `a` at the current lane (Emitter.random_number): at the
        element's row-major index, lane 0's offset plus the lane's step; in vector mode with a
        multiple of 4 lanes, lane 0's index is a multiple of the width, so lanes share quads."""
        index, lane = self.offset(a, gvars), K.Var("v")
        if a.mode == "vector" and self.p.vec % 4 == 0:
            return self.random_number(self.n_rng, a.rng, a.node.expr.digits, index, lane)
        if a.mode == "vector":
            index = K.add(index, lane)
        elif a.mode == "strided" and self.p.vec > 1:
            inner = self.p.groups[-1][-1]
            index = K.add(index, K.mul(lane, self.stride(a, a.eff[inner][1])))
        return self.random_number(self.n_rng, a.rng, a.node.expr.digits, index)

    def group_extent(self, gi):
        g = self.p.groups[gi]
        e = self.extent(g[0])
        for k in g[1:]:
            e = K.mul(e, self.extent(k))
        return e

    def r_lets(self, out: list):
        if not self.need_r:
            return
        for gi, g in enumerate(self.p.groups):
            rest = K.Var(f"g{gi}")
            for pos in range(len(g) - 1, -1, -1):
                k = g[pos]
                if pos == 0:
                    out.append(K.Let(f"r{k}", "nidx_t", rest))
                else:
                    out.append(K.Let(f"r{k}", "nidx_t", K.Bin("%", rest, self.extent(k))))
                    rest = K.Bin("/", rest, self.extent(k))

    # ---- values -------------------------------------------------------------------------
    def node_levels(self, arrays: dict) -> dict:
        """id(node) -> where its value is computed: THREAD (once per thread: constant along the
        inner axis and the rows, e.g. rsqrt(var + eps) of a bias-like operand in 2-D), STEP (once
        per unrolled step u: constant along the inner axis, e.g. a per-channel parameter's math
        in a row) or LANE (per element). A node's level is the finest of its arguments'."""
        levels = {}
        for node in self.s.graph.nodes:
            if node.kind in ("load", "rng"):
                a = arrays[id(node)][1] if node.kind == "load" else self.rng_access[id(node)]
                lvl = LANE if a.mode != "bcast" else (THREAD if a.row_invariant else STEP)
            elif node.kind == "full":
                lvl = THREAD
            elif node.kind in INDEX_KINDS:
                lvl = LANE                       # a function of the element's own index
            else:
                lvl = max((levels[id(x)] for x in node.args if not isinstance(x, Scalar)),
                          default=THREAD)
            levels[id(node)] = lvl
        return levels

    def lane_values(self, arrays: dict, u, out: list, levels: dict | None = None,
                    only: int | None = None, vals: dict | None = None) -> dict:
        """Lets computing the graph nodes for lane `v` of unroll step `u`; node -> expr.

        With `levels`/`only`, emits only the nodes of level `only` (the others must be in
        `vals` already, from an outer level)."""
        vals = {} if vals is None else vals
        used = {}
        lane = K.Var("v")
        for node in self.s.graph.nodes:
            tv = node.tv
            n = used.get(tv.number, 0)
            if node.kind not in ("set", "alias"):
                used[tv.number] = n + 1
            if levels is not None and levels[id(node)] != only:
                continue
            if node.kind in ("set", "alias"):
                vals[id(node)] = vals[id(node.args[0])]
                continue
            name = f"t{tv.number}" + (f"_{n}" if n else "")
            dt = tv.dtype
            if node.kind == "load":
                arr, a = arrays[id(node)]
                idx = () if a.row_invariant else (u,)
                idx = idx + ((self.const(0),) if a.mode == "bcast" else (lane,))
                expr = K.Convert("load", K.ArrayRef(arr, idx), dt, dt)
            elif node.kind == "rng":
                gvars = [K.Var(f"g{gi}") for gi in range(len(self.p.groups))]
                expr = self.rng_value(self.rng_access[id(node)], gvars)
                if dt is DataType.Double:
                    expr = K.Convert("cast", expr, DataType.Float, dt)
            else:
                expr = self.node_expr(node, lambda a: vals[id(a)])
            out.append(K.Let(name, K.REGISTER_CTYPE[dt], expr))
            vals[id(node)] = K.Var(name)
        return vals

    def node_expr(self, node, arg_expr):
        """A "pad" or "cat" node: KeyIndexing.resize_expr; an "iota" node: start + index *
        step. Other nodes: the Emitter's."""
        if node.kind in ("pad", "cat"):
            return self.resize_expr(node, arg_expr)
        if node.kind == "iota":                  # start + index * step, in the iota's dtype
            dt = node.tv.dtype
            idx = DataType.Int if self.it == "int64_t" else DataType.Int32
            i = self.key_index(node.key[0])
            if self.p.vec > 1 and node.key[0] == ("r", self.p.groups[-1][-1]):
                i = K.add(i, K.Var("v"))         # along the vectors: the lane's own index
            i = K.Convert("cast", i, idx, dt)
            start, step = (self.scalar(x) for x in node.args)
            return K.Op("add", (start, K.Op("mul", (i, step), dt)), dt)
        return super().node_expr(node, arg_expr)

    # ---- loads and stores -----------------------------------------------------------------
    def gather_index(self, a, inode, j) -> list:
        """The Lets of the index value a gathered access reads (computed from the element's
        index and from the registers of loads issued before it in the same step: its chain,
        pointwise_graph.index_leaves), the last one checked (Emitter.checked_index); records
        the index's value for key_index and offset."""
        name = f"{self.arrays[id(a.node)][0]}_ix{j}"
        pre: list = []
        value = self.index_chain(inode, f"{name}_", pre, {})
        dt = index_value_node(inode).tv.dtype
        raw = K.Var(name)
        idx_dt = DataType.Int if self.it == "int64_t" else DataType.Int32
        self.ix_vars[id(inode)] = K.Convert("cast", raw, dt, idx_dt) if dt is not idx_dt else raw
        return pre + [K.Let(name, K.REGISTER_CTYPE[dt], self.checked_index(a, j, value))]

    def index_chain(self, node, prefix: str, pre: list, memo: dict):
        """The value of index chain node `node` (pointwise_graph.index_leaves): a load's from
        its registers (lane 0: an index varying along the vectors makes the kernel scalar,
        pointwise_gather.gather_ok), an iota's from the element's index, an op's, cast's or
        fill's from its arguments' (each computed op a Let of its own in `pre`, once)."""
        node = index_value_node(node)
        hit = memo.get(id(node))
        if hit is not None:
            return hit
        dt = node.tv.dtype
        if node.kind == "load":
            arr, ia = self.arrays[id(node)]
            ref = K.ArrayRef(arr, (() if ia.row_invariant else (K.Var("u"),)) + (self.const(0),))
            value = K.Convert("load", ref, dt, dt)
        elif node.kind == "iota":
            value = self.node_expr(node, None)
        else:
            value = self.node_expr(node, lambda x: self.index_chain(x, prefix, pre, memo))
            if node.kind != "full":
                var = f"{prefix}{len(pre)}"
                pre.append(K.Let(var, K.REGISTER_CTYPE[dt], value))
                value = K.Var(var)
        memo[id(node)] = value
        return value

    def load_stmt(self, a, arr, gvars, u) -> list:
        """The statements loading access `a` into `arr` at unroll step u (a gathered access:
        its index's checked Let first)."""
        idx = () if a.row_invariant else (u,)
        pre = []
        for j, c in enumerate(a.node.key):
            if isinstance(c, tuple) and c[0] == "ix":
                pre += self.gather_index(a, c[1], j)
        off = self.offset(a, gvars)
        p = self.ptr(a)
        if a.mode == "vector":
            load = K.Load(arr, idx, p, off, self.p.vec, None, self.p.load_cache)
        elif a.mode == "strided" and self.p.vec > 1:
            inner = self.p.groups[-1][-1]
            load = K.Load(arr, idx, p, off, self.p.vec, self.stride(a, a.eff[inner][1]))
        else:
            load = K.Load(arr, idx, p, off, 1)
        # a pad / cat operand outside its range: no load (uniform over a vector's lanes)
        guard = self.in_bounds(a.node.key) if not a.node.affine else None
        body = pre + [load]
        return body if guard is None else [K.If(guard, body)]

    def compute_block(self, arrays, gvars, u, levels=None, thread_vals=None) -> list:
        body: list = []
        stores = [a for a in self.s.accesses if a.is_store]
        for a in stores:
            body.append(K.Alloc(f"T{a.tv.number}_w", a.tv.dtype, (self.p.vec,)))
        lanes: list = []
        if levels is None:
            vals = self.lane_values(arrays, u, lanes)
        else:
            vals = dict(thread_vals or {})
            self.lane_values(arrays, u, body, levels, STEP, vals)
            self.lane_values(arrays, u, lanes, levels, LANE, vals)
        for a in stores:
            lanes.append(K.Assign(f"T{a.tv.number}_w", (K.Var("v"),),
                                  K.Convert("store", vals[id(a.node)], a.tv.dtype, a.tv.dtype)))
        body.append(K.Loop("v", self.const(0), self.const(self.p.vec), self.const(1), "lanes", lanes))
        cache = self.p.store_cache
        for a in stores:
            off = self.offset(a, gvars)
            p = self.ptr(a)
            if a.mode == "vector":
                body.append(K.Store(p, off, f"T{a.tv.number}_w", (), self.p.vec, None, cache))
            elif a.mode == "strided" and self.p.vec > 1:
                inner = self.p.groups[-1][-1]
                body.append(K.Store(p, off, f"T{a.tv.number}_w", (), self.p.vec,
                                    self.stride(a, a.eff[inner][1])))
            else:  # one element (vec == 1)
                body.append(K.Store(p, off, f"T{a.tv.number}_w", (), 1, None, cache))
        return body

    # ---- the kernel -----------------------------------------------------------------------
    def build(self, name: str) -> K.Kernel:
        p, G = self.p, len(self.p.groups)
        for a in sorted(self.s.accesses, key=lambda a: a.seg):
            if a.rng is None:
                self.ptr(a)
        for gi in range(G):
            self.prologue.append(K.Let(f"e{gi}", "nidx_t", self.group_extent(gi)))
        gvars = [K.Var(f"g{gi}") for gi in range(G)]
        loads = [a for a in self.s.accesses if not a.is_store and a.rng is None]
        arrays, seen = self.arrays, {}
        for a in loads:
            n = seen.get(a.tv.number, 0)
            seen[a.tv.number] = n + 1
            arrays[id(a.node)] = (f"T{a.tv.number}_r" + (str(n) if n else ""), a)
        U, T, V = p.unroll, p.block, p.vec
        tid = K.Special("threadIdx.x")
        u = K.Var("u")
        levels = self.node_levels(arrays)
        if p.kind == "1d":   # no row-invariant loads in 1-D: THREAD-level nodes are all `full`s
            levels = {k: max(lv, STEP) for k, lv in levels.items()}
        thread_stmts: list = []
        thread_vals = self.lane_values(arrays, u, thread_stmts, levels, THREAD, {})

        def allocs(row_invariant):
            out = []
            for a in loads:
                if a.row_invariant == row_invariant:
                    arr = arrays[id(a.node)][0]
                    w = 1 if a.mode == "bcast" else V
                    out.append(K.Alloc(arr, a.tv.dtype, (w,) if row_invariant else (U, w)))
            return out

        def load_block(filter_row_inv=False):
            return [st for a in loads if a.row_invariant == filter_row_inv
                    for st in self.load_stmt(a, arrays[id(a.node)][0], gvars, u)]

        body: list = []
        if p.kind == "1d":
            nl = K.Var("e_all")
            tot = self.const(1)
            for gi in range(G):
                tot = K.mul(tot, K.Var(f"e{gi}"))
            body.append(K.Let("e_all", "nidx_t", tot))
            chunk = U * T * V
            body.append(K.Let("nbx", "nidx_t", K.Bin("/", K.add(nl, self.const(chunk - 1)), self.const(chunk))))
            lin = K.mul(K.add(K.mul(K.add(K.mul(K.Var("bx"), self.const(U)), u), self.const(T)), tid),
                        self.const(V))

            def step(inner_fn):
                blk = [K.Let("i", "nidx_t", lin)]
                inner = []
                self.decompose(K.Var("i"), list(range(G)), inner)
                self.r_lets(inner)
                inner += inner_fn()
                blk.append(K.If(K.Bin("<", K.Var("i"), nl), inner))
                return K.Loop("u", self.const(0), self.const(U), self.const(1), "unroll", blk)

            grid = [*allocs(False), step(load_block),
                    step(lambda: self.compute_block(arrays, gvars, u, levels, thread_vals))]
            body.append(K.Loop("bx", K.Special("blockIdx.x"), K.Var("nbx"), K.Special("gridDim.x"),
                               "grid", grid, "blocks of the linear index"))
        else:
            outer = list(range(G - 1))
            eo = self.const(1)
            for gi in outer:
                eo = K.mul(eo, K.Var(f"e{gi}"))
            ein = K.Var(f"e{G - 1}")
            body.append(K.Let("e_rows", "nidx_t", eo))
            body.append(K.Let("nby", "nidx_t", K.Bin("/", K.add(K.Var("e_rows"), self.const(U - 1)), self.const(U))))
            body.append(K.Let("nbx", "nidx_t", K.Bin("/", K.add(ein, self.const(T * V - 1)), self.const(T * V))))
            row = K.add(K.mul(K.Var("by"), self.const(U)), u)

            def step(inner_fn):
                blk = [K.Let("o", "nidx_t", row)]
                inner = []
                self.decompose(K.Var("o"), outer, inner)
                self.r_lets(inner)
                inner += inner_fn()
                blk.append(K.If(K.Bin("<", K.Var("o"), K.Var("e_rows")), inner))
                return K.Loop("u", self.const(0), self.const(U), self.const(1), "unroll", blk)

            cols = [*allocs(True), *load_block(True), *thread_stmts, *allocs(False),
                    step(load_block),
                    step(lambda: self.compute_block(arrays, gvars, u, levels, thread_vals))]
            colblk = [K.Let(f"g{G - 1}", "nidx_t", K.mul(K.add(K.mul(K.Var("bx"), self.const(T)), tid),
                                                       self.const(V))),
                      K.If(K.Bin("<", K.Var(f"g{G - 1}"), ein), cols)]
            bx_loop = K.Loop("bx", K.Special("blockIdx.x"), K.Var("nbx"), K.Special("gridDim.x"),
                             "grid", colblk, "column blocks")
            body.append(K.Loop("by", K.Special("blockIdx.y"), K.Var("nby"), K.Special("gridDim.y"),
                               "grid", [bx_loop], "row blocks"))
        body = self.prologue + body
        return K.Kernel(name, self.params(), self.tensors, self.it, T, body, p.min_blocks)

