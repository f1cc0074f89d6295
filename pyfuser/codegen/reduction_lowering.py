"""Lowering of the reduction-family schedules (reduction, inner / outer persistent) to kernel IR.

Names: `e<i>` collapsed group extents, `g<i>` a thread's index in group i, `row` / `col` the kept
index a thread works on, `j` (inner) or `r` (outer) its position along the reduced index, `acc*`
accumulators, `T<n>_r` loaded elements, `t<n>` values of Fusion ops, `red*` shared memory.

Inner kind (reduced axes innermost), one team of bdimx threads per row, bdimy rows a block:
    for rb (grid-stride over row blocks):       row = rb * bdimy + ty; row_ok = row < rows
      row-level loads; [persistent: the row's vectors j = (s * bdimx + tx) * V, s < steps]
      pass p = 0 ..: accumulators; over the thread's vectors (from registers, or loaded again:
          j = ((it * U + u) * bdimx + tx) * V) compute the pass's values lane by lane,
          accumulate, store full outputs of the pass; then combine the lanes, the team (xor
          shuffles, and through shared memory past a warp), compute what depends on the
          results, store reduced outputs (one thread per row)
      __syncthreads (shared memory is reused by the next row block)
Outer kind (kept axes innermost): bdimx threads span bdimx * V columns, bdimy threads split the
reduced index r = (it * U + u) * bdimy + ty (persistent: r = s * bdimy + ty); the partials of the
bdimy threads meet in shared memory (a tree); columns are grid-strided (x), other kept groups too (y).

Every `__syncthreads` and shuffle is outside the per-thread predicates (row_ok, col_ok, j <
rlen): control flow around them is block-uniform, so threads past the end take part with empty
partials. Welford statistics are accumulated in chunks: the values a thread loads in one step
(or its whole persistent share) get their exact mean and m2 in registers, and the chunk is merged
into the running (mean, m2, n) with Chan's formula: one division per chunk, not per element.
"""
from __future__ import annotations

from ..errors import ExecuteError
from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.dtypes import DataType
from ..schedule import layout as L
from ..schedule import reduction_graph as RG
from . import kernel_ir as K
from .emitter import Emitter
from .kernel import LaunchConfig
from .reduction_combine import Combiner, acc_dtypes, identity

I64 = DataType.Int
MAX_GRID_X = 2 ** 31 - 1
MAX_GRID_Y = 65535


def _c(v):
    return K.Const(int(v), "nidx_t")


def _and(*conds):
    out = None
    for c in conds:
        if c is None:
            continue
        out = c if out is None else K.Bin("&&", out, c)
    return out


def _guard(cond, body):
    return [K.If(cond, body)] if cond is not None else body


