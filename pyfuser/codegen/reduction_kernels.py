"""The two kernel shapes of the reduction family (see reduction_lowering.py for the layout of
both): `InnerKernel` (reduced axes innermost: a thread team per row) and `OuterKernel` (kept axes
innermost: threads across columns, the reduced index split over threadIdx.y)."""
from __future__ import annotations

from ..ir import exprs as E
from . import kernel_ir as K
from ..ir.dtypes import DataType
from .reduction_combine import acc_dtypes, identity
from .reduction_lowering import ReductionLowering, _and, _c, _guard

TX, TY = K.Special("threadIdx.x"), K.Special("threadIdx.y")
WARP = 32


class InnerKernel(ReductionLowering):
    def kernel_body(self) -> list:
        p, V = self.p, self.V
        self.rin = self.rg[-1] if self.rg else None
        rout = self.rg[:-1]
        body = [K.Let("rows", "nidx_t", self._prod(self.kg)),
                K.Let("rlen", "nidx_t", K.Var(f"e{self.rin}") if self.rin is not None else _c(1)),
                K.Let("nro", "nidx_t", self._prod(rout))]
        if not p.persistent:
            chunk = p.bdimx * p.unroll * V
            body.append(K.Let("niter", "nidx_t", K.Bin("/", K.add(K.Var("rlen"), _c(chunk - 1)),
                                                       _c(chunk))))
        plans = [self.pass_plan(q) for q in range(self.n_total_passes())]
        needed = {id(n) for _, _, full, _ in plans for n in full if n.kind == "load"}
        self.hoisted = set()
        if p.persistent:
            for a in self.loads:
                if id(a.node) in needed and self.row_invariant(a):
                    self.hoisted.add(id(a.node))
                    body += self.persistent_loads(a, {})
        rb: list = [K.Let("row", "nidx_t", K.add(K.mul(K.Var("rb"), _c(p.bdimy)), TY)),
                    K.Let("row_ok", "bool", K.Bin("<", K.Var("row"), K.Var("rows")))]
        self.row_ok = K.Var("row_ok")
        self.kidx = self.decompose(K.Var("row"), self.kg, rb)
        known: dict = {}
        for a in self.loads:
            if self.lvl[id(a.node)] == "row":
                rb += [K.Alloc(self.buf(a), a.tv.dtype, (1,)),
                       *_guard(self.row_ok, [self.load_stmt(a, (), self.offset(a, self.kidx))])]
                known[id(a.node)] = self.load_value(a.node, lambda a: (_c(0),))
        known = self.row_values(0, known, rb)
        if p.persistent:
            for a in self.loads:
                if id(a.node) in needed and id(a.node) not in self.hoisted:
                    rb += self.persistent_loads(a, self.kidx)
            rb += self.kept_allocs()
        for q, plan in enumerate(plans):
            known = self.one_pass(q, plan, known, rb)
        if self.shared:
            rb.append(K.Sync())                   # the next row block rewrites shared memory
        nrb = K.Bin("/", K.add(K.Var("rows"), _c(p.bdimy - 1)), _c(p.bdimy))
        body += [K.Let("nrb", "nidx_t", nrb),
                 K.Loop("rb", K.Special("blockIdx.x"), K.Var("nrb"), K.Special("gridDim.x"), "grid",
                        rb, "row blocks")]
        return body

    # ---- pieces ---------------------------------------------------------------------------------
    def j_persistent(self, s):
        return K.mul(K.add(K.mul(s, _c(self.p.bdimx)), TX), _c(self.V))

    def j_streamed(self, u):
        p = self.p
        return K.mul(K.add(K.mul(K.add(K.mul(K.Var("it"), _c(p.unroll)), u), _c(p.bdimx)), TX),
                     _c(self.V))

    def persistent_loads(self, a, kidx) -> list:
        s = K.Var("s")
        idx = dict(kidx)
        if self.rin is not None:
            idx[self.rin] = K.Var("j")
        cond = _and(None if not kidx else self.row_ok, K.Bin("<", K.Var("j"), K.Var("rlen")))
        return [self.buffer(a, self.p.steps),
                K.Loop("s", _c(0), _c(self.p.steps), _c(1), "unroll",
                       [K.Let("j", "nidx_t", self.j_persistent(s)),
                        *_guard(cond, [self.load_stmt(a, (s,), self.offset(a, idx))])])]

    def row_values(self, q, known, out) -> dict:
        """Row-level values existing from pass q on, and the reduced outputs among them."""
        known = self.emit_nodes(self.row_nodes(q), known, None, out)
        for a in self.stores:
            if self.lvl[id(a.node)] == "row" and self.avail[id(a.node)] == q:
                st, _ = self.store_stmts(a, known[id(a.node)], self.offset(a, self.kidx), False)
                out += _guard(_and(self.row_ok, K.Bin("==", TX, _c(0))), st)
        return known

    def step_body(self, step, j, plan, known, wvs: dict) -> list:
        """What one vector step of a pass does: values lane by lane, accumulate, stores."""
        reds, outs, full, inputs = plan
        body: list = []
        lanes: list = []
        vals = self.emit_nodes(full, known, lambda n: self.load_value(
            n, lambda a: self.lane_index(a, step)), lanes)
        if self.p.persistent:
            self.keep_values(self.q, full, vals, step, lanes)
        for e in reds:
            vnode = inputs[id(e)]
            if isinstance(e, E.WelfordOp):
                self.welford_value(e, vals[id(vnode)], vnode, wvs[id(e)], step, lanes)
            else:
                self.accumulate(e, vals[id(vnode)], vnode, (K.Var("v"),), lanes)
        after: list = []
        idx = dict(self.kidx)
        idx.update(self.ridx)
        if self.rin is not None:
            idx[self.rin] = K.Var("j")
        for a, node in outs:
            body.append(K.Alloc(f"T{a.tv.number}_w", a.tv.dtype, (self.V,)))
            inside, st = self.store_stmts(a, vals[id(node)], self.offset(a, idx), True)
            lanes += inside
            after += st
        return body + [self.lanes(lanes)] + after

    def one_pass(self, q, plan, known, out) -> dict:
        reds, outs, full, inputs = plan
        p = self.p
        self.q = q
        if not reds and not outs:
            return self.row_values(q + 1, known, out)
        self.init_accs(reds, True, out)
        steps = p.steps if p.persistent else p.unroll
        wvs = {}
        for e in reds:
            if isinstance(e, E.WelfordOp):
                wvs[id(e)] = self.comb.fresh("wv")
        cond_of = lambda j: _and(self.row_ok, K.Bin("<", j, K.Var("rlen")))  # noqa: E731
        self.ridx = {}
        if p.persistent:
            for e in reds:
                if id(e) in wvs:
                    out.append(K.Alloc(wvs[id(e)], acc_dtypes(e)[0], (steps, self.V)))
            s = K.Var("s")
            out.append(K.Loop("s", _c(0), _c(steps), _c(1), "unroll",
                              [K.Let("j", "nidx_t", self.j_persistent(s)),
                               *_guard(cond_of(K.Var("j")),
                                       self.step_body(s, K.Var("j"), plan, known, wvs))]))
            for e in reds:
                if id(e) in wvs:
                    self.welford_chunk(e, wvs[id(e)], steps, "s", lambda st: (
                        [K.Let("j", "nidx_t", self.j_persistent(st))], cond_of(K.Var("j"))), out)
        else:
            out += self.streamed(q, plan, known, wvs, cond_of)
        self.combine_team(reds, out)
        known = self.kept_known(q, known)
        for e in reds:
            res = self.result_exprs(e, [K.ArrayRef(n, ()) for n in self.partial_names(e)])
            for node in self.g.nodes:
                if id(node) in res:
                    name = self.names[id(node)]
                    out.append(K.Let(name, K.REGISTER_CTYPE[node.tv.dtype], res[id(node)]))
                    known[id(node)] = K.Var(name)
        return self.row_values(q + 1, known, out)

    def streamed(self, q, plan, known, wvs, cond_of) -> list:
        reds, outs, full, inputs = plan
        p = self.p
        u = K.Var("u")
        it_body: list = []
        rout = self.rg[:-1]
        for e in reds:
            if id(e) in wvs:
                it_body.append(K.Alloc(wvs[id(e)], acc_dtypes(e)[0], (p.unroll, self.V)))
        loads = [a for a in self.loads if any(n is a.node for n in full)]
        idx = dict(self.kidx)
        idx.update(self.ridx_vars(rout))
        if self.rin is not None:
            idx[self.rin] = K.Var("j")
        for a in loads:
            it_body.append(self.buffer(a, p.unroll))
        j_let = K.Let("j", "nidx_t", self.j_streamed(u))
        it_body.append(K.Loop("u", _c(0), _c(p.unroll), _c(1), "unroll", [j_let, *_guard(
            cond_of(K.Var("j")), [self.load_stmt(a, (u,), self.offset(a, idx)) for a in loads])]))
        self.ridx = self.ridx_vars(rout)
        it_body.append(K.Loop("u", _c(0), _c(p.unroll), _c(1), "unroll", [j_let, *_guard(
            cond_of(K.Var("j")), self.step_body(u, K.Var("j"), plan, known, wvs))]))
        for e in reds:
            if id(e) in wvs:
                self.welford_chunk(e, wvs[id(e)], p.unroll, "u", lambda st: (
                    [K.Let("j", "nidx_t", self.j_streamed(st))], cond_of(K.Var("j"))), it_body)
        loop = K.Loop("it", _c(0), K.Var("niter"), _c(1), "serial", it_body, "vector steps of a row")
        if not rout:
            return [loop]
        ro_body: list = []
        self.decompose(K.Var("ro"), rout, ro_body)
        return [K.Loop("ro", _c(0), K.Var("nro"), _c(1), "serial", ro_body + [loop],
                       "outer reduced groups")]

    def ridx_vars(self, rout) -> dict:
        return {gi: K.Var(f"g{gi}") for gi in rout}

    # ---- combining across lanes and threads -------------------------------------------------------
    def partial_names(self, e) -> list:
        if isinstance(e, E.WelfordOp):
            return self.acc_names(e)
        i = self.g.reduces.index(e)
        return [f"r{i}"]

    def combine_team(self, reds, out) -> None:
        p = self.p
        for e in reds:                                   # lanes, in order
            if isinstance(e, E.WelfordOp):
                continue
            (acc,) = self.acc_names(e)
            (r,) = self.partial_names(e)
            out += [K.Alloc(r, acc_dtypes(e)[0], ()), K.Assign(r, (), K.ArrayRef(acc, (_c(0),)))]
            for v in range(1, self.V):
                new = self.comb.combine(e, [K.ArrayRef(r, ())], [K.ArrayRef(acc, (_c(v),))], out)
                out.append(K.Assign(r, (), new[0]))
        if p.bdimx == 1:
            return
        width = min(p.bdimx, WARP)
        m = width // 2
        while m >= 1:
            for e in reds:
                names = self.partial_names(e)
                shf = []
                for n, dt in zip(names, acc_dtypes(e)):
                    t = self.comb.fresh("shf")
                    out.append(K.Let(t, K.REGISTER_CTYPE[dt], K.Shfl(K.ArrayRef(n, ()), m, dt)))
                    shf.append(K.Var(t))
                new = self.comb.combine(e, [K.ArrayRef(n, ()) for n in names], shf, out)
                self.comb.assign_all(e, names, (), new, out)
            m //= 2
        if p.bdimx <= WARP:
            return
        nw = p.bdimx // WARP
        lane0 = K.Bin("==", K.Bin("%", TX, _c(WARP)), _c(0))
        warp = K.Bin("/", TX, _c(WARP))
        writes, reads = [], []
        for e in reds:
            names = self.partial_names(e)
            reds_sm = []
            for n, dt in zip(names, acc_dtypes(e)):
                sm = self.comb.fresh("red")
                self.shared.append(K.Alloc(sm, dt, (p.bdimy, nw), "shared"))
                writes.append(K.Assign(sm, (TY, warp), K.ArrayRef(n, ())))
                reds_sm.append(sm)
            for n, sm in zip(names, reds_sm):
                reads.append(K.Assign(n, (), K.ArrayRef(sm, (TY, _c(0)))))
            for w in range(1, nw):
                new = self.comb.combine(e, [K.ArrayRef(n, ()) for n in names],
                                        [K.ArrayRef(sm, (TY, _c(w))) for sm in reds_sm], reads)
                self.comb.assign_all(e, names, (), new, reads)
        out += [K.If(lane0, writes), K.Sync()] + reads


