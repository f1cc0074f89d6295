"""The inner kernel shape of the reduction family (the shared pass driver is reduction_lowering;
the outer shape is reduction_outer.py).

Inner (reduced axes innermost): a team of bdimx threads per row, bdimy rows a block (or, for
rows too long for a block, a cluster of blocks per row):
    for rb (grid-stride over row blocks):  row = rb * bdimy + ty; row_ok = row < rows (none
      where the plan is `full`: every row and position in bounds, no check)
      row-level loads and values; passes: position j = ((s * C + rank) * bdimx + tx) * V
      (persistent; C blocks of cluster rank `rank`) or ((it * U + u) * bdimx + tx) * V (streamed;
      with outer reduced groups j runs over them too, split by div/mod once per vector);
      after each pass the lanes, then the team (xor shuffles, shared memory past a warp), then
      the cluster (distributed shared memory) combine; reduced outputs are written by
      threadIdx.x 0 of the row's team (of rank 0)
      __syncthreads / cluster barrier (shared memory is reused by the next row; with
      $PYFUSER_RED_SPLIT_CLUSTER=1 the wait half of a barrier whose arrive follows the combine;
      with ReductionParams.push, pushed partials and mbarriers: reduction_cluster_push.py)
With ReductionParams.prefetch (staged cluster rows, a capped grid) a row's staged copies are
issued before the loop for the cluster's first row and, for each next row, at the end of the
row before it (before its cluster barrier), so they are in flight across that barrier.
"""
from __future__ import annotations

import os

from ..ir import exprs as E
from ..ir.dtypes import DataType
from . import kernel_ir as K
from .kernel_ir_rename import Rename, defined_names
from .reduction_cluster_push import ClusterPush, pushable
from .reduction_lowering import ReductionLowering, _and, _c, _guard

TX, TY = K.Special("threadIdx.x"), K.Special("threadIdx.y")
WARP = 32