class ReductionLowering(Emitter):
    def __init__(self, sched):
        super().__init__(sched)
        p = self.p
        self.g = sched.graph
        self.V = p.vec
        self.inner = p.kind == "inner"
        self.kg = [i for i, r in enumerate(p.reduced) if not r]
        self.rg = [i for i, r in enumerate(p.reduced) if r]
        self.ref = RG.reductions(sched.fusion)[0].inputs[0]
        self.loads = [a for a in sched.accesses if not a.is_store]
        self.stores = [a for a in sched.accesses if a.is_store]
        self.comb = Combiner()
        self.shared: list = []
        self.names = self._names()
        self.workspaces: list = []        # (name, dtype, kind) of the workspace buffers
        self.lvl = self.g.level
        self.avail = self.g.avail
        self.consumers = self._consumers()

    # ---- naming / graph helpers -------------------------------------------------------------
    def _names(self) -> dict:
        seen, out = {}, {}
        for node in self.g.nodes:
            n = seen.get(node.tv.number, 0)
            seen[node.tv.number] = n + 1
            out[id(node)] = f"t{node.tv.number}" + (f"_{n}" if n else "")
        for a in self.loads:
            out[("buf", id(a.node))] = f"T{a.tv.number}_r" + \
                (out[id(a.node)][len(f"t{a.tv.number}"):])
        return out

    def _consumers(self) -> dict:
        users: dict = {}
        for n in self.g.nodes:
            for a in n.args:
                if not isinstance(a, Scalar):
                    users.setdefault(id(a), []).append(n)
        return users

    # ---- extents, strides, offsets ----------------------------------------------------------
    def group_extent(self, gi):
        e = _c(1)
        for k in self.p.groups[gi]:
            e = K.mul(e, self.extent_expr(self.ref.logical[k]))
        return e

    def gstride(self, a, gi):
        """Stride of access `a` along group gi (None: it does not move along it)."""
        st = a.eff.get(self.p.groups[gi][-1])
        if st is None or st[0] == 0:
            return None
        if a.mode == "vector" and gi == len(self.p.groups) - 1:
            return _c(1)
        return self.stride(a, st[1])

    def offset(self, a, idx: dict):
        off = _c(0)
        for gi, x in idx.items():
            s = self.gstride(a, gi)
            if s is not None:
                off = K.add(off, K.mul(x, s))
        return off

    def decompose(self, lin, gis, out: list) -> dict:
        """Lets g<i> for groups `gis` (outer first) of the linear index `lin`; {gi: Var}."""
        rest, res = lin, {}
        for pos in range(len(gis) - 1, -1, -1):
            gi = gis[pos]
            if pos == 0:
                out.append(K.Let(f"g{gi}", "nidx_t", rest))
            else:
                out.append(K.Let(f"g{gi}", "nidx_t", K.Bin("%", rest, K.Var(f"e{gi}"))))
                rest = K.Bin("/", rest, K.Var(f"e{gi}"))
            res[gi] = K.Var(f"g{gi}")
        return res

    def row_invariant(self, a) -> bool:
        return all(self.gstride(a, gi) is None for gi in self.kg)

    # ---- values -----------------------------------------------------------------------------
    def load_value(self, node, arr_index):
        dt = node.tv.dtype
        a = next(x for x in self.loads if x.node is node)
        return K.Convert("load", K.ArrayRef(self.names[("buf", id(node))], arr_index(a)), dt, dt)

    def emit_nodes(self, nodes, known: dict, load_expr, out: list) -> dict:
        """Lets of `nodes` (in order) given `known` values; loads through `load_expr(node)`."""
        vals = dict(known)
        for node in nodes:
            if id(node) in vals:
                continue
            if node.kind in ("set", "alias"):
                vals[id(node)] = vals[id(node.args[0])]
                continue
            if node.kind == "load":
                expr = load_expr(node)
            elif node.kind == "reduce":
                raise AssertionError(f"reduction result {node.tv.name} used before its pass ends")
            else:
                expr = self.node_expr(node, lambda x: vals[id(x)])
            name = self.names[id(node)]
            out.append(K.Let(name, K.REGISTER_CTYPE[node.tv.dtype], expr))
            vals[id(node)] = K.Var(name)
        return vals

    # ---- the kernel ---------------------------------------------------------------------------
    def build(self, name: str) -> K.Kernel:
        for a in sorted(self.s.accesses, key=lambda a: a.seg):
            self.ptr(a)
        for gi in range(len(self.p.groups)):
            self.prologue.append(K.Let(f"e{gi}", "nidx_t", self.group_extent(gi)))
        body = self.kernel_body()
        body = self.shared + self.prologue + body
        return K.Kernel(name, self.params(), self.tensors, self.it, (self.p.bdimx, self.p.bdimy, 1),
                        body)

    def _prod(self, gis):
        e = _c(1)
        for gi in gis:
            e = K.mul(e, K.Var(f"e{gi}"))
        return e

    # ---- passes -------------------------------------------------------------------------------
    def pass_plan(self, q: int):
        """(reduce exprs accumulated in pass q, (store access, node) of the full outputs written
        in it, full nodes computed, {id(reduce expr): its input node})."""
        reds, out_nodes, full = RG.pass_nodes(self.g, q)
        outs = [(a, a.node) for a in self.stores if any(a.node is n for n in out_nodes)]
        inputs = {}
        for n in self.g.nodes:
            if n.kind == "reduce" and n.expr in reds:
                inputs.setdefault(id(n.expr), n.args[0])
        return reds, outs, full, inputs

    # ---- values kept in registers between passes (persistent kernels) ------------------------
    def kept_allocs(self) -> list:
        """Allocs of the kept values ([steps][V] in the compute type); sets self.kept."""
        self.kept = {}
        out = []
        for n in getattr(self.s, "kept", []):
            name = self.names[id(n)] + "_k"
            first = min(q for q in range(self.n_total_passes())
                        if any(m is n for m in self.pass_plan(q)[2]))
            self.kept[id(n)] = (name, first)
            out.append(K.Alloc(name, n.tv.dtype.compute, (self.p.steps, self.V)))
        return out

    def keep_values(self, q, full, vals, step, lanes: list) -> None:
        """In pass q's lanes loop: store the kept values this pass computes first."""
        for n in full:
            hit = getattr(self, "kept", {}).get(id(n))
            if hit is not None and hit[1] == q:
                lanes.append(K.Assign(hit[0], (step, K.Var("v")), vals[id(n)]))

    def kept_known(self, q, known: dict) -> dict:
        """`known` plus the kept values computed in pass q (read back in later passes)."""
        known = dict(known)
        for nid, (name, first) in getattr(self, "kept", {}).items():
            if first == q:
                known[nid] = K.ArrayRef(name, (K.Var("s"), K.Var("v")))
        return known

    def n_total_passes(self) -> int:
        return RG.total_passes(self.g)

    def row_nodes(self, p: int) -> list:
        """Row-level nodes whose value exists from pass p on (computed once, before pass p)."""
        return [n for n in self.g.nodes if self.lvl[id(n)] == "row" and self.avail[id(n)] == p
                and n.kind != "load"]

    # ---- accumulating a value into a reduce's accumulator --------------------------------------
    def acc_names(self, e) -> list:
        i = self.g.reduces.index(e)
        return [f"acc{i}_{k}" for k in range(len(acc_dtypes(e)))]

    def accumulate(self, e, val, vnode, lane_idx, out: list) -> None:
        """acc[lane] = combine(acc[lane], val) for sum / prod / max / min (Welford goes through
        chunks)."""
        (name,) = self.acc_names(e)
        dt = acc_dtypes(e)[0]
        src = vnode.tv.dtype
        x = val if src.compute is dt else K.Convert("cast", val, src, dt)
        new = self.comb.combine(e, [K.ArrayRef(name, lane_idx)], [x], out)
        out.append(K.Assign(name, lane_idx, new[0]))

    def workspace(self, dtype, kind: str) -> str:
        """A global buffer the runtime allocates for this launch (zeroed), after the outputs:
        a pointer parameter named ws<i>; `kind` is "partials" or "semaphores"."""
        i = len(self.workspaces)
        name = f"ws{i}"
        seg = len(self.s.fusion.tensor_inputs()) + len(self.s.fusion.outputs) + i
        self.tensors[name] = K.TensorParam(name, dtype, seg, True)
        self._param(self.ptr_params, name, "void*", ("ptr", seg))
        self.workspaces.append((name, dtype, kind))
        return name

    # ---- loads and stores -------------------------------------------------------------------
    def buf(self, a) -> str:
        return self.names[("buf", id(a.node))]

    def load_stmt(self, a, index: tuple, off):
        """Load of access `a` into its buffer at `index` (a row of V lanes, or one for bcast)."""
        p = self.ptr(a)
        if a.mode == "vector":
            return K.Load(self.buf(a), index, p, off, self.V)
        if a.mode == "strided" and self.V > 1:
            inner = len(self.p.groups) - 1
            return K.Load(self.buf(a), index, p, off, self.V, self.stride(a, a.eff[self.p.groups[inner][-1]][1]))
        return K.Load(self.buf(a), index, p, off, 1)

    def buffer(self, a, steps: int) -> K.Alloc:
        """The register buffer of load `a`: `steps` rows of V lanes; half / bfloat16 vectors
        are kept two to a register (half the registers of one element each)."""
        packed = a.tv.dtype.itemsize == 2 and a.mode == "vector" and self.V % 2 == 0
        return K.Alloc(self.buf(a), a.tv.dtype, (steps, self.V), packed=packed)

    def lane_index(self, a, step) -> tuple:
        """Index of lane v of access `a`'s buffer at `step` (None: a buffer without steps)."""
        lane = _c(0) if a.mode == "bcast" or self.V == 1 else K.Var("v")
        return (lane,) if step is None else (step, lane)

    def store_stmts(self, a, value, off, lanes: bool) -> tuple[list, list]:
        """(statements inside the lanes loop, statements after it) storing `value` for output
        access `a` at `off`; `lanes` False: one element (a per-row value of an inner kernel)."""
        w = f"T{a.tv.number}_w"
        conv = K.Convert("store", value, a.tv.dtype, a.tv.dtype)
        p = self.ptr(a)
        if not lanes:
            return [K.Alloc(w, a.tv.dtype, (1,)), K.Assign(w, (_c(0),), conv),
                    K.Store(p, off, w, (), 1)], []
        inside = [K.Assign(w, (K.Var("v"),), conv)]
        if a.mode == "vector":
            st = K.Store(p, off, w, (), self.V)
        elif a.mode == "strided" and self.V > 1:
            inner = len(self.p.groups) - 1
            st = K.Store(p, off, w, (), self.V, self.stride(a, a.eff[self.p.groups[inner][-1]][1]))
        else:
            st = K.Store(p, off, w, (), 1)
        return inside, [st]

    def lanes(self, body) -> K.Loop:
        return K.Loop("v", _c(0), _c(self.V), _c(1), "lanes", body)

    # ---- accumulators ---------------------------------------------------------------------------
    def init_accs(self, reds, per_lane: bool, out: list) -> None:
        """Allocate and set to the identity every accumulator of `reds` ([V] lanes or scalars);
        Welford statistics of an inner kernel are scalars (chunks mix lanes)."""
        for e in reds:
            lanes = per_lane and (not self.inner or not isinstance(e, E.WelfordOp))
            for name, dt, init in zip(self.acc_names(e), acc_dtypes(e), identity(e)):
                if lanes:
                    out.append(K.Alloc(name, dt, (self.V,)))
                    out.append(self.lanes([K.Assign(name, (K.Var("v"),), init)]))
                else:
                    out.append(K.Alloc(name, dt, ()))
                    out.append(K.Assign(name, (), init))

    def welford_value(self, e, val, vnode, wv: str, step, out: list) -> None:
        """Keep a Welford input value of lane v at `step` for the chunk statistics."""
        dt = acc_dtypes(e)[0]
        src = vnode.tv.dtype
        x = val if src.compute is dt else K.Convert("cast", val, src, dt)
        out.append(K.Assign(wv, (step, K.Var("v")), x))

    def welford_chunk(self, e, wv: str, nsteps: int, step_var: str, valid, out: list) -> None:
        """Merge the chunk `wv[nsteps][V]` (steps where `valid(step)` = (lets, cond) holds) into
        e's accumulators: exact chunk mean and m2 in registers, then Chan's merge. Inner kernels:
        one chunk of every lane into scalar statistics; outer: a chunk per lane."""
        dt = acc_dtypes(e)[0]
        ct = K.REGISTER_CTYPE[dt]
        zero = K.Const(0.0, ct, dt)
        per_lane = not self.inner
        V = self.V
        tag = self.comb.fresh("c")
        cn, cs, cm, c2 = f"{tag}_n", f"{tag}_sum", f"{tag}_mean", f"{tag}_m2"
        lane = (K.Var("v"),) if per_lane else ()
        ref = lambda name: K.ArrayRef(name, lane)  # noqa: E731
        out += [K.Alloc(cn, I64, ()), K.Assign(cn, (), K.Const(0, "int64_t", I64))]
        dims = (V,) if per_lane else ()
        out += [K.Alloc(cs, dt, dims), K.Alloc(c2, dt, dims), K.Alloc(cm, dt, dims)]
        if per_lane:
            out.append(self.lanes([K.Assign(cs, lane, zero), K.Assign(c2, lane, zero)]))
        else:
            out += [K.Assign(cs, (), zero), K.Assign(c2, (), zero)]
        step = K.Var(step_var)
        count = K.Const(1 if per_lane else V, "int64_t", I64)
        add_n = K.Assign(cn, (), K.Op("add", (K.ArrayRef(cn, ()), count), I64))
        if per_lane:
            sum_body = [add_n, self.lanes([K.Assign(cs, lane, K.Op("add", (ref(cs), K.ArrayRef(
                wv, (step, K.Var("v")))), dt))])]
        else:
            sum_body = [add_n, K.Loop("q", _c(0), _c(V), _c(1), "unroll", [K.Assign(
                cs, (), K.Op("add", (K.ArrayRef(cs, ()), K.ArrayRef(wv, (step, K.Var("q")))), dt))])]
        lets, cond = valid(step)
        out.append(K.Loop(step_var, _c(0), _c(nsteps), _c(1), "unroll", lets + _guard(cond, sum_body)))
        nf = K.Convert("cast", K.ArrayRef(cn, ()), I64, dt)
        have = K.Bin("<", K.Const(0, "int64_t", I64), K.ArrayRef(cn, ()))
        inside: list = []
        mean_set = K.Assign(cm, lane, K.Op("div", (ref(cs), nf), dt))
        inside.append(self.lanes([mean_set]) if per_lane else mean_set)
        if per_lane:
            d = K.Op("sub", (K.ArrayRef(wv, (step, K.Var("v"))), ref(cm)), dt)
            sq_body = [self.lanes([K.Let("dd", ct, d), K.Assign(c2, lane, K.Op(
                "add", (ref(c2), K.Op("mul", (K.Var("dd"), K.Var("dd")), dt)), dt))])]
        else:
            d = K.Op("sub", (K.ArrayRef(wv, (step, K.Var("q"))), K.ArrayRef(cm, ())), dt)
            sq_body = [K.Loop("q", _c(0), _c(V), _c(1), "unroll", [K.Let("dd", ct, d), K.Assign(
                c2, (), K.Op("add", (K.ArrayRef(c2, ()), K.Op("mul", (K.Var("dd"), K.Var("dd")), dt)),
                             dt))])]
        lets, cond = valid(step)
        inside.append(K.Loop(step_var, _c(0), _c(nsteps), _c(1), "unroll", lets + _guard(cond, sq_body)))
        names = self.acc_names(e)
        merge: list = []
        new = self.comb.combine(e, [K.ArrayRef(n, lane) for n in names],
                                [ref(cm), ref(c2), K.ArrayRef(cn, ())], merge)
        self.comb.assign_all(e, names, lane, new, merge)
        if per_lane:
            inside.append(self.lanes(merge))
        else:
            inside.extend(merge)
        out.append(K.If(have, inside))

    def result_exprs(self, e, partial: list) -> dict:
        """{id(reduce node): value in the node's dtype} from the final partial of e."""
        out = {}
        for node in self.g.nodes:
            if node.kind != "reduce" or node.expr is not e:
                continue
            k = e.outputs.index(node.tv)
            src = acc_dtypes(e)[k]
            x = partial[k]
            if isinstance(e, E.WelfordOp) and k == 0:     # the mean of nothing is NaN, as eager
                x = K.Op("where", (K.Op("gt", (partial[2], K.Const(0, "int64_t", I64)), I64), x,
                                   K.Const(float("nan"), K.REGISTER_CTYPE[src], src)), src)
            dt = node.tv.dtype
            out[id(node)] = x if src is dt else K.Convert("cast", x, src, dt)
        return out


