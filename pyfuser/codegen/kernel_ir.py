"""Kernel IR: the loop nest of one generated kernel, printed as CUDA C and run by the interpreter.

Every scheduler (pointwise, transpose, reduction, persistent normalization) lowers to this IR;
codegen/cuda.py prints it and codegen/interpreter.py runs it on the CPU, so the CUDA C is always
printed from what the interpreter executes.

Expressions are immutable trees (hashable, so lowering can share them):
  Var(name)                a kernel parameter, a `Let`, a loop index
  Const(value, ctype, dtype)
  Special(name)            threadIdx.x/y/z, blockIdx.x/y/z, blockDim.x/y/z, gridDim.x/y/z
  Bin(op, a, b)            index arithmetic and conditions: + - * / % < <= == != && || ^ & <<
                           (C semantics on the index type; `^`/`&`/`<<` on lane numbers and
                           warp masks)
  ArrayRef(name, index)    an element of an array (storage type); index () names a scalar Alloc
  Op(name, args, compute)  an op of the op table applied in register type of `compute`
  Convert(kind, arg, src, dst)
      "load"  storage -> register (half/bf16 -> float), "store" register -> storage,
      "cast"  eager's dtype conversion src -> dst (rounded when dst is half/bf16),
      "round" a float rounded to dst's precision (results of half/bf16 ops).
  Shfl(value, lane_xor, dtype)  the value of `value` in the thread whose lane (threadIdx in the
                           warp) is this lane ^ lane_xor (`__shfl_xor_sync` over the full warp)
  Ballot(pred)             the 32-bit mask of the lanes of this warp whose `pred` is true
                           (`__ballot_sync` over the full warp, as a non-negative int64): every
                           lane of the warp evaluates it together (the interpreter checks); with
                           the `popc` kernel op and `<<`, a warp's count and each lane's rank
                           among the lanes below it (stream compaction in token order)
  RemoteRef(name, index, rank)  an element of shared array `name` of the block of rank `rank` in
                           this block's thread-block cluster (distributed shared memory, sm_90);
                           Special("cluster_rank") is this block's rank
  Elem(ptr, offset)        the element at ptr[offset] of an integer tensor parameter, read where
                           the expression is evaluated (a gathered load's index, in the load's
                           own offset: kernels whose loads have no statement before them)
  CheckedIndex(value, size, text)  `value` (an integer), which must lie in [0, size): else the
                           kernel stops with an error naming `text` and the value (CUDA: printf
                           and trap: the launch, and the CUDA context with it, fail, as eager's
                           device-side asserts; the interpreter: IndexError)
Statements:
  Let(name, ctype, expr)   `const ctype name = expr;`
  Alloc(name, dtype, dims, space, packed)   an array in storage type, "local" (registers, per
                           thread) or "shared" (per block); dims () is one mutable scalar (`Assign` /
                           `ArrayRef` with index ()); `packed`: 2-byte elements two to a register
  Loop(var, start, stop, step, kind, body)
      kind: "grid" (grid-stride over blocks), "serial" (a runtime loop: start/stop/step may differ
      per thread), "unroll" (constant trip count, unrolled), "lanes" (the vector lanes)
  If(cond, body)
  Load(dst, index, ptr, offset, width, stride, cache, async_copy)   width elements at
      ptr[offset + lane*stride] (stride None: one contiguous vector access of `width` elements);
      dst may be shared. async_copy (contiguous, into shared memory, 4 / 8 / 16 bytes, sm_80+):
      a `cp.async` the thread does not wait for; it reads the elements only after an AsyncWait
  Store(ptr, offset, src, index, width, stride, cache)
      cache (contiguous accesses only): "" plain, "cs" streaming (.cs), "ef" L2 evict_first,
      "el" L2 evict_last (speed only), "cg" cached in L2 only (loads of what other blocks wrote
      in this launch: never a stale L1 line)
  Assign(name, index, expr)
  VecCopy(dst, dst_index, src, src_index, width)   the row of `width` elements of array src at
                           src_index (local or shared, 16-byte aligned) into local array dst at
                           dst_index, as one vector access (a staged row read back: `ld.shared.v4`);
                           a packed dst takes the 2-byte elements as 32-bit words (one register,
                           two elements, each unpacked with one instruction where it is read)
  PackedFill(dst, value)   every element of packed local array dst (2-byte floats, dims (V,)) =
                           `value` (a float the dtype holds exactly), a 32-bit word at a time
  PackedOp(op, dst, src, src_index)   dst[l] = op(dst[l], src[src_index][l]) for every lane l of
                           packed local arrays of one 2-byte float dtype (dst dims (V,), src's
                           last dim V), two lanes a word in one instruction (`max.NaN.bf16x2`);
                           op "maximum" / "minimum": NaN wins, as the float ops; exact (the result
                           is one of the inputs), so it equals the float op on the unpacked values
  Sync()                   `__syncthreads()`: every thread of the block reaches it (block-uniform
                           control flow); orders shared-memory accesses before and after it
  AtomicAdd(dst, ptr, offset, value)   `dst = atomicAdd(ptr + offset, value)` on an integer
                           workspace word (a Let of the old value); atomics of one launch take
                           effect one at a time
  Fence()                  `__threadfence()`: this thread's global writes are visible to every
                           thread that later sees its atomic
  WaitCount(ptr, offset, value)   spin until the integer workspace word ptr[offset], which
                           atomics of other blocks of this launch raise, is at least `value`
                           (then a Fence makes their fenced writes visible). Deadlock-free only
                           when the blocks it waits for can all be resident while it spins: the
                           lowering that emits it says why they can (inner_outer_lowering.py)
  AsyncWait()              `cp.async.wait_all`: this thread's async copies have landed and it
                           may read them (other threads only after a Sync as well)
  ClusterSync(phase)       a barrier of every thread of every block of the cluster (release /
                           acquire): shared-memory writes before it are seen by remote reads
                           after it, remote reads before it end before writes after it.
                           phase "sync" (both halves), or split: "arrive" (this thread's
                           accesses so far are released; it runs on) and a later "wait" (it
                           blocks until every thread of the cluster has arrived, and acquires
                           what they released); arrive and wait alternate, and what a thread
                           does between them is ordered with no other thread's accesses
  MbarInit(name, count)    thread 0 of a block initialises mbarrier `name` (a shared Int scalar)
                           for `count` arrivals a phase, fenced for the cluster (sm_90); the other
                           blocks of the cluster may push to it only after a whole ClusterSync
                           that follows the init, or the wait of a split one whose arrive does
  MbarExpect(name, nbytes) this thread arrives on its block's mbarrier `name` and adds `nbytes`
                           to the bytes the current phase waits for
  PushRemote(dst, index, rank, value, dtype, mbar)   `value` (4 or 8 bytes of storage `dtype`) into
                           element dst[index] of the shared memory of the block of rank `rank`
                           in the cluster (`st.async`), counted on that block's mbarrier `mbar`:
                           the thread runs on; the receiver reads the element only after its
                           wait for the phase that counted it. An element is pushed at most once
                           between two ClusterSyncs
  MbarWait(name, parity)   spin until the phase of parity `parity` (0 / 1) of this block's
                           mbarrier `name` has completed (every arrival, every byte expected);
                           the pushes it counted are then visible to the waiting thread. Reached
                           by whole blocks, after the pushes it counts in program order
  Comment(text)

Invariants: a Let's name is assigned once per scope iteration; a "lanes" loop is innermost and
its index only selects elements of arrays (the vector lanes); every Load/Store is under an If whose
condition guarantees it is in bounds for every lane; indices of local arrays are the same in every
thread (constants, unroll and lane indices: they stay in registers); a Sync or Shfl is reached by
every thread of the block (Sync) or warp (Shfl, Ballot) together, which the interpreter checks, together
with data races on shared memory between two Syncs.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..ir.dtypes import DataType

# ---- types ------------------------------------------------------------------------------------
REGISTER_CTYPE = {
    DataType.Bool: "bool", DataType.Byte: "uint8_t", DataType.Char: "int8_t",
    DataType.Short: "int16_t", DataType.Int32: "int", DataType.Int: "int64_t",
    DataType.Half: "float", DataType.BFloat16: "float", DataType.Float: "float",
    DataType.Double: "double",
}
STORAGE_CTYPE = dict(REGISTER_CTYPE)
STORAGE_CTYPE.update({DataType.Half: "pf_half", DataType.BFloat16: "pf_bf16"})


# ---- expressions ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Var:
    name: str


@dataclass(frozen=True)
class Const:
    value: Any
    ctype: str
    dtype: Optional[DataType] = None


@dataclass(frozen=True)
class Special:
    name: str


@dataclass(frozen=True)
class Bin:
    op: str
    a: Any
    b: Any


@dataclass(frozen=True)
class ArrayRef:
    name: str
    index: tuple


@dataclass(frozen=True)
class Op:
    name: str
    args: tuple
    compute: DataType


@dataclass(frozen=True)
class Convert:
    kind: str
    arg: Any
    src: DataType
    dst: DataType


@dataclass(frozen=True)
class Shfl:
    value: Any
    lane_xor: int
    dtype: DataType


@dataclass(frozen=True)
class Ballot:
    pred: Any


@dataclass(frozen=True)
class RemoteRef:
    name: str
    index: tuple
    rank: Any


@dataclass(frozen=True)
class Elem:
    ptr: str
    offset: Any


@dataclass(frozen=True)
class CheckedIndex:
    value: Any
    size: Any
    text: str


def add(a, b):
    if isinstance(a, Const) and a.value == 0:
        return b
    if isinstance(b, Const) and b.value == 0:
        return a
    return Bin("+", a, b)


def mul(a, b):
    for x, y in ((a, b), (b, a)):
        if isinstance(x, Const) and x.value == 1:
            return y
        if isinstance(x, Const) and x.value == 0:
            return x
    return Bin("*", a, b)


# ---- statements -------------------------------------------------------------------------------
@dataclass
class Let:
    name: str
    ctype: str
    expr: Any
    comment: str = ""


@dataclass
class Alloc:
    name: str
    dtype: DataType
    dims: tuple
    space: str = "local"     # "local" (per thread) or "shared" (per block)
    # half / bfloat16 elements kept two to a 32-bit register (printing only: the last dim is
    # even, only full-width contiguous Loads write it); the values are the same
    packed: bool = False


@dataclass
class Loop:
    var: str
    start: Any
    stop: Any
    step: Any
    kind: str
    body: list = field(default_factory=list)
    comment: str = ""


@dataclass
class If:
    cond: Any
    body: list = field(default_factory=list)


# cache policy of a contiguous access -> the prelude's PF_* constant ("": a plain access)
CACHE_POLICIES = {"": None, "cs": "PF_CS", "ef": "PF_EF", "el": "PF_EL", "cg": "PF_CG"}


@dataclass
class Load:
    dst: str
    index: tuple
    ptr: str
    offset: Any
    width: int
    stride: Any = None
    cache: str = ""          # see CACHE_POLICIES
    async_copy: bool = False


@dataclass
class Store:
    ptr: str
    offset: Any
    src: str
    index: tuple
    width: int
    stride: Any = None
    cache: str = ""          # see CACHE_POLICIES


@dataclass
class Assign:
    name: str
    index: tuple
    expr: Any


@dataclass
class VecCopy:
    dst: str
    dst_index: tuple
    src: str
    src_index: tuple
    width: int


@dataclass
class PackedFill:
    dst: str
    value: float


PACKED_OPS = ("maximum", "minimum")


@dataclass
class PackedOp:
    op: str
    dst: str
    src: str
    src_index: tuple


@dataclass
class Sync:
    pass


@dataclass
class AtomicAdd:
    dst: str
    ptr: str
    offset: Any
    value: Any


@dataclass
class Fence:
    pass


@dataclass
class WaitCount:
    ptr: str
    offset: Any
    value: Any


@dataclass
class AsyncWait:
    pass


CLUSTER_PHASES = ("sync", "arrive", "wait")


@dataclass
class ClusterSync:
    phase: str = "sync"            # CLUSTER_PHASES

    def __post_init__(self):
        if self.phase not in CLUSTER_PHASES:
            raise ValueError(f"ClusterSync: phase {self.phase!r} is none of {CLUSTER_PHASES}")


@dataclass
class MbarInit:
    name: str
    count: int


@dataclass
class MbarExpect:
    name: str
    nbytes: int


@dataclass
class PushRemote:
    dst: str
    index: tuple
    rank: Any
    value: Any
    dtype: DataType
    mbar: str

    def __post_init__(self):
        if self.dtype.itemsize not in (4, 8):
            raise ValueError(f"PushRemote: {self.dtype.name} elements are not 4 or 8 bytes")


@dataclass
class MbarWait:
    name: str
    parity: Any


@dataclass
class Comment:
    text: str


@dataclass
class TensorParam:
    name: str
    dtype: DataType
    seg: int
    is_output: bool
    restrict: bool = True   # False: an in-place output and its input share this storage


@dataclass
class Kernel:
    name: str
    params: list            # codegen.kernel.Param, in order
    tensors: dict           # pointer param name -> TensorParam
    index_type: str
    block: Any              # threads per block: (x, y, z) (an int n means (n, 1, 1))
    body: list = field(default_factory=list)
    min_blocks: int = 0     # __launch_bounds__ min blocks per SM (0: none)
    cluster: int = 1        # blocks of a thread-block cluster along x (__cluster_dims__)

    def __post_init__(self):
        if isinstance(self.block, int):
            self.block = (self.block, 1, 1)
        self.block = tuple(self.block) + (1,) * (3 - len(self.block))

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    def walk(self):
        """Every statement, depth first."""
        stack = list(reversed(self.body))
        while stack:
            s = stack.pop()
            yield s
            if isinstance(s, (Loop, If)):
                stack.extend(reversed(s.body))
