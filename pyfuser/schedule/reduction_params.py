"""The plan of a reduction-family kernel (schedule/reduction.py's three schedulers and the
inner-outer one, which extends both): `ReductionParams`, the printable numbers the heuristics
choose (thread shape, persistence, vectors, clusters, staging, grid), and `ReductionSchedule`,
the params with the analysis and accesses the lowering (codegen/reduction_lowering.py) reads.

Invariant: everything that follows from sizes rather than from the layout signature is in
`ReductionParams.size_class()`, part of the kernel's signature: a plan is reused only for sizes
that give the same class.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from . import reduction_graph as RG


@dataclass
class ReductionParams:
    kind: str = "inner"          # "inner": reduced axes innermost; "outer": kept axes innermost
    persistent: bool = False     # the row (inner) / column block (outer) stays in registers
    vec: int = 1                 # elements per vector access along the innermost group
    bdimx: int = 32              # inner: threads per row; outer: threads across columns
    bdimy: int = 1               # inner: rows per block; outer: threads splitting the reduction
    unroll: int = 1              # vectors (inner) / rows (outer) per thread per loop step
    steps: int = 0               # persistent: vectors (inner) / rows (outer) held per thread
    kept: int = 0                # persistent: computed values held between passes
    splits: int = 1              # outer pure reductions: blocks splitting the reduced index
                                 # (blockIdx.z), combined through global memory
    cluster: int = 1             # inner persistent rows too long for a block: a thread-block
                                 # cluster per row (sm_90), combined in distributed shared memory
    stage: bool = False          # persistent inner: held loads staged in shared memory by
                                 # async copies (reduction_heuristics.stageable)
    max_blocks: int = 0          # grid cap (the kernel grid-strides over rows / columns)
    min_blocks: int = 0          # __launch_bounds__ blocks an SM (caps registers; 0: no cap)
    index_type: str = "int"
    groups: list = field(default_factory=list)     # collapsed reference-axis groups, outer first
    reduced: list = field(default_factory=list)    # per group: True when it is reduced
    dropped: list = field(default_factory=list)    # size-1 reference axes
    passes: int = 0              # reduction passes (+ a final pass when `final_pass` > passes-1)
    online: bool = False         # softmax's max and sum of exp as one online pair (one pass)
    full: bool = False           # inner: every thread's positions are in bounds (the rows a
                                 # multiple of bdimy, the row a whole number of the team's
                                 # steps): the kernel checks no bounds
    whole: bool = False          # inner: the row a whole number of the team's steps (checks or
                                 # not): every thread of a row holds as many elements, so the
                                 # team's and cluster's Welford merges weigh equal counts (1/2)
    fence: bool = False          # ($PYFUSER_RED_FENCE=1) inner staged rows that would be
                                 # `full`: every position in bounds, yet each step stays under
                                 # a branch on a condition always true and the same in every
                                 # thread (0 < rlen): without a branch ptxas reads every staged
                                 # vector back at once and spills; a uniform branch costs less
                                 # than the bounds check
    prefetch: bool = False       # ($PYFUSER_RED_PREFETCH=1) inner staged cluster rows whose
                                 # grid is capped (each cluster loops over rows): the next row's
                                 # staged copies are issued at the end of this row, into the
                                 # slots each thread has just read for the last time
    push: bool = False           # inner cluster rows: the ranks' partials pushed into every
                                 # rank's shared memory, counted on mbarriers, with no cluster
                                 # barrier in the row (codegen/reduction_cluster_push.py; off
                                 # with $PYFUSER_RED_CLUSTER_PUSH=0; the lowering keeps the
                                 # barriers where a per-row input is written in place)
    reason: str = ""

    def as_dict(self) -> dict:
        return asdict(self)

    def size_class(self) -> tuple:
        """What of the plan follows from sizes rather than from the layout signature."""
        return (self.kind, self.persistent, self.vec, self.bdimx, self.bdimy, self.unroll,
                self.steps, self.kept, self.splits, self.cluster, self.stage,
                tuple(map(tuple, self.groups)),
                tuple(self.dropped), self.online, self.full, self.whole, self.fence,
                self.prefetch, self.push, self.max_blocks if self.cluster > 1 else 0)


@dataclass
class ReductionSchedule:
    fusion: object               # the user's fusion (not copied: nothing here changes it)
    orig: object                 # the same (the lowering's interface with the pointwise one)
    orig_of: dict                # id(Scalar) -> Scalar
    graph: RG.ReductionGraph
    params: ReductionParams
    accesses: list
    out_orders: list
    shape: list                  # reference sizes at planning
    scheduler: str = "reduction"
    kept: list = field(default_factory=list)   # nodes held in registers between passes
    shared: dict = field(default_factory=dict)  # id(load node) -> id(load node) whose register
                                                # buffer it shares (reduction_resize.shared_buffers)