def plan_reduction_kernel(sched, name: str):
    """(kernel IR, launch_config, workspace sizes) of a reduction-family schedule."""
    from .reduction_kernels import InnerKernel, OuterKernel
    low = (InnerKernel if sched.params.kind == "inner" else OuterKernel)(sched)
    kir = low.build(name)
    return kir, launch_fn(sched), workspace_fn(sched, low.workspaces) if low.workspaces else None


def workspace_fn(sched, workspaces):
    """(bindings, tensors) -> [(elements, torch dtype)] of the grid reduction's buffers: per
    partial value [other kept x splits x columns], and one semaphore per column block."""
    p = sched.params
    ref = RG.reductions(sched.fusion)[0].inputs[0]

    def sizes(bindings, tensors):
        shape = bindings.shape(ref)
        kept = [L.numel(shape[k] for k in g) for g, r in zip(p.groups, p.reduced) if not r]
        cols, nko = kept[-1], L.numel(kept[:-1])
        ncb = -(-cols // (p.bdimx * p.vec))
        return [(max(1, nko * p.splits * cols) if kind == "partials" else max(1, nko * ncb),
                 dt.torch) for _, dt, kind in workspaces]
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
            if p.persistent and red:
                _check_cover(red[-1], p.steps * p.bdimx * p.vec)
            if rows == 0:
                return LaunchConfig((0, 1, 1), block)
            return LaunchConfig((min(-(-rows // p.bdimy), cap, MAX_GRID_X), 1, 1), block)
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