class InnerKernel(ClusterPush, ReductionLowering):
    LANE_WELFORD = False
    cluster_arrived = False       # a combine's split cluster barrier has arrived, not yet waited

    def kernel_body(self) -> list:
        p, V = self.p, self.V
        self.rin = self.rg[-1] if self.rg else None
        self.rout = self.rg[:-1]
        body = [K.Let("rows", "nidx_t", self._prod(self.kg)),
                K.Let("rlen", "nidx_t", K.Var(f"e{self.rin}") if self.rin is not None else _c(1))]
        self.rtot = K.Var("rlen")
        # pushed, unless a per-row input is written in place (a training batch norm's running
        # statistics): the cluster barrier orders every block's read of it before rank 0's
        # write; pushes would order them only through the chain of mbarrier waits, which the
        # interpreter's global race check does not follow
        self.push = p.cluster > 1 and getattr(p, "push", False) and not self.inplace and \
            all(pushable(self.comb.dtypes(e)) for plan in self.plans for e in plan[0])
        if self.rout:                # outer reduced groups: one linear index over all of them
            body += [K.Let("nro", "nidx_t", self._prod(self.rout)),
                     K.Let("rtot", "nidx_t", K.mul(K.Var("rlen"), K.Var("nro")))]
            self.rtot = K.Var("rtot")
        if not p.persistent:
            chunk = p.bdimx * p.unroll * V
            body.append(K.Let("niter", "nidx_t", K.Bin("/", K.add(self.rtot, _c(chunk - 1)),
                                                       _c(chunk))))
        rb: list = [K.Let("row", "nidx_t", K.add(K.mul(K.Var("rb"), _c(p.bdimy)), TY))]
        self.row_ok = None                # p.full / p.fence: every row of every row block exists
        if not (p.full or getattr(p, "fence", False)):
            rb.append(K.Let("row_ok", "bool", K.Bin("<", K.Var("row"), K.Var("rows"))))
            self.row_ok = K.Var("row_ok")
        self.kidx = self.decompose(K.Var("row"), self.kg, rb)
        rb += self.resize_lets()
        row_lets = list(rb)                   # the row's indices, computed from rb alone
        self.prefetched = []                  # ReductionParams.prefetch: the staged copies
        known: dict = {}
        for a in self.loads:
            if self.lvl[id(a.node)] == "row":
                rb += [K.Alloc(self.buf(a), a.tv.dtype, (1,)),
                       *_guard(self.row_ok, [self.load_stmt(a, (), self.offset(a, self.kidx))])]
                known[id(a.node)] = self.load_value(a, (_c(0),))
        known = self.row_values(0, known, rb)
        for q in range(len(self.plans)):
            known = self.one_pass(q, known, rb)
        nrb = K.Bin("/", K.add(K.Var("rows"), _c(p.bdimy - 1)), _c(p.bdimy))
        start, step = K.Special("blockIdx.x"), K.Special("gridDim.x")
        if p.cluster > 1:                           # a cluster of blocks per row
            start, step = K.Bin("/", start, _c(p.cluster)), K.Bin("/", step, _c(p.cluster))
        first: list = []
        if self.prefetched:          # this row's copies were issued by the row before (or first)
            first = self.copies_for("rb_first", start, row_lets)
            rb += self.copies_for("rb_next", K.add(K.Var("rb"), step), row_lets)
        if self.push and self.push_bars:      # pushed combines: no cluster barrier in the row
            rb += self.push_row_end(K.Bin("<", K.add(K.Var("rb"), step), K.Var("nrb")))
            first = self.push_prologue() + first
        elif p.cluster > 1:          # the next row rewrites what others read (the wait half of
            rb.append(K.ClusterSync("wait" if self.cluster_arrived else "sync"))  # the combine's)
            self.cluster_arrived = False
        elif self.shared:
            rb.append(K.Sync())                   # the next row block rewrites shared memory
        body += [K.Let("nrb", "nidx_t", nrb), *first,
                 K.Loop("rb", start, K.Var("nrb"), step, "grid", rb,
                        "row blocks" + (" (one per cluster)" if p.cluster > 1 else ""))]
        return body

    def warp0_tail(self, q: int) -> bool:
        """The last pass of a kernel whose outputs are all row values (a pure reduction: a
        sum, var_mean, cross-entropy's row pass), with a team past a warp in one block: the
        reads of the warps' partials after the block barrier, the row's results and its stores
        run in warp 0 alone, whose thread 0 writes them; the other warps (7 of 8 in a row of
        256 threads) skip the nw - 1 merges every thread did, each an online pair's two
        exponentials or a Welford division. The same merges in the same order: the same bits."""
        p = self.p
        return (q == len(self.plans) - 1 and p.bdimx > WARP and p.cluster == 1 and
                not self.inplace and not self.kept and
                all(self.lvl[id(a.node)] == "row" for a in self.stores))

    def copies_for(self, var: str, rb_expr, row_lets) -> list:
        """The staged copies of row block `rb_expr` (when it exists), under names of their own
        (`var` for rb, `_<var>` after every name the row's lets and the copies define): issued
        before the loop for a cluster's first row, at the end of each row for the next one.
        Each thread's copies land in the slots it has just read for the last time (a thread
        reads back only what it copied), and the next row waits for them (AsyncWait)."""
        stmts = row_lets + self.prefetched
        names = defined_names(stmts)
        ren = Rename(lambda n: var if n == "rb" else (f"{n}_{var}" if n in names else n))
        return [K.Let(var, "nidx_t", rb_expr),
                K.If(K.Bin("<", K.Var(var), K.Var("nrb")), ren.block(stmts))]

    # ---- hooks of the pass driver ---------------------------------------------------------------
    def step_expr(self, step, streamed: bool):
        p = self.p
        if streamed:
            step = K.add(K.mul(K.Var("it"), _c(p.unroll)), step)
        elif p.cluster > 1:                         # the blocks of the cluster interleave steps
            step = K.add(K.mul(step, _c(p.cluster)), K.Special("cluster_rank"))
        return K.mul(K.add(K.mul(step, _c(p.bdimx)), TX), _c(self.V))

    def position(self, j):
        """Position j along the row; with outer reduced groups j runs over all of them (a
        vector never straddles the inner group: V divides its extent) and is split into the
        inner index and the outer groups' indices."""
        idx = dict(self.kidx)
        full = self.p.full                    # every position in bounds: no check
        fence = None                          # ... but a branch on a uniform, true condition
        if getattr(self.p, "fence", False):   # (ReductionParams.fence)
            full, fence = True, K.Bin("<", _c(0), K.Var("rlen"))
        if not self.rout:
            if self.rin is not None:
                idx[self.rin] = K.Var("j")
            return ([K.Let("j", "nidx_t", j)],
                    fence if full else _and(self.row_ok, K.Bin("<", K.Var("j"), K.Var("rlen"))),
                    [], idx)
        inner = [K.Let("j", "nidx_t", K.Bin("%", K.Var("jl"), K.Var("rlen")))]
        idx.update(self.decompose(K.Bin("/", K.Var("jl"), K.Var("rlen")), self.rout, inner))
        idx[self.rin] = K.Var("j")
        return ([K.Let("jl", "nidx_t", j)],
                fence if full else _and(self.row_ok, K.Bin("<", K.Var("jl"), self.rtot)),
                inner, idx)

    def wrap_streamed(self, loop) -> list:
        return [loop]

    def row_values(self, q, known, out) -> dict:
        """Row-level values existing from pass q on, and the reduced outputs among them."""
        known = self.emit_nodes(self.row_nodes(q), known, None, out, (self.kidx, None))
        for den in self.g.shifted_quotients.values():    # softmax's sum: its reciprocal once
            if id(den) in known and id(den) not in self.rcps:
                y, ys, ds = (self.comb.fresh(stem) for stem in ("rcp", "rcps", "dens"))
                dt, d = den.tv.dtype, known[id(den)]
                assert dt is DataType.Float, "shifted quotients are float only"
                out += [K.Let(y, "float", K.Op("reciprocal", (d,), dt)),
                        K.Let(ys, "float", K.Op("mul", (K.Var(y), K.Const(2.0 ** -64, "float", dt)),
                                                dt)),
                        K.Let(ds, "float", K.Op("mul", (d, K.Const(2.0 ** 64, "float", dt)), dt))]
                self.rcps[id(den)] = (K.Var(y), K.Var(ys), K.Var(ds))
        writer = _and(self.row_ok, K.Bin("==", TX, _c(0)))
        if self.p.cluster > 1:
            writer = _and(writer, K.Bin("==", K.Special("cluster_rank"), _c(0)))
        out += self.sync_before_inplace(q)
        for a in self.stores:
            if self.lvl[id(a.node)] == "row" and self.avail[id(a.node)] == q:
                st, _ = self.store_stmts(a, known[id(a.node)], self.offset(a, self.kidx), False)
                out += _guard(_and(writer, self.owner(a, self.kidx)), st)
        return known

    def bind_results(self, e, partial, out) -> dict:
        """The row's results as Lets (one value per row, the same in the whole team)."""
        res = self.result_exprs(e, partial)
        known = {}
        for node in self.g.nodes:
            if id(node) in res:
                name = self.names[id(node)]
                out.append(K.Let(name, K.REGISTER_CTYPE[node.tv.dtype], res[id(node)]))
                known[id(node)] = K.Var(name)
        return known

    def partial_names(self, e) -> list:
        if self.chunked(e):                   # Welford, online pairs: one partial a thread
            return self.acc_names(e)
        return [f"r{self.g.reduces.index(e)}"]

    def combine(self, reds, out) -> tuple:
        """Lanes in order, then the team: xor shuffles within the warp (from bdimx / 2 down to
        1), then, past a warp, the warps' partials in shared memory (combine_threads: Welford
        statistics merged as a tree in every warp, the others read in order). Every thread of
        the team ends with the row's result."""
        p = self.p
        for e in reds:
            if self.chunked(e):
                continue
            (acc,) = self.acc_names(e)
            (r,) = self.partial_names(e)
            out += [K.Alloc(r, self.comb.dtypes(e)[0], ()), K.Assign(r, (), K.ArrayRef(acc, (_c(0),)))]
            for v in range(1, self.V):
                new = self.comb.combine(e, [K.ArrayRef(r, ())], [K.ArrayRef(acc, (_c(v),))], out)
                out.append(K.Assign(r, (), new[0]))
        partials = {id(e): [K.ArrayRef(n, ()) for n in self.partial_names(e)] for e in reds}
        if not reds:
            return partials, out
        self.combine_threads(reds, out)
        if p.cluster > 1 and self.push:
            self.combine_cluster_push(reds, out)
        elif p.cluster > 1:
            self.combine_cluster(reds, out)
        return partials, out

    def combine_cluster(self, reds, out) -> None:
        """The blocks of the row's cluster: each block's partial in its shared memory (a buffer
        per combine), a cluster barrier; then warp 0 combines the C ranks' partials as a tree:
        lane r < C reads rank r's partial from distributed shared memory (one remote load a
        lane, all in flight together, where a chain of C loads and combines waited for each
        load in turn), xor shuffles from C / 2 down to 1 combine them (C a power of two: lanes
        below C pair among themselves), lane 0 writes the result to shared memory, and after a
        block barrier every thread reads it. Every block of the cluster runs the same tree on
        the same partials: the same result. A cluster barrier at the end of the row orders
        the remote reads before the next row's writes (and keeps a block from exiting while
        another reads its shared memory). `$PYFUSER_RED_SPLIT_CLUSTER=1` splits it: each block
        arrives once it has read the combined result and waits at the end of the row (or
        before its next combine), so a block writes its share of the row without waiting for
        the cluster's slowest block to finish writing. Measured and left off (H200, rows of
        65536: softmax float32 5% faster, rms_norm float32 5% and softmax bfloat16 3% slower,
        docs/reductions.md)."""
        p = self.p
        assert p.bdimx >= WARP and p.cluster <= WARP and p.cluster & (p.cluster - 1) == 0, \
            "a cluster combine needs a team of a warp or more and a power-of-two cluster"
        first = _and(K.Bin("==", TX, _c(0)), K.Bin("==", TY, _c(0)))
        writes, own, gather, tree, results, reads = [], [], [], [], [], []
        for e in reds:
            names = self.partial_names(e)
            dts = self.comb.dtypes(e)
            tmps = []
            for n, dt in zip(names, dts):
                sm, res, t = self.comb.fresh("cred"), self.comb.fresh("cres"), self.comb.fresh("crk")
                self.shared += [K.Alloc(sm, dt, (), "shared"), K.Alloc(res, dt, (), "shared")]
                writes.append(K.Assign(sm, (), K.ArrayRef(n, ())))
                own += [K.Alloc(t, dt, ()), K.Assign(t, (), K.ArrayRef(n, ()))]
                gather.append(K.Assign(t, (), K.RemoteRef(sm, (), TX)))
                results.append(K.Assign(res, (), K.ArrayRef(t, ())))
                reads.append(K.Assign(n, (), K.ArrayRef(res, ())))
                tmps.append(t)
            m = p.cluster // 2
            while m >= 1:
                self.shuffle_step(e, tmps, m, tree, "cshf")
                m //= 2
        warp0 = [K.If(K.Bin("<", TX, _c(p.cluster)), gather)] + tree + \
            [K.If(K.Bin("==", TX, _c(0)), results)]
        wait = [K.ClusterSync("wait")] if self.cluster_arrived else []   # the last combine's
        split = os.environ.get("PYFUSER_RED_SPLIT_CLUSTER") == "1"
        out += wait + [K.If(first, writes), K.ClusterSync()] + own + \
            [K.If(K.Bin("<", TX, _c(WARP)), warp0), K.Sync()] + reads + \
            ([K.ClusterSync("arrive")] if split else [])
        self.cluster_arrived = split

    def equal_counts(self) -> bool:
        """Every thread of a row holds as many elements (the plan's `whole`), so partials met
        pairwise in a tree (shuffle rounds, the warps' and the ranks' trees) count alike.
        PYFUSER_RED_EQUAL_MERGE=0 divides by the counts anyway (A/B timing)."""
        if os.environ.get("PYFUSER_RED_EQUAL_MERGE") == "0":
            return False
        return bool(getattr(self.p, "whole", False))

    def shuffle_step(self, e, names, m: int, out, stem: str = "shf", lane=None) -> None:
        """One xor-shuffle round of reduction e's partials `names` (scalar arrays): each lane
        combines its partial with that of lane ^ m, its own first; or, given its `lane` index,
        both lanes of a pair combine (lower lane's partial, upper lane's) in that order, so both
        hold the same bits (a Welford merge is not symmetric in its operands)."""
        upper = None
        if lane is not None:
            upper = self.comb.fresh("up")
            out.append(K.Let(upper, "bool", K.Bin("!=", K.Bin("&", lane, _c(m)), _c(0))))
        first, second = [], []
        for n, dt in zip(names, self.comb.dtypes(e)):
            t = self.comb.fresh(stem)
            ct = K.REGISTER_CTYPE[dt]
            own, other = K.ArrayRef(n, ()), K.Var(t)
            out.append(K.Let(t, ct, K.Shfl(own, m, dt)))
            if upper is None:
                first.append(own)
                second.append(other)
                continue
            a, b = self.comb.fresh("tlo"), self.comb.fresh("thi")
            out += [K.Let(a, ct, K.Op("where", (K.Var(upper), other, own), dt)),
                    K.Let(b, ct, K.Op("where", (K.Var(upper), own, other), dt))]
            first.append(K.Var(a))
            second.append(K.Var(b))
        new = self.comb.combine(e, first, second, out, equal=self.equal_counts())
        self.comb.assign_all(e, names, (), new, out)

    def combine_threads(self, reds, out) -> None:
        """Within the warp, xor shuffles from min(bdimx, 32) / 2 down to 1; past a warp, lane 0
        of each of the nw warps writes its partial to shared memory and, after a block barrier,
        every thread reads the nw partials in order, except Welford statistics of rows staged
        in shared memory, which every warp merges as a tree: lane l reads partial l % nw and
        ordered xor shuffles from nw / 2 down to 1 merge them (each group of nw lanes holds
        them in the same places, so every lane of every warp ends with the same bits: the
        tree's, in warp order). log2(nw) merges a thread where the order took nw - 1 (a
        Welford merge divides: 7 -> 3 of them for a row of 8 warps; H200, layer_norm
        1024x65536 165.2 -> 160.4 µs float32, 95.8 -> 94.0 bfloat16). The tree takes ~8
        registers more: a row held in registers can lose a block an SM (batch_norm training
        32x256x56x56 float32: 80 -> 88 registers, 3 -> 2 blocks, 84 -> 99 µs), so those rows
        read in order. A sum's or an online pair's merge is cheaper than the tree's shuffles
        and selects (sum(-1), softmax: even or 1-2% slower as a tree), so those read in order.
        PYFUSER_RED_WARP_TREE=0 reads Welford statistics in order everywhere, =1 merges them
        as a tree everywhere."""
        p = self.p
        if p.bdimx == 1:
            return
        m = min(p.bdimx, WARP) // 2
        while m >= 1:
            for e in reds:
                self.shuffle_step(e, self.partial_names(e), m, out)
            m //= 2
        if p.bdimx <= WARP:
            return
        nw = p.bdimx // WARP
        assert nw & (nw - 1) == 0, "a team past a warp is a power-of-two number of warps"
        lane = K.Bin("%", TX, _c(WARP))
        lane0 = K.Bin("==", lane, _c(0))
        warp = K.Bin("/", TX, _c(WARP))
        knob = os.environ.get("PYFUSER_RED_WARP_TREE")
        in_order = knob == "0" or (knob != "1" and not getattr(p, "stage", False))
        writes, reads = [], []
        for e in reds:
            names = self.partial_names(e)
            sms = []
            for n, dt in zip(names, self.comb.dtypes(e)):
                sm = self.comb.fresh("red")
                self.shared.append(K.Alloc(sm, dt, (p.bdimy, nw), "shared"))
                writes.append(K.Assign(sm, (TY, warp), K.ArrayRef(n, ())))
                sms.append(sm)
            if not in_order and isinstance(e, E.WelfordOp):
                src = K.Bin("%", lane, _c(nw))
                for n, sm in zip(names, sms):
                    reads.append(K.Assign(n, (), K.ArrayRef(sm, (TY, src))))
                m = nw // 2
                while m >= 1:
                    self.shuffle_step(e, names, m, reads, "tshf", lane)
                    m //= 2
                continue
            for n, sm in zip(names, sms):        # other reductions: read in order
                reads.append(K.Assign(n, (), K.ArrayRef(sm, (TY, _c(0)))))
            for w in range(1, nw):
                new = self.comb.combine(e, [K.ArrayRef(n, ()) for n in names],
                                        [K.ArrayRef(sm, (TY, _c(w))) for sm in sms], reads)
                self.comb.assign_all(e, names, (), new, reads)
        out += [K.If(lane0, writes), K.Sync()] + reads
