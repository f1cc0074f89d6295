"""Lowering of the inner_outer_persistent schedule: row reductions and column sums, one kernel.

The kernel (a layer norm's backward: dx, and dweight / dbias summed over the rows):

    acc_o[steps][V] = 0                    per column sum o, in registers, for the whole kernel
    for rb (grid-stride over row blocks):  the inner-persistent kernel (reduction_kernels.
        InnerKernel): a team of bdimx threads holds its row (steps vectors of V a thread), the
        row sums, then dx, written from registers; in the pass that computes a column sum's
        input (dy * x_hat, dy) the thread adds it to acc_o of the same columns
    teams of the block: a halving tree in shared memory (teams [s, 2s) hand their partials to
        teams [0, s)); team 0 writes the block's partial row to the workspace ws_o[block][col]
    __threadfence; __syncthreads; one thread: pos = atomicAdd(sem[0], 1) (arrival order)
    the last F blocks to arrive (F = min(blocks, column vectors, finishers <= SMs)) finish:
        one thread spins until sem[0] == blocks, fence; block pos - (blocks - F) takes the
        column vectors [c0, c1) of its share: threads (fy, fx) = (tid / FX, tid % FX), each sums
        ws_o[z][col] for z = fy, fy + FY, ... (loads cached in L2 only), the FY threads of a
        column meet in a halving tree in shared memory, fy == 0 computes what follows the sums
        (casts to the weight's dtype) and stores dweight / dbias;
        then each counts itself done on sem[1]; the last resets sem[0] and sem[1] to 0 (the
        runtime zeroes the semaphores once; every launch leaves them zero).

Why this combine (H100, layer norm backward of 4096 x 768 and 8192 x 3072): the row part moves
3 x rows x H elements (dy, x in; dx out) at the bandwidth limit, 13 to 100 us; the partials are
blocks x H floats per sum (about 2 per SM: 264 x 3072 x 4 B = 3.2 MB for 8192 x 3072). One last
block reading them all runs on one SM at a small fraction of the bandwidth (about 30 us for
8192 x 3072: a third of the kernel); shared by up to an SM count of blocks, every column is
summed in parallel from L2 and the tail is the spin plus about one L2 round trip per block's
share (a few us). Only the last F blocks to arrive wait, and F <= SMs: while a waiting block
spins, fewer than F blocks have not arrived, and at least one block of this kernel fits each SM,
so the blocks still to come always find a free slot (no deadlock, whatever the occupancy or
what else runs on the GPU). Deterministic: each block's partial row sums its rows in a fixed
order, the tree and the z order of the finish are fixed by the plan and the grid; which block
finishes which columns does not change any sum. No floating-point atomics.

The workspace buffers come from the runtime like the outer grid reduction's
(reduction_launch.workspace_fn): "partials" (any contents) and "semaphores" (zero before a
launch, left zero by it). The CPU interpreter runs the whole grid at once for this kernel
(interpreter.py: a WaitCount), so arrival is in block order there.
"""
from __future__ import annotations

from ..ir.dtypes import DataType
from ..schedule import layout as L
from . import kernel_ir as K
from .kernel import LaunchConfig
from .reduction_kernels import TX, TY, InnerKernel
from .reduction_launch import _check_cover
from .reduction_lowering import MAX_GRID_X, _and, _c, _guard

NB = K.Special("gridDim.x")