class OuterKernel(ReductionLowering):
    def kernel_body(self) -> list:
        p, V = self.p, self.V
        self.kin = self.kg[-1]
        kout = self.kg[:-1]
        body = [K.Let("cols", "nidx_t", K.Var(f"e{self.kin}")),
                K.Let("nko", "nidx_t", self._prod(kout)),
                K.Let("nr", "nidx_t", self._prod(self.rg)),
                K.Let("ncb", "nidx_t", K.Bin("/", K.add(K.Var("cols"), _c(p.bdimx * V - 1)),
                                             _c(p.bdimx * V)))]
        if not p.persistent:
            chunk = p.bdimy * p.unroll * p.splits
            body.append(K.Let("niter", "nidx_t", K.Bin("/", K.add(K.Var("nr"), _c(chunk - 1)),
                                                       _c(chunk))))
        cb = [K.Let("col", "nidx_t", K.mul(K.add(K.mul(K.Var("cb"), _c(p.bdimx)), TX), _c(V))),
              K.Let("col_ok", "bool", K.Bin("<", K.Var("col"), K.Var("cols")))]
        self.col_ok = K.Var("col_ok")
        ko: list = []
        self.kidx = self.decompose(K.Var("ko"), kout, ko)
        self.kidx[self.kin] = K.Var("col")
        plans = [self.pass_plan(q) for q in range(self.n_total_passes())]
        needed = {id(n) for _, _, full, _ in plans for n in full if n.kind == "load"}
        known: dict = {}
        for a in self.loads:
            if self.lvl[id(a.node)] == "row":
                dims = (1,) if a.mode == "bcast" else (V,)
                ko += [K.Alloc(self.buf(a), a.tv.dtype, dims),
                       *_guard(self.col_ok, [self.load_stmt(a, (), self.offset(a, self.kidx))])]
                known[id(a.node)] = self.load_value(a.node, lambda a: self.lane_index(a, None))
        known = self.row_values(0, known, ko)
        if p.persistent:
            for a in self.loads:
                if id(a.node) in needed:
                    ko += self.persistent_loads(a)
            ko += self.kept_allocs()
        for q, plan in enumerate(plans):
            known = self.one_pass(q, plan, known, ko)
        if self.shared:
            ko.append(K.Sync())
        cb.append(K.Loop("ko", K.Special("blockIdx.y"), K.Var("nko"), K.Special("gridDim.y"), "grid",
                         ko, "other kept groups"))
        body.append(K.Loop("cb", K.Special("blockIdx.x"), K.Var("ncb"), K.Special("gridDim.x"),
                           "grid", cb, "column blocks"))
        return body

    def r_persistent(self, s):
        return K.add(K.mul(s, _c(self.p.bdimy)), TY)

    def r_streamed(self, u):
        """Row of step u of iteration `it`: splits > 1 interleave U * bdimy-row chunks over
        blockIdx.z."""
        step = K.Var("it")
        if self.p.splits > 1:
            step = K.add(K.mul(step, _c(self.p.splits)), K.Special("blockIdx.z"))
        return K.add(K.mul(K.add(K.mul(step, _c(self.p.unroll)), u), _c(self.p.bdimy)), TY)

    def cond_of(self, r):
        return _and(self.col_ok, K.Bin("<", r, K.Var("nr")))

    def at_r(self, r_expr, body_fn) -> list:
        """Let r, decompose it over the reduced groups, then `body_fn(index)` under the guard."""
        lets = [K.Let("r", "nidx_t", r_expr)]
        inner: list = []
        ridx = self.decompose(K.Var("r"), self.rg, inner)
        idx = dict(self.kidx)
        idx.update(ridx)
        return lets + _guard(self.cond_of(K.Var("r")), inner + body_fn(idx))

    def persistent_loads(self, a) -> list:
        s = K.Var("s")
        return [self.buffer(a, self.p.steps),
                K.Loop("s", _c(0), _c(self.p.steps), _c(1), "unroll", self.at_r(
                    self.r_persistent(s), lambda idx: [self.load_stmt(a, (s,), self.offset(a, idx))]))]

    def row_values(self, q, known, out) -> dict:
        """Per-column values (lanes) existing from pass q on, kept in [V] arrays, and the
        reduced outputs among them (written by threadIdx.y 0)."""
        nodes = [n for n in self.row_nodes(q) if n.kind not in ("set", "alias")]
        known = dict(known)
        if nodes:
            lanes: list = []
            vals = self.emit_nodes(self.row_nodes(q), known, None, lanes)
            for n in nodes:
                arr = self.names[id(n)] + "_c"
                out.append(K.Alloc(arr, n.tv.dtype.compute if n.tv.dtype.is_reduced_float
                                   else n.tv.dtype, (self.V,)))
                lanes.append(K.Assign(arr, (K.Var("v"),), vals[id(n)]))
            out.append(self.lanes(lanes))
            for n in nodes:
                known[id(n)] = K.ArrayRef(self.names[id(n)] + "_c", (K.Var("v"),))
            for n in self.row_nodes(q):
                if n.kind in ("set", "alias"):
                    known[id(n)] = known[id(n.args[0])]
        for a in self.stores:
            if self.lvl[id(a.node)] == "row" and self.avail[id(a.node)] == q:
                inside, after = self.store_stmts(a, known[id(a.node)], self.offset(a, self.kidx), True)
                st = [K.Alloc(f"T{a.tv.number}_w", a.tv.dtype, (self.V,)), self.lanes(inside)] + after
                out += _guard(_and(self.col_ok, K.Bin("==", TY, _c(0))), st)
        return known

    def step_body(self, step, idx, plan, known, wvs) -> list:
        reds, outs, full, inputs = plan
        lanes: list = []
        vals = self.emit_nodes(full, known, lambda n: self.load_value(
            n, lambda a: self.lane_index(a, step)), lanes)
        if self.p.persistent:
            self.keep_values(self.q, full, vals, step, lanes)
        for e in reds:
            vnode = inputs[id(e)]
            if isinstance(e, E.WelfordOp):
                self.welford_value(e, vals[id(vnode)], vnode, wvs[id(e)], step, lanes)
            else:
                self.accumulate(e, vals[id(vnode)], vnode, (K.Var("v"),), lanes)
        body, after = [], []
        for a, node in outs:
            body.append(K.Alloc(f"T{a.tv.number}_w", a.tv.dtype, (self.V,)))
            inside, st = self.store_stmts(a, vals[id(node)], self.offset(a, idx), True)
            lanes += inside
            after += st
        return body + [self.lanes(lanes)] + after

    def one_pass(self, q, plan, known, out) -> dict:
        reds, outs, full, inputs = plan
        p = self.p
        self.q = q
        if not reds and not outs:
            return self.row_values(q + 1, known, out)
        self.init_accs(reds, True, out)
        steps = p.steps if p.persistent else p.unroll
        wvs = {id(e): self.comb.fresh("wv") for e in reds if isinstance(e, E.WelfordOp)}
        if p.persistent:
            for e in reds:
                if id(e) in wvs:
                    out.append(K.Alloc(wvs[id(e)], acc_dtypes(e)[0], (steps, self.V)))
            s = K.Var("s")
            out.append(K.Loop("s", _c(0), _c(steps), _c(1), "unroll", self.at_r(
                self.r_persistent(s), lambda idx: self.step_body(s, idx, plan, known, wvs))))
            for e in reds:
                if id(e) in wvs:
                    self.welford_chunk(e, wvs[id(e)], steps, "s", lambda st: (
                        [K.Let("r", "nidx_t", self.r_persistent(st))],
                        self.cond_of(K.Var("r"))), out)
        else:
            u = K.Var("u")
            it_body: list = []
            for e in reds:
                if id(e) in wvs:
                    it_body.append(K.Alloc(wvs[id(e)], acc_dtypes(e)[0], (p.unroll, self.V)))
            loads = [a for a in self.loads if any(n is a.node for n in full)]
            for a in loads:
                it_body.append(self.buffer(a, p.unroll))
            it_body.append(K.Loop("u", _c(0), _c(p.unroll), _c(1), "unroll", self.at_r(
                self.r_streamed(u), lambda idx: [self.load_stmt(a, (u,), self.offset(a, idx))
                                                 for a in loads])))
            it_body.append(K.Loop("u", _c(0), _c(p.unroll), _c(1), "unroll", self.at_r(
                self.r_streamed(u), lambda idx: self.step_body(u, idx, plan, known, wvs))))
            for e in reds:
                if id(e) in wvs:
                    self.welford_chunk(e, wvs[id(e)], p.unroll, "u", lambda st: (
                        [K.Let("r", "nidx_t", self.r_streamed(st))],
                        self.cond_of(K.Var("r"))), it_body)
            out.append(K.Loop("it", _c(0), K.Var("niter"), _c(1), "serial", it_body,
                              "row steps of the reduced index"))
        results = self.combine_block(reds, out)
        if p.splits > 1:
            results, out = self.combine_grid(reds, results, out)
        known = self.kept_known(q, known)
        for e in reds:
            known.update(self.result_exprs(e, [K.ArrayRef(n, (K.Var("v"),)) for n in results[id(e)]]))
        return self.row_values(q + 1, known, out)

    def combine_grid(self, reds, results, out) -> tuple:
        """The blocks of blockIdx.z (splits of the reduced index) meet in global memory: each
        writes its partial (threadIdx.y 0, per column), fences, and counts itself in on the
        column block's semaphore; the block that arrives last (the atomic's old value is
        splits - 1) reads every partial in z order and goes on with the results. No float
        atomics: the combination order is fixed. Returns (result arrays, where the rest of the
        pass goes: inside that last block's branch)."""
        p, V = self.p, self.V
        zero = _c(0)
        first = _and(K.Bin("==", TX, zero), K.Bin("==", TY, zero))
        sem_at = K.add(K.mul(K.Var("ko"), K.Var("ncb")), K.Var("cb"))
        part_at = lambda z: K.add(K.mul(K.add(K.mul(K.Var("ko"), _c(p.splits)), z),  # noqa: E731
                                        K.Var("cols")), K.Var("col"))
        writes, reads, names = [], [], {}
        for e in reds:
            names[id(e)] = []
            for n, dt in zip(results[id(e)], acc_dtypes(e)):
                ws = self.workspace(dt, "partials")
                writes.append(K.Store(ws, part_at(K.Special("blockIdx.z")), n, (), V))
                names[id(e)].append((ws, dt))
        sem = self.workspace(DataType.Int32, "semaphores")
        last = self.comb.fresh("last")
        self.shared.append(K.Alloc(last, DataType.Bool, (), "shared"))
        out += _guard(_and(K.Bin("==", TY, zero), self.col_ok), writes)
        out += [K.Fence(), K.Sync(),
                K.If(first, [K.AtomicAdd("arrived", sem, sem_at, _c(1)),
                             K.Assign(last, (), K.Bin("==", K.Var("arrived"), _c(p.splits - 1)))]),
                K.Sync()]
        tail: list = [K.Fence()]
        final = {}
        body: list = []
        for e in reds:
            fin = []
            for ws, dt in names[id(e)]:
                name = ws + "_all"
                body.append(K.Alloc(name, dt, (V,)))
                fin.append(name)
            final[id(e)] = fin
        zloop: list = []
        for e in reds:
            tmp = []
            for ws, dt in names[id(e)]:
                t = ws + "_z"
                zloop += [K.Alloc(t, dt, (V,)), K.Load(t, (), ws, part_at(K.Var("z")), V, None, "cg")]
                tmp.append(t)
            merge: list = []
            new = self.comb.combine(e, [K.ArrayRef(n, (K.Var("v"),)) for n in final[id(e)]],
                                    [K.ArrayRef(t, (K.Var("v"),)) for t in tmp], merge)
            self.comb.assign_all(e, final[id(e)], (K.Var("v"),), new, merge)
            zloop.append(self.lanes(merge))
        for e in reds:
            body.append(self.lanes([K.Assign(n, (K.Var("v"),), init)
                                    for n, init in zip(final[id(e)], identity(e))]))
        body.append(K.Loop("z", zero, _c(p.splits), _c(1), "serial", zloop, "partials in order"))
        tail += _guard(_and(self.col_ok, K.Bin("==", TY, zero)), body)
        out.append(K.If(K.ArrayRef(last, ()), tail))
        return final, body                     # the pass goes on in the last block

    def combine_block(self, reds, out) -> dict:
        """Combine the bdimy partials of every column through shared memory (a tree);
        {id(e): names of [V] arrays holding the block's result, the same in every thread}."""
        p, V = self.p, self.V
        if p.bdimy == 1:
            return {id(e): self.acc_names(e) for e in reds}
        assert p.bdimy & (p.bdimy - 1) == 0, "the block tree needs a power-of-two bdimy"
        col = K.add(K.mul(TX, _c(V)), K.Var("v"))
        sms, writes = {}, []
        for e in reds:
            sms[id(e)] = []
            for n, dt in zip(self.acc_names(e), acc_dtypes(e)):
                sm = self.comb.fresh("red")
                self.shared.append(K.Alloc(sm, dt, (p.bdimy, p.bdimx * V), "shared"))
                writes.append(K.Assign(sm, (TY, col), K.ArrayRef(n, (K.Var("v"),))))
                sms[id(e)].append(sm)
        out += [self.lanes(writes), K.Sync()]
        s = p.bdimy // 2
        while s >= 1:
            step: list = []
            for e in reds:
                names = sms[id(e)]
                other = K.add(TY, _c(s))
                new = self.comb.combine(e, [K.ArrayRef(sm, (TY, col)) for sm in names],
                                        [K.ArrayRef(sm, (other, col)) for sm in names], step)
                self.comb.assign_all(e, names, (TY, col), new, step)
            out += [K.If(K.Bin("<", TY, _c(s)), [self.lanes(step)]), K.Sync()]
            s //= 2
        results = {}
        reads = []
        for e in reds:
            res = []
            for sm, dt in zip(sms[id(e)], acc_dtypes(e)):
                name = sm + "_res"
                out.append(K.Alloc(name, dt, (V,)))
                reads.append(K.Assign(name, (K.Var("v"),), K.ArrayRef(sm, (_c(0), col))))
                res.append(name)
            results[id(e)] = res
        out.append(self.lanes(reads))
        return results
