"""The outer kernel shape of the reduction family (the shared pass driver is reduction_lowering;
the inner shape is reduction_kernels.py).

Outer (kept axes innermost): bdimx threads span bdimx * V columns (col; columns grid-stride on
x, other kept groups on y), bdimy threads split the reduced index r = s * bdimy + ty (persistent)
or ((it * splits + z) * U + u) * bdimy + ty (streamed; z = blockIdx.z of `splits` blocks);
partials meet in shared memory (a tree), then, split over blocks, in a workspace (the last block
to arrive combines them in order); reduced outputs are written by threadIdx.y 0.
"""
from __future__ import annotations

from ..ir.dtypes import DataType
from . import kernel_ir as K
from .reduction_kernels import TX, TY
from .reduction_lowering import ReductionLowering, _and, _c, _guard, _lane_dependent


class OuterKernel(ReductionLowering):
    LANE_WELFORD = True

    def kernel_body(self) -> list:
        p, V = self.p, self.V
        self.tree_arrays = {}             # id(reduction) -> its block tree's shared arrays
        self.in_last = False              # lowering inside the last split block's branch
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
        ko += self.resize_lets()
        known: dict = {}
        for a in self.loads:
            if self.lvl[id(a.node)] == "row":
                dims = (1,) if a.mode == "bcast" else (V,)
                ko += [K.Alloc(self.buf(a), a.tv.dtype, dims),
                       *_guard(self.col_ok, [self.load_stmt(a, (), self.offset(a, self.kidx))])]
                known[id(a.node)] = _lane_dependent(self.load_value(a, self.lane_index(a, None)))
        known = self.row_values(0, known, ko)
        for q in range(len(self.plans)):
            known = self.one_pass(q, known, ko)
        if self.shared:
            ko.append(K.Sync())
        cb.append(K.Loop("ko", K.Special("blockIdx.y"), K.Var("nko"), K.Special("gridDim.y"), "grid",
                         ko, "other kept groups"))
        body.append(K.Loop("cb", K.Special("blockIdx.x"), K.Var("ncb"), K.Special("gridDim.x"),
                           "grid", cb, "column blocks"))
        return body

    # ---- hooks of the pass driver ---------------------------------------------------------------
    def step_expr(self, step, streamed: bool):
        p = self.p
        if streamed:
            it = K.Var("it")
            if p.splits > 1:
                it = K.add(K.mul(it, _c(p.splits)), K.Special("blockIdx.z"))
            step = K.add(K.mul(it, _c(p.unroll)), step)
        return K.add(K.mul(step, _c(p.bdimy)), TY)

    def position(self, r):
        inner: list = []
        ridx = self.decompose(K.Var("r"), self.rg, inner)
        idx = dict(self.kidx)
        idx.update(ridx)
        return ([K.Let("r", "nidx_t", r)], _and(self.col_ok, K.Bin("<", K.Var("r"), K.Var("nr"))),
                inner, idx)

    def wrap_streamed(self, loop) -> list:
        return [loop]

    def row_values(self, q, known, out) -> dict:
        """Per-column values (lanes) existing from pass q on, kept in [V] arrays, and the
        reduced outputs among them (written by threadIdx.y 0; split over blockIdx.z, by block
        0 of the splits before the grid combine, by the last block after it: every block
        computes them alike, and two blocks storing one element race)."""
        nodes = self.row_nodes(q)
        known = dict(known)
        computed = [n for n in nodes if n.kind not in ("set", "alias")]
        if computed:
            lanes: list = []
            vals = self.lane_values(nodes, known, None, None, lanes, self.kidx)
            for n in computed:
                arr = self.names[id(n)] + "_c"
                out.append(K.Alloc(arr, n.tv.dtype.compute if n.tv.dtype.is_reduced_float
                                   else n.tv.dtype, (self.V,)))
                lanes.append(K.Assign(arr, (K.Var("v"),), vals[id(n)]))
            out.append(self.lanes(lanes))
            for n in computed:
                known[id(n)] = _lane_dependent(K.ArrayRef(self.names[id(n)] + "_c", (K.Var("v"),)))
        for n in nodes:
            if n.kind in ("set", "alias"):
                known[id(n)] = known[id(n.args[0])]
        out += self.sync_before_inplace(q)
        for a in self.stores:
            if self.lvl[id(a.node)] == "row" and self.avail[id(a.node)] == q:
                value = known[id(a.node)]
                value = value(None, None) if callable(value) else value
                inside, after = self.store_stmts(a, value, self.offset(a, self.kidx), True)
                st = [K.Alloc(f"T{a.tv.number}_w", a.tv.dtype, (self.V,)), self.lanes(inside)] + after
                z0 = K.Bin("==", K.Special("blockIdx.z"), _c(0)) \
                    if self.p.splits > 1 and not self.in_last else None
                out += _guard(_and(self.col_ok, K.Bin("==", TY, _c(0)), z0,
                                   self.owner(a, self.kidx)), st)
        return known

    def bind_results(self, e, partial, out) -> dict:
        return {k: _lane_dependent(v) for k, v in self.result_exprs(e, partial).items()}

    def combine(self, reds, out) -> tuple:
        """The bdimy partials of every column meet in shared memory (a tree), then, with splits,
        the blocks' partials in a workspace (combine_grid); {id(e): partial exprs of lane v}."""
        p = self.p
        if not reds:
            return {}, out
        if p.bdimy == 1:
            names = {id(e): self.acc_names(e) for e in reds}
        else:
            names = self.combine_block(reds, out)
        if p.splits > 1:
            names, out = self.combine_grid(reds, names, out)
        return {id(e): [K.ArrayRef(n, (K.Var("v"),)) for n in names[id(e)]] for e in reds}, out

    def combine_block(self, reds, out, src=None, suffix="_res") -> dict:
        """The bdimy rows' partials of every column (the accumulators, or `src`: {id(e): names
        of V-lane arrays}) meet in a shared-memory tree; {id(e): names of the results, the tree
        arrays' names + `suffix`}. The tree arrays are allocated once (`self.tree_arrays`) and
        serve a later tree again (the grid combine's, after barriers): a block of bfloat16
        Welford triples would not fit 48 KB of shared memory twice."""
        p, V = self.p, self.V
        src = src or {id(e): self.acc_names(e) for e in reds}
        assert p.bdimy & (p.bdimy - 1) == 0, "the block tree needs a power-of-two bdimy"
        # lane v of thread tx at v * bdimx + tx: for each lane the warp's 32 threads touch 32
        # consecutive words (tx * V + v was a V-way bank conflict on every access of the tree)
        col = K.add(K.mul(K.Var("v"), _c(p.bdimx)), TX)
        sms, writes = {}, []
        for e in reds:
            if id(e) not in self.tree_arrays:
                self.tree_arrays[id(e)] = []
                for dt in self.comb.dtypes(e):
                    sm = self.comb.fresh("red")
                    self.shared.append(K.Alloc(sm, dt, (p.bdimy, p.bdimx * V), "shared"))
                    self.tree_arrays[id(e)].append(sm)
            sms[id(e)] = self.tree_arrays[id(e)]
            for n, sm in zip(src[id(e)], sms[id(e)]):
                writes.append(K.Assign(sm, (TY, col), K.ArrayRef(n, (K.Var("v"),))))
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
        results, reads = {}, []
        for e in reds:
            res = []
            for sm, dt in zip(sms[id(e)], self.comb.dtypes(e)):
                name = sm + suffix
                out.append(K.Alloc(name, dt, (V,)))
                reads.append(K.Assign(name, (K.Var("v"),), K.ArrayRef(sm, (_c(0), col))))
                res.append(name)
            results[id(e)] = res
        out.append(self.lanes(reads))
        return results

    def combine_grid(self, reds, results, out) -> tuple:
        """The blocks of blockIdx.z (splits of the reduced index) meet in global memory: each
        writes its partial (threadIdx.y 0, per column), fences, and counts itself in on the
        column block's semaphore; the block that arrives last (the atomic's old value is
        splits - 1) reads the partials, row ty of the block those of z = ty, ty + bdimy, ...
        in z order, meets its other rows in the shared-memory tree, goes on with the results
        (row 0) and sets the semaphore back to 0 (so a semaphore buffer can serve the next
        launch on the same stream). No float atomics: the combination order is fixed. Returns
        (result arrays, where the rest of the pass goes: inside that last block's branch)."""
        p, V = self.p, self.V
        zero = _c(0)
        first = _and(K.Bin("==", TX, zero), K.Bin("==", TY, zero))
        sem_at = K.add(K.mul(K.Var("ko"), K.Var("ncb")), K.Var("cb"))
        part_at = lambda z: K.add(K.mul(K.add(K.mul(K.Var("ko"), _c(p.splits)), z),  # noqa: E731
                                        K.Var("cols")), K.Var("col"))
        writes, names = [], {}
        for e in reds:
            names[id(e)] = []
            for n, dt in zip(results[id(e)], self.comb.dtypes(e)):
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
        branch: list = [K.Fence()]
        accs = {}
        for e in reds:
            accs[id(e)] = []
            for ws, dt in names[id(e)]:
                branch.append(K.Alloc(ws + "_acc", dt, (V,)))
                accs[id(e)].append(ws + "_acc")
            branch.append(self.lanes([K.Assign(n, (K.Var("v"),), init)
                                      for n, init in zip(accs[id(e)], self.comb.identity(e))]))
        zloop: list = []
        for e in reds:
            tmp = []
            for ws, dt in names[id(e)]:
                zloop += [K.Alloc(ws + "_z", dt, (V,)),
                          K.Load(ws + "_z", (), ws, part_at(K.Var("z")), V, None, "cg")]
                tmp.append(ws + "_z")
            merge: list = []
            new = self.comb.combine(e, [K.ArrayRef(n, (K.Var("v"),)) for n in accs[id(e)]],
                                    [K.ArrayRef(t, (K.Var("v"),)) for t in tmp], merge)
            self.comb.assign_all(e, accs[id(e)], (K.Var("v"),), new, merge)
            zloop.append(self.lanes(merge))
        # every row of the block takes every bdimy-th partial (a chain of splits / bdimy loads
        # a thread, not splits), then the rows meet in the shared-memory tree: a fixed order
        branch += _guard(self.col_ok, [K.Loop("z", TY, _c(p.splits), _c(p.bdimy), "serial", zloop,
                                              "this row's partials in order")])
        final = self.combine_block(reds, branch, accs, "_all") if p.bdimy > 1 else accs
        rest: list = []
        reset = [K.Alloc("sem_zero", DataType.Int32, (1,)), K.Assign("sem_zero", (zero,), zero),
                 K.Store(sem, sem_at, "sem_zero", (), 1)]
        branch += _guard(_and(self.col_ok, K.Bin("==", TY, zero)), rest)
        branch.append(K.If(first, reset))  # the semaphore is left zero for the next launch
        out.append(K.If(K.ArrayRef(last, ()), branch))
        self.in_last = True
        return final, rest                     # the pass goes on in the last block