class InnerOuterKernel(InnerKernel):
    def __init__(self, sched):
        super().__init__(sched)
        self.io = sched.io
        self.col_loads = [a for a in sched.col_accesses if not a.is_store]
        self.col_stores = [a for a in sched.col_accesses if a.is_store]
        self.outer_in = {id(e): n for e, n in zip(self.io.outer, self.io.outer_inputs)}

    def oacc(self, i) -> str:
        return f"oacc{i}"

    # ---- the kernel ---------------------------------------------------------------------------
    def build(self, name: str) -> K.Kernel:
        for a in sorted(self.s.accesses + self.s.col_accesses, key=lambda a: a.seg):
            self.ptr(a)
        for gi in range(len(self.p.groups)):
            self.prologue.append(K.Let(f"e{gi}", "nidx_t", self.group_extent(gi)))
        body = self.kernel_body()
        body = self.shared + self.prologue + body
        return K.Kernel(name, self.params(), self.tensors, self.it, (self.p.bdimx, self.p.bdimy, 1),
                        body)

    def kernel_body(self) -> list:
        p, V = self.p, self.V
        init = []
        for i, e in enumerate(self.io.outer):
            (ident,) = self.comb.identity(e)
            init += [K.Alloc(self.oacc(i), self.comb.dtypes(e)[0], (p.steps, V)),
                     self.unroll("s", p.steps, [self.lanes([K.Assign(self.oacc(i), (K.Var("s"), K.Var("v")), ident)])])]
        rows = super().kernel_body()
        assert not self.rout, "one normalized group (the run check)"
        return init + rows + self.block_partials() + self.arrive() + self.finish()

    # ---- the row passes: InnerKernel's step, plus the column sums' inputs -----------------------
    def warp0_tail(self, q: int) -> bool:
        """Every warp holds column partials it adds to the block's after the rows: the row's
        results stay in every thread (InnerKernel.warp0_tail)."""
        return False

    def pass_plan(self, q):
        """InnerKernel's plan of pass q; a column sum whose input this pass computes counts as
        one more thing the pass writes ((None, node): no store), so that a pass doing nothing
        else (the sums of x - rowsum) still runs."""
        reds, outs, full, inputs = super().pass_plan(q)
        outs = outs + [(None, n) for n in self.s.io.outer_inputs if self.g.avail[id(n)] == q]
        return reds, outs, full, inputs

    def step_extra(self, q, step, vals, lanes: list) -> None:
        """The column sums' inputs this pass computes, added to the thread's per-column
        accumulators (InnerKernel.step_body does the rest of the step; the kernel is always
        persistent)."""
        for i, e in enumerate(self.io.outer):
            n = self.outer_in[id(e)]
            if self.avail[id(n)] != q:
                continue
            dt = self.comb.dtypes(e)[0]
            x = vals[id(n)]
            x = x if n.tv.dtype.compute is dt else K.Convert("cast", x, n.tv.dtype, dt)
            at = (step, K.Var("v"))
            new = self.comb.combine(e, [K.ArrayRef(self.oacc(i), at)], [x], lanes)
            lanes.append(K.Assign(self.oacc(i), at, new[0]))

    # ---- the block's partial row ----------------------------------------------------------------
    def block_partials(self) -> list:
        """Teams [s, 2s) hand their partials to teams [0, s) through shared memory (s = bdimy/2,
        ..., 1); team 0 writes the block's partial row to the workspaces."""
        p, V = self.p, self.V
        out: list = []
        s_, v_ = K.Var("s"), K.Var("v")
        cols = p.steps * p.bdimx * V
        col = K.add(K.mul(K.add(K.mul(s_, _c(p.bdimx)), TX), _c(V)), v_)
        sms = []
        if p.bdimy > 1:
            for i, e in enumerate(self.io.outer):
                sm = f"osm{i}"
                self.shared.append(K.Alloc(sm, self.comb.dtypes(e)[0], (p.bdimy // 2, cols), "shared"))
                sms.append(sm)
        half = p.bdimy // 2
        while half >= 1:
            give, take = [], []
            for i, e in enumerate(self.io.outer):
                at = (s_, v_)
                give.append(K.Assign(sms[i], (K.Bin("-", TY, _c(half)), col), K.ArrayRef(self.oacc(i), at)))
                new = self.comb.combine(e, [K.ArrayRef(self.oacc(i), at)],
                                        [K.ArrayRef(sms[i], (TY, col))], take)
                take.append(K.Assign(self.oacc(i), at, new[0]))
            out += [K.If(_and(K.Bin("<=", _c(half), TY), K.Bin("<", TY, _c(2 * half))),
                         [self.unroll("s", p.steps, [self.lanes(give)])]),
                    K.Sync(),
                    K.If(K.Bin("<", TY, _c(half)), [self.unroll("s", p.steps, [self.lanes(take)])]),
                    K.Sync()]
            half //= 2
        self.ws = [self.workspace(self.comb.dtypes(e)[0], "partials") for e in self.io.outer]
        j = self.step_expr(s_, False)
        writes = [K.Let("j", "nidx_t", j)]
        st = [K.Store(ws, K.add(K.mul(K.Special("blockIdx.x"), K.Var("rlen")), K.Var("j")),
                      self.oacc(i), (s_,), V) for i, ws in enumerate(self.ws)]
        writes += _guard(K.Bin("<", K.Var("j"), K.Var("rlen")), st)
        out.append(K.If(K.Bin("==", TY, _c(0)), [self.unroll("s", p.steps, writes)]))
        return out

    # ---- arrival --------------------------------------------------------------------------------
    def arrive(self) -> list:
        """Fence the partials, count the block in; every thread learns its arrival position."""
        self.sem = self.workspace(DataType.Int32, "semaphores")
        pos = "pos_sm"
        self.shared.append(K.Alloc(pos, DataType.Int32, (), "shared"))
        first = _and(K.Bin("==", TX, _c(0)), K.Bin("==", TY, _c(0)))
        return [K.Fence(), K.Sync(),
                K.If(first, [K.AtomicAdd("arrived", self.sem, _c(0), _c(1)),
                             K.Assign(pos, (), K.Var("arrived"))]),
                K.Sync(),
                K.Let("pos", "nidx_t", K.ArrayRef(pos, ())),
                K.Let("ncv", "nidx_t", K.Bin("/", K.add(K.Var("rlen"), _c(self.V - 1)), _c(self.V))),
                K.Let("nfin", "nidx_t", self._max(_c(1), self._min(self._min(NB, K.Var("ncv")),
                                                                      _c(self.p.finishers)))),
                K.Let("first_fin", "nidx_t", K.Bin("-", NB, K.Var("nfin")))]

    def _idx_dtype(self):
        return DataType.Int32 if self.it == "int" else DataType.Int

    def _min(self, a, b):
        return K.Op("minimum", (a, b), self._idx_dtype())

    def _max(self, a, b):
        return K.Op("maximum", (a, b), self._idx_dtype())

    # ---- the finish -----------------------------------------------------------------------------
    def finish(self) -> list:
        p, V = self.p, self.V
        T = p.bdimx * p.bdimy
        FX = p.fin_x
        FY = T // FX
        first = _and(K.Bin("==", TX, _c(0)), K.Bin("==", TY, _c(0)))
        v_ = K.Var("v")
        body = [K.Let("share", "nidx_t", K.Bin("-", K.Var("pos"), K.Var("first_fin"))),
                K.Let("cw", "nidx_t", K.Bin("/", K.add(K.Var("ncv"), K.Bin("-", K.Var("nfin"), _c(1))),
                                            K.Var("nfin"))),
                K.Let("c0", "nidx_t", K.mul(K.Var("share"), K.Var("cw"))),
                K.Let("c1", "nidx_t", self._min(K.add(K.Var("c0"), K.Var("cw")), K.Var("ncv"))),
                K.Let("tid", "nidx_t", K.add(TX, K.mul(TY, _c(p.bdimx)))),
                K.Let("fx", "nidx_t", K.Bin("%", K.Var("tid"), _c(FX))),
                K.Let("fy", "nidx_t", K.Bin("/", K.Var("tid"), _c(FX))),
                K.If(first, [K.WaitCount(self.sem, _c(0), NB)]),
                K.Fence(), K.Sync()]
        col = []
        col.append(K.Let("cv", "nidx_t", K.add(K.Var("cvb"), K.Var("fx"))))
        col.append(K.Let("cv_ok", "bool", K.Bin("<", K.Var("cv"), K.Var("c1"))))
        facc = []
        zloop: list = []
        for i, e in enumerate(self.io.outer):
            dt = self.comb.dtypes(e)[0]
            (ident,) = self.comb.identity(e)
            f = f"facc{i}"
            facc.append(f)
            col += [K.Alloc(f, dt, (V,)), self.lanes([K.Assign(f, (v_,), ident)])]
            tmp = f"fz{i}"
            zloop += [K.Alloc(tmp, dt, (V,)),
                      K.Load(tmp, (), self.ws[i], K.add(K.mul(K.Var("z"), K.Var("rlen")),
                                                         K.mul(K.Var("cv"), _c(V))), V, None, "cg")]
            merge: list = []
            new = self.comb.combine(e, [K.ArrayRef(f, (v_,))], [K.ArrayRef(tmp, (v_,))], merge)
            merge.append(K.Assign(f, (v_,), new[0]))
            zloop.append(self.lanes(merge))
        col.append(K.If(K.Var("cv_ok"), [K.Loop("z", K.Var("fy"), NB, _c(FY), "serial", zloop,
                                                 "the blocks' partial rows, in order")]))
        if FY > 1:
            fcol = K.add(K.mul(K.Var("fx"), _c(V)), v_)
            sms = []
            for i, e in enumerate(self.io.outer):
                sm = f"fsm{i}"
                self.shared.append(K.Alloc(sm, self.comb.dtypes(e)[0], (FY, FX * V), "shared"))
                sms.append(sm)
            col += [self.lanes([K.Assign(sm, (K.Var("fy"), fcol), K.ArrayRef(f, (v_,)))
                                for sm, f in zip(sms, facc)]), K.Sync()]
            s = FY // 2
            while s >= 1:
                step: list = []
                for i, e in enumerate(self.io.outer):
                    sm = sms[i]
                    new = self.comb.combine(e, [K.ArrayRef(sm, (K.Var("fy"), fcol))],
                                            [K.ArrayRef(sm, (K.add(K.Var("fy"), _c(s)), fcol))], step)
                    step.append(K.Assign(sm, (K.Var("fy"), fcol), new[0]))
                col += [K.If(K.Bin("<", K.Var("fy"), _c(s)), [self.lanes(step)]), K.Sync()]
                s //= 2
            col.append(K.If(_and(K.Bin("==", K.Var("fy"), _c(0)), K.Var("cv_ok")),
                            [self.lanes([K.Assign(f, (v_,), K.ArrayRef(sm, (_c(0), fcol)))
                                         for sm, f in zip(sms, facc)])]))
        col += _guard(_and(K.Bin("==", K.Var("fy"), _c(0)), K.Var("cv_ok")), self.column_outputs(facc))
        if FY > 1:
            col.append(K.Sync())            # the next column vectors rewrite the trees
        body.append(K.Loop("cvb", K.Var("c0"), K.Var("c1"), _c(FX), "serial", col,
                           "this block's share of the column vectors"))
        zero = [K.Alloc("sem_zero", DataType.Int32, (1,)), K.Assign("sem_zero", (_c(0),), _c(0)),
                K.Store(self.sem, _c(0), "sem_zero", (), 1), K.Store(self.sem, _c(1), "sem_zero", (), 1)]
        body += [K.Sync(),
                 K.If(first, [K.AtomicAdd("done", self.sem, _c(1), _c(1)),
                              K.If(K.Bin("==", K.Var("done"), K.Bin("-", K.Var("nfin"), _c(1))), zero)])]
        return [K.If(K.Bin("<=", K.Var("first_fin"), K.Var("pos")), body)]

    def column_outputs(self, facc) -> list:
        """The column graph at column vector cv (lanes v): its loads, the sums' results, what is
        computed from them, the stores of the per-column outputs."""
        V = self.V
        idx = {self.rin: K.mul(K.Var("cv"), _c(V))} if self.rin is not None else {}
        out: list = []
        names: dict = {}
        for a in self.col_loads:
            buf = f"C{a.tv.number}_{len(names)}"
            names[id(a.node)] = buf
            dims = (1,) if a.mode == "bcast" else (V,)
            out += [K.Alloc(buf, a.tv.dtype, dims), self.load_col(a, buf, self.offset(a, idx))]
        vals: dict = {}
        lanes: list = []
        sums = {id(e): f for e, f in zip(self.io.outer, facc)}
        for n in self.io.col_nodes:
            if n.kind in ("set", "alias"):
                vals[id(n)] = vals[id(n.args[0])]
                continue
            if n.kind == "load":
                lane = _c(0) if self.col_mode(n) == "bcast" or V == 1 else K.Var("v")
                expr = K.Convert("load", K.ArrayRef(names[id(n)], (lane,)), n.tv.dtype, n.tv.dtype)
            elif n.kind == "oreduce":
                src = self.comb.dtypes(n.expr)[0]
                expr = K.ArrayRef(sums[id(n.expr)], (K.Var("v"),))
                if src is not n.tv.dtype:
                    expr = K.Convert("cast", expr, src, n.tv.dtype)
            else:
                expr = self.node_expr(n, lambda x: vals[id(x)])
            name = f"c{n.tv.number}_{len(vals)}"
            lanes.append(K.Let(name, K.REGISTER_CTYPE[n.tv.dtype], expr))
            vals[id(n)] = K.Var(name)
        after: list = []
        for a in self.col_stores:
            out.append(K.Alloc(f"T{a.tv.number}_w", a.tv.dtype, (V,)))
            inside, st = self.store_stmts(a, vals[id(a.node)], self.offset(a, idx), True)
            lanes += inside
            after += _guard(self.owner(a, idx), st)
        return out + [self.lanes(lanes)] + after

    def col_mode(self, node) -> str:
        return next(a.mode for a in self.col_loads if a.node is node)

    def load_col(self, a, buf, off):
        p = self.ptr(a)
        if a.mode == "vector":
            return K.Load(buf, (), p, off, self.V)
        if a.mode == "strided" and self.V > 1:
            inner = self.p.groups[-1][-1]
            return K.Load(buf, (), p, off, self.V, self.stride(a, a.eff[inner][1]))
        return K.Load(buf, (), p, off, 1)


# ---- plan entry points --------------------------------------------------------------------------
def _extents(sched, bindings):
    p = sched.params
    shape = bindings.shape(sched.io.ref)
    ext = [L.numel(shape[k] for k in g) for g in p.groups]
    rlen = next((x for x, r in zip(ext, p.reduced) if r), 1)
    rows = L.numel(x for x, r in zip(ext, p.reduced) if not r)
    return rows, rlen


def grid_blocks(sched, bindings) -> int:
    """Blocks of a launch: one per row block up to blocks_per_sm x SMs (the kernel grid-strides
    over row blocks); at least one, so that sums over zero rows are written (as zeros)."""
    p = sched.params
    rows, rlen = _extents(sched, bindings)
    return max(1, min(-(-rows // p.bdimy), p.max_blocks or MAX_GRID_X, MAX_GRID_X))


def plan_inner_outer_kernel(sched, name: str):
    """(kernel IR, launch_config, workspace sizes) of an inner_outer_persistent schedule."""
    low = InnerOuterKernel(sched)
    kir = low.build(name)
    sched.inplace_pairs = []
    p = sched.params
    outs = sched.fusion.outputs

    def launch_config(bindings, tensors) -> LaunchConfig:
        rows, rlen = _extents(sched, bindings)
        _check_cover(rlen, p.steps * p.bdimx * p.vec)
        block = (p.bdimx, p.bdimy, 1)
        if all(t.numel() == 0 for t in tensors[len(tensors) - len(outs):]):
            return LaunchConfig((0, 1, 1), block)
        return LaunchConfig((grid_blocks(sched, bindings), 1, 1), block)

    def workspaces(bindings, tensors):
        rows, rlen = _extents(sched, bindings)
        nb = grid_blocks(sched, bindings)
        return [(max(1, nb * rlen) if kind == "partials" else 2, dt.torch, kind)
                for _, dt, kind in low.workspaces]
    return kir, launch_config, workspaces
