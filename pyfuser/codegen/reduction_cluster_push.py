"""A cluster row's combine by pushes (sm_90): the ranks' partials sent to every rank's shared
memory by `st.async`, counted on each receiver's mbarrier, with no cluster barrier in the row.

A mixin of reduction_kernels.InnerKernel, used for a row split over a cluster when
`ReductionParams.push` is set (reduction_heuristics: $PYFUSER_RED_CLUSTER_PUSH). Per combine of
the row, each block has an mbarrier (one arrival a phase: thread 0's MbarExpect of C times the
partial's bytes) and a slot per rank for each partial value. Once the block's threads hold its
partial, lane r < C of warp 0 pushes it into slot [own rank] of the block of rank r; every
thread waits on its own block's mbarrier, then every warp merges the C slots as a tree (lane l
reads slot l % C, xor shuffles from C / 2 down to 1; both lanes of a pair merge in rank order,
or each its own partial first where the merge is commutative in its bits: `symmetric`): every
thread of every block ends with the same bits, the barrier combine's lane 0 result
(reduction_kernels.combine_cluster), with no block barrier after it.

Ordering: thread 0 initialises the mbarriers before the row loop, and the blocks arrive on the
cluster barrier there; a block waits for that arrive just before its first push of a row (the
loads and the block's own combine run meanwhile), so every mbarrier is initialised before
anyone pushes to it. A block that goes on to another row (a capped grid) arrives again at the
end of the row: its next row's pushes wait until every block has read the slots of this one,
and each mbarrier completes one phase a row (parity: the row's iteration number, mod 2). No
barrier keeps a block from exiting: every push into a block is waited for by that block.
"""
from __future__ import annotations

from ..ir import exprs as E
from ..ir.dtypes import DataType
from ..schedule.reduction_graph import OnlinePair
from . import kernel_ir as K
from .reduction_lowering import _and, _c

TX, TY = K.Special("threadIdx.x"), K.Special("threadIdx.y")
WARP = 32


def symmetric(e) -> bool:
    """The combine of two partials of `e` gives the same bits in either order: a sum (IEEE
    addition is commutative) or an online pair (a NaN-propagating max and a sum of two
    products); not Welford's merge (weighted by the first operand's count), nor a max / min,
    which may order signed zeros."""
    return isinstance(e, OnlinePair) or (not isinstance(e, E.WelfordOp) and e.info.name == "sum")


def pushable(dtypes) -> bool:
    """Partials of these dtypes can be pushed (4- or 8-byte elements)."""
    return all(dt.itemsize in (4, 8) for dt in dtypes)


class ClusterPush:
    push = False                  # the kernel's cluster combines are pushed (set by its body)
    push_bars: list = ()          # the row's mbarriers, one per combine, in order

    def push_prologue(self) -> list:
        """Before the row loop: thread 0 initialises the mbarriers; every block arrives on the
        cluster barrier its first push waits for."""
        first = _and(K.Bin("==", TX, _c(0)), K.Bin("==", TY, _c(0)))
        return [K.If(first, [K.MbarInit(b, 1) for b in self.push_bars]), K.ClusterSync("arrive")]

    def push_row_end(self, next_row) -> list:
        """At the end of a row: a block barrier (the next row rewrites the warps' shared
        partials), and the cluster barrier's arrive where the cluster has another row."""
        return [K.Sync(), K.If(next_row, [K.ClusterSync("arrive")])]

    def row_parity(self):
        """The row's iteration number in its cluster's grid-stride loop, mod 2."""
        C = _c(self.p.cluster)
        start = K.Bin("/", K.Special("blockIdx.x"), C)
        step = K.Bin("/", K.Special("gridDim.x"), C)
        return K.Bin("&", K.Bin("/", K.Bin("-", K.Var("rb"), start), step), _c(1))

    def combine_cluster_push(self, reds, out) -> None:
        """The ranks' partials of `reds` pushed to every rank and merged there (module
        docstring)."""
        p = self.p
        C = p.cluster
        assert p.bdimx >= WARP and p.bdimy == 1 and C <= WARP and C & (C - 1) == 0, \
            "a pushed cluster combine needs a team of a warp or more, one row a block and a " \
            "power-of-two cluster"
        bar = self.comb.fresh("cbar")
        self.shared.append(K.Alloc(bar, DataType.Int, (), "shared"))
        self.push_bars = list(self.push_bars) + [bar]
        rank = K.Special("cluster_rank")
        lane = K.Bin("%", TX, _c(WARP))
        pushes, reads, tree, results = [], [], [], []
        nbytes = 0
        for e in reds:
            tmps = []
            for n, dt in zip(self.partial_names(e), self.comb.dtypes(e)):
                slot, t = self.comb.fresh("cslot"), self.comb.fresh("crk")
                self.shared.append(K.Alloc(slot, dt, (C,), "shared"))
                pushes.append(K.PushRemote(slot, (rank,), TX, K.ArrayRef(n, ()), dt, bar))
                reads += [K.Alloc(t, dt, ()), K.Assign(t, (), K.ArrayRef(slot, (K.Bin("%", lane, _c(C)),)))]
                results.append(K.Assign(n, (), K.ArrayRef(t, ())))
                tmps.append(t)
                nbytes += dt.itemsize
            m = C // 2
            while m >= 1:             # both lanes of a pair in rank order, unless the combine
                self.shuffle_step(e, tmps, m, tree, "cshf",   # is commutative in its bits
                                  None if symmetric(e) else lane)
                m //= 2
        expect = K.If(K.Bin("==", TX, _c(0)), [K.MbarExpect(bar, C * nbytes)])
        wait = [K.ClusterSync("wait")] if len(self.push_bars) == 1 else []   # the row's first
        out += wait + [K.If(_and(K.Bin("==", TY, _c(0)), K.Bin("<", TX, _c(C))), [expect, *pushes]),
                       K.MbarWait(bar, self.row_parity())] + reads + tree + results
