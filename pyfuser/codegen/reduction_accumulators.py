"""The accumulators of a reduction-family kernel (a mixin of reduction_lowering's
ReductionLowering): their names and identities, the per-element combine of sum / prod / max /
min, the chunks of Welford statistics and online (max, sum of exp) pairs merged after a step
loop, and each reduction's result in its node's dtype.

Invariants: accumulators are per lane ([V]) except the Welford statistics and online pairs of an
inner kernel (one a thread, `LANE_WELFORD` false); a chunk's values are computed again from the
loaded registers (no copy) and merged in lane order, so results do not depend on timing.
"""
from __future__ import annotations

from ..ir import exprs as E
from ..ir.dtypes import DataType
from ..schedule import reduction_graph as RG
from . import kernel_ir as K
from .reduction_combine import COMBINE_OP, pair_sum_result, shift_exp


class Accumulators:
    """Accumulator methods; the class using it provides g, comb, plans, lvl, V, LANE_WELFORD,
    lanes, unroll, at_step, step_expr, lane_values and const (ReductionLowering, an Emitter)."""

    def acc_names(self, e) -> list:
        if isinstance(e, RG.OnlinePair):
            return [f"acc{self.g.reduces.index(x)}_0" for x in (e.max_expr, e.sum_expr)]
        i = self.g.reduces.index(e)
        return [f"acc{i}_{k}" for k in range(len(self.comb.dtypes(e)))]

    @staticmethod
    def chunked(e) -> bool:
        """Accumulated by chunks after the step loop (Welford, online pairs), not per element."""
        return isinstance(e, (E.WelfordOp, RG.OnlinePair))

    def lane_accs(self, e) -> bool:
        """Accumulators per lane ([V]) or one per thread (Welford and online pairs of an inner
        kernel)."""
        return self.LANE_WELFORD or not self.chunked(e)

    def init_accs(self, reds, out: list) -> None:
        """Allocate every accumulator of `reds` and set it to the identity."""
        for e in reds:
            lanes = self.lane_accs(e)
            for name, dt, init in zip(self.acc_names(e), self.comb.dtypes(e), self.comb.identity(e)):
                if lanes:
                    out.append(K.Alloc(name, dt, (self.V,)))
                    out.append(self.lanes([K.Assign(name, (K.Var("v"),), init)]))
                else:
                    out.append(K.Alloc(name, dt, ()))
                    out.append(K.Assign(name, (), init))

    def accumulate(self, e, val, vnode, out: list, words: list | None = None) -> None:
        """acc[v] = combine(acc[v], val) for sum / prod / max / min (Welford goes by chunks).
        A float max / min of a half / bfloat16 load read as it is, while `packing` collects
        (one_pass): two lanes a word into the accumulator's packed twin, in `words` (after the
        step's lanes loop); `packed_twins` folds the twin into acc after the step loop."""
        (name,) = self.acc_names(e)
        dt = self.comb.dtypes(e)[0]
        op = COMBINE_OP.get(e.info.name) if isinstance(e, E.ReductionOp) else None
        if words is not None and self.packing is not None and op in K.PACKED_OPS and \
                dt is DataType.Float and self.lane_accs(e):
            got = self.packed_lane(val, out)
            if got is not None:
                arr, index, sdt = got
                self.packing[id(e)] = (e, f"{name}_w", sdt)
                words.append(K.PackedOp(op, f"{name}_w", arr, index))
                return
        src = vnode.tv.dtype
        x = val if src.compute is dt else K.Convert("cast", val, src, dt)
        lane = (K.Var("v"),)
        out.append(K.Assign(name, lane, self.comb.combine(e, [K.ArrayRef(name, lane)], [x], out)[0]))

    packing = None     # one_pass: {id(e): (e, packed twin, its dtype)} while building a pass

    def packed_twins(self) -> tuple[list, list]:
        """(the twins' allocations and fills, to follow init_accs; the folds of the twins into
        their accumulators, after the step loop), of the reductions `packing` collected."""
        init, fold = [], []
        v = K.Var("v")
        for e, twin, sdt in self.packing.values():
            (name,) = self.acc_names(e)
            (ident,) = self.comb.identity(e)
            init += [K.Alloc(twin, sdt, (self.V,), packed=True), K.PackedFill(twin, ident.value)]
            x = K.Convert("load", K.ArrayRef(twin, (v,)), sdt, sdt)
            fold.append(K.Assign(name, (v,), self.comb.combine(e, [K.ArrayRef(name, (v,))], [x],
                                                               fold)[0]))
        return init, ([self.lanes(fold)] if fold else [])

    def result_exprs(self, e, partial: list) -> dict:
        """{id(reduce node): value in the node's dtype} from the final partial of e."""
        dts = self.comb.dtypes(e)
        out = {}
        if isinstance(e, RG.OnlinePair):
            vals = {id(e.max_expr): partial[0], id(e.sum_expr): pair_sum_result(*partial, dts[0])}
            for node in self.g.nodes:
                if node.kind == "reduce" and id(node.expr) in vals:
                    x, dt = vals[id(node.expr)], node.tv.dtype
                    out[id(node)] = x if dt is dts[0] else K.Convert("cast", x, dts[0], dt)
            return out
        for node in self.g.nodes:
            if node.kind != "reduce" or node.expr is not e:
                continue
            k = e.outputs.index(node.tv)
            src, x = dts[k], partial[k]
            if isinstance(e, E.WelfordOp) and k == 0:     # the mean of nothing is NaN, as eager
                n_dt = dts[2]
                x = K.Op("where", (K.Op("gt", (partial[2], K.Const(0, K.REGISTER_CTYPE[n_dt], n_dt)),
                                        n_dt), x, K.Const(float("nan"), K.REGISTER_CTYPE[src], src)), src)
            dt = node.tv.dtype
            out[id(node)] = x if src is dt else K.Convert("cast", x, src, dt)
        return out

    def chunk(self, e, q, known, step_var, nsteps, streamed, out: list) -> None:
        (self.pair_chunk if isinstance(e, RG.OnlinePair) else self.welford_chunk)(
            e, q, known, step_var, nsteps, streamed, out)

    def pair_chunk(self, e, q, known, step_var, nsteps, streamed, out: list) -> None:
        """Merge the values of online pair e's X over the step loop just run (its loads still
        in their buffers) into e's (max, sum) accumulators: the chunk's max, the new running
        max m, the running sum rescaled by exp(old max - m), plus the chunk's sum of
        exp(x - m) (per lane, then in lane order). Inner kernels: one pair a thread (the
        chunk's max over every lane); outer: a pair per lane (column)."""
        xnode = e.x
        nodes = RG.ancestors(self.g, [xnode], lambda n: self.lvl[id(n)] == "row")
        nodes = [n for n in nodes if self.lvl[id(n)] == "full"]
        dt = self.comb.dtypes(e)[0]
        per_lane = self.LANE_WELFORD
        v = K.Var("v")
        here = (v,) if per_lane else ()
        dims = (self.V,) if per_lane else ()
        acc_m, acc_s = self.acc_names(e)
        tag = self.comb.fresh("o")
        cm, cs, mn = f"{tag}_max", f"{tag}_sum", f"{tag}_m"
        cmw = f"{tag}_maxw"
        step = K.Var(step_var)
        pos = self.step_expr(step, streamed)
        ref = lambda name: K.ArrayRef(name, here)  # noqa: E731

        def value(body, idx, lane):
            x = self.lane_values(nodes, known, step, lane, body, idx)[id(xnode)]
            return x if xnode.tv.dtype.compute is dt else K.Convert("cast", x, xnode.tv.dtype, dt)

        packed: list = []     # an inner kernel's X read as it is loaded: (array, dtype)

        def add_max(idx):                                 # per lane: independent chains
            body: list = []
            x = value(body, idx, v)
            src = None if per_lane or dt is not DataType.Float else self.packed_lane(x, body)
            if src is not None:       # two lanes a word, in their 2-byte dtype (exact)
                packed.append(src[2])
                return [K.PackedOp("maximum", cmw, src[0], src[1])]
            body.append(K.Assign(cm, (v,), K.Op("maximum", (K.ArrayRef(cm, (v,)), x), dt)))
            return [self.lanes(body)]

        def add_exp(idx, finite=False):
            body: list = []
            x = value(body, idx, v)
            ex = K.Op("exp_shifted", (K.Op("sub", (x, ref(mn)), dt),), dt) if finite \
                else shift_exp(x, ref(mn), dt)
            body.append(K.Assign(cs, (v,), K.Op("add", (K.ArrayRef(cs, (v,)), ex), dt)))
            return [self.lanes(body)]

        ninf, zero = self.comb.identity(e)
        max_loop = self.unroll(step_var, nsteps, self.at_step(pos, add_max))
        if packed:
            sdt = packed[0]
            out += [K.Alloc(cmw, sdt, (self.V,), packed=True), K.PackedFill(cmw, float("-inf"))]
            lane_max = lambda lane: K.Convert("load", K.ArrayRef(cmw, (lane,)), sdt, sdt)  # noqa: E731
        else:
            out.append(K.Alloc(cm, dt, (self.V,)))
            lane_max = lambda lane: K.ArrayRef(cm, (lane,))  # noqa: E731
        out += [K.Alloc(mn, dt, dims), K.Alloc(cs, dt, (self.V,)),
                self.lanes([K.Assign(cs, (v,), zero)] +
                           ([] if packed else [K.Assign(cm, (v,), ninf)]))]
        out.append(max_loop)
        if per_lane:
            out.append(self.lanes([K.Assign(mn, here, K.Op("maximum", (ref(acc_m), ref(cm)), dt))]))
        else:                                             # the lanes' maxima, in lane order
            top = K.ArrayRef(acc_m, ())
            for lane in range(self.V):
                top = K.Op("maximum", (top, lane_max(self.const(lane))), dt)
            out.append(K.Assign(mn, (), top))
        if per_lane:
            out.append(self.unroll(step_var, nsteps, self.at_step(pos, add_exp)))
        else:
            # a finite running max (every row but one of infinities or NaN): exp(x - m) as is,
            # the same bits as shift_exp's guard (x == m gives x - m = +0; NaN stays NaN),
            # without its compare and select per element
            fin = K.Op("isfinite", (ref(mn),), dt)
            out += [K.If(fin, [self.unroll(step_var, nsteps, self.at_step(
                        pos, lambda idx: add_exp(idx, True)))]),
                    K.If(K.Op("logical_not", (fin,), DataType.Bool),
                         [self.unroll(step_var, nsteps, self.at_step(pos, add_exp))])]
        total = K.ArrayRef(cs, (v,))
        if not per_lane:                                  # the lanes' sums, in lane order
            total = K.ArrayRef(cs, (self.const(0),))
            for lane in range(1, self.V):
                total = K.Op("add", (total, K.ArrayRef(cs, (self.const(lane),))), dt)
        fold = [K.Assign(acc_s, here, K.Op("add", (K.Op("mul", (ref(acc_s), shift_exp(
                    ref(acc_m), ref(mn), dt)), dt), total), dt)),
                K.Assign(acc_m, here, ref(mn))]
        out += [self.lanes(fold)] if per_lane else fold

    def welford_chunk(self, e, q, known, step_var, nsteps, streamed, out: list) -> None:
        """Merge the values of e's input over the step loop just run (its loads still in their
        buffers) into e's accumulators: exact chunk mean and m2 in registers (the values computed
        again), then Chan's merge. Inner kernels: one chunk of every lane into one statistic;
        outer: a chunk per lane."""
        reds, outs, full, inputs = self.plans[q]
        vnode = inputs[id(e)]
        nodes = RG.ancestors(self.g, [vnode], lambda n: self.lvl[id(n)] == "row")
        nodes = [n for n in nodes if self.lvl[id(n)] == "full"]
        dt, n_dt = self.comb.dtypes(e)[0], self.comb.dtypes(e)[2]
        ct = K.REGISTER_CTYPE[dt]
        zero = K.Const(0.0, ct, dt)
        per_lane = self.LANE_WELFORD
        lane_var = K.Var("v") if per_lane else K.Var("q")
        tag = self.comb.fresh("c")
        cn, cs, cm, c2 = f"{tag}_n", f"{tag}_sum", f"{tag}_mean", f"{tag}_m2"
        here = (K.Var("v"),) if per_lane else ()
        ref = lambda name: K.ArrayRef(name, here)  # noqa: E731
        dims = (self.V,) if per_lane else ()
        out += [K.Alloc(cn, n_dt, ()), K.Assign(cn, (), K.Const(0, K.REGISTER_CTYPE[n_dt], n_dt)),
                K.Alloc(cs, dt, dims), K.Alloc(c2, dt, dims), K.Alloc(cm, dt, dims)]
        inits = [K.Assign(cs, here, zero), K.Assign(c2, here, zero)]
        out += [self.lanes(inits)] if per_lane else inits
        step = K.Var(step_var)

        def value(body, idx):
            vals = self.lane_values(nodes, known, step, lane_var, body, idx)
            src = vnode.tv.dtype
            x = vals[id(vnode)]
            return x if src.compute is dt else K.Convert("cast", x, src, dt)

        def over_lanes(fn, idx):   # fn(body, idx) -> statements for one lane
            body: list = []
            if per_lane:
                return [self.lanes(fn(body, idx))]
            return [self.unroll("q", self.V, fn(body, idx))]

        count = K.Const(1 if per_lane else self.V, K.REGISTER_CTYPE[n_dt], n_dt)
        add_n = K.Assign(cn, (), K.Op("add", (K.ArrayRef(cn, ()), count), n_dt))

        def add_sum(body, idx):
            x = value(body, idx)
            return body + [K.Assign(cs, here, K.Op("add", (ref(cs), x), dt))]

        def add_sq(body, idx):
            x = value(body, idx)
            d = K.Op("sub", (x, ref(cm)), dt)
            # the squares summed with one rounding each (fma: one instruction, not a product
            # rounded and then a sum; bfloat16 layer_norm 1024x65536: 64 of 1592 a row's thread)
            return body + [K.Let("dd", ct, d), K.Assign(c2, here, K.Op(
                "fma", (K.Var("dd"), K.Var("dd"), ref(c2)), dt))]

        pos = self.step_expr(step, streamed)
        out.append(self.unroll(step_var, nsteps, self.at_step(
            pos, lambda idx: [add_n] + over_lanes(add_sum, idx))))
        nf = K.Convert("cast", K.ArrayRef(cn, ()), n_dt, dt)
        inside: list = []
        mean_set = K.Assign(cm, here, K.Op("div", (ref(cs), nf), dt))
        # eager's Welford takes a row's elements one at a time: after an infinity the next
        # element makes its mean NaN (inf - inf), where a chunk's exact mean stays infinite. A
        # chunk of more than one element with an infinite mean gets eager's NaN (a row of 3
        # held in one thread: [-inf, 1, 2] gave -inf; Chan's merges of chunks already give NaN
        # where an infinite chunk comes first)
        many = K.Bin("<", K.Const(1, K.REGISTER_CTYPE[n_dt], n_dt), K.ArrayRef(cn, ()))
        inf_mean = K.Op("logical_and", (K.Op("isinf", (ref(cm),), dt), many), DataType.Bool)
        nan_set = K.Assign(cm, here, K.Op("where", (inf_mean, K.Const(float("nan"), ct, dt),
                                                    ref(cm)), dt))
        inside += [self.lanes([mean_set, nan_set])] if per_lane else [mean_set, nan_set]
        inside.append(self.unroll(step_var, nsteps, self.at_step(pos, lambda idx: over_lanes(add_sq, idx))))
        names = self.acc_names(e)
        merge: list = []
        new = self.comb.combine(e, [K.ArrayRef(n, here) for n in names],
                                [ref(cm), ref(c2), K.ArrayRef(cn, ())], merge)
        self.comb.assign_all(e, names, here, new, merge)
        inside += [self.lanes(merge)] if per_lane else merge
        out.append(K.If(K.Bin("<", K.Const(0, K.REGISTER_CTYPE[n_dt], n_dt), K.ArrayRef(cn, ())),
                        inside))
