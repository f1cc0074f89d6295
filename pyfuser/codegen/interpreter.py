"""CPU interpreter of kernel IR: runs a generated kernel's logic with torch, every thread at once.

The grid of the plan's LaunchConfig is processed in chunks of blocks; within a chunk every thread
is one row of torch tensors (index values are int64 tensors of shape [threads], lane values
[threads, V]); row r is thread r % T of block r // T of the chunk (T threads per block, linear
thread id x + X * (y + Y * z)), so the 32 rows of a warp are neighbours. Loads and stores go
through flat views of the real tensors' storage with the kernel's own offsets, so indexing bugs
show up as wrong results exactly as on a GPU.

Semantics mirror the CUDA printer: `If` and runtime loops ("grid", "serial") narrow the set of
active threads (the body runs on the compacted subset, so inactive threads never evaluate
anything), unrolled loops run in Python, the lanes loop is a tensor dimension (values hoisted out
of it, per thread or per unrolled step, are [threads] tensors and broadcast over the lanes). Op
and conversion values are interpreter_values.py's.

Threads run statement by statement in lockstep, which is one of the schedules a GPU may pick; the
interpreter also checks what would make the kernel depend on the schedule (a `KernelRaceError`;
shared memory and barriers: interpreter_shared.py):
- a `Sync` reached by part of a block, a `Shfl` or `Ballot` by part of a warp
  (interpreter_warp.py);
- a shared-memory element written by one thread and read or written by another, or read by one
  and written by another, with no `Sync` between the two accesses;
- an element an async copy (`Load.async_copy`) writes, read before its thread's `AsyncWait`;
- mbarriers and pushes into other blocks' shared memory: interpreter_mbarrier.py;
- with `racecheck` (PYFUSER_INTERP_RACECHECK=1, on in the tests): a global element written by one
  thread and read or written by another, over the whole launch (all chunks), unless a `Sync`, or
  a fence and an atomic ticket or count, orders them (interpreter_global.py). Without it, the
  lockstep order hides such races: every load of a statement precedes every store of a later
  one, every earlier chunk every later one.
Atomics apply in thread order (rows ascending), which is one valid order of a GPU's. A kernel
with a `WaitCount` (blocks waiting for other blocks' atomics) runs its whole grid as one chunk.
"""
from __future__ import annotations

import contextlib

import torch

from . import kernel_ir as K
from . import kernel_ir_format as KF
from . import interpreter_global
from .interpreter_mbarrier import Mbarriers
from .interpreter_shared import KernelRaceError, SharedMemory, _Shared
from .interpreter_warp import WarpOps
from .interpreter_values import _garbage, apply_op, convert_value

ELEMENT_BUDGET = 1 << 22          # elements (threads x per-thread data) per chunk


def _flat(t: torch.Tensor):
    if t.numel() == 0:
        return None
    span = 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))
    return t.as_strided((span,), (1,))


class _Scope:
    __slots__ = ("env", "sel")

    def __init__(self, env, sel):
        self.env, self.sel = env, sel

    @property
    def rows(self):
        """Index of the active threads into chunk-wide arrays (a slice when all are active)."""
        return slice(None) if self.sel is None else self.sel

    def count(self, P):
        return P if self.sel is None else self.sel.shape[0]

    def narrow(self, keep, P):
        if bool(keep.all()):
            return self
        idx = keep.nonzero().squeeze(1)
        sel = torch.arange(P) if self.sel is None else self.sel
        n = sel.shape[0]
        env = {k: (v[idx] if isinstance(v, torch.Tensor) and v.dim() >= 1 and v.shape[0] == n
                   and k != "v" else v) for k, v in self.env.items()}
        return _Scope(env, sel[idx])


@contextlib.contextmanager
def _row_lanes(sc, width: int):
    """`v` names the `width` elements of a row (a vector access into or out of an array indexed
    by thread) while the block runs, as in a lanes loop; the outer `v`, if any, comes back."""
    outer = sc.env.get("v")
    sc.env["v"] = torch.arange(width).view(1, -1)
    try:
        yield
    finally:
        del sc.env["v"]
        if outer is not None:
            sc.env["v"] = outer


class Interpreter(SharedMemory, Mbarriers, WarpOps):
    def __init__(self, plan, tensors, bindings, params=None, racecheck=None):
        """`racecheck`: check global memory for data races (interpreter_global.py); None: as
        PYFUSER_INTERP_RACECHECK says."""
        self.k: K.Kernel = plan.kernel_ir
        self.values = {}
        self.racecheck = interpreter_global.enabled() if racecheck is None else racecheck
        self.ptr_tensors: dict = {}
        self.races = None
        for i, p in enumerate(self.k.params):
            src = p.source
            if src[0] == "philox" and src[1] == "state":     # the device words (runtime/rng.py)
                from ..runtime.rng import state_tensor
                self.values[p.name] = state_tensor("cpu")
            elif src[0] == "philox":
                assert params is not None, "random-number parameters come from the runtime"
                self.values[p.name] = params[i]
            elif src[0] in ("ptr", "workspace"):
                self.values[p.name] = _flat(tensors[src[1]])
                self.ptr_tensors[p.name] = tensors[src[1]]
            elif src[0] == "size":
                self.values[p.name] = int(tensors[src[1]].shape[src[2]])
            elif src[0] == "stride":
                self.values[p.name] = int(tensors[src[1]].stride(src[2]))
            elif src[0] == "numel":
                self.values[p.name] = int(tensors[src[1]].numel())
            else:
                self.values[p.name] = bindings.value(src[1])
        self.arrays: dict = {}
        self.shared: dict = {}

    # ---- driving --------------------------------------------------------------------------
    def _per_thread(self) -> int:
        widths = max((s.width for s in self.k.walk() if isinstance(s, (K.Load, K.Store))), default=1)
        unroll = max((s.stop.value for s in self.k.walk()
                      if isinstance(s, K.Loop) and s.kind == "unroll"), default=1)
        local = 1
        for s in self.k.walk():
            if isinstance(s, K.Alloc) and s.space == "local":
                n = 1
                for d in s.dims:
                    n *= d
                local = max(local, n)
        return max(1, widths * unroll, local)

    def run(self, cfg) -> None:
        gx, gy, gz = cfg.grid
        bx, by, bz = cfg.block
        T = bx * by * bz
        assert (bx, by, bz) == self.k.block, f"launch block {cfg.block} != kernel block {self.k.block}"
        nblocks = gx * gy * gz
        C = self.k.cluster
        assert gx % C == 0, f"grid x {gx} is not a multiple of the cluster size {C}"
        chunk = max(1, ELEMENT_BUDGET // (T * self._per_thread()))
        chunk = -(-chunk // C) * C                   # whole clusters in a chunk
        if any(isinstance(s, K.WaitCount) for s in self.k.walk()):
            chunk = nblocks          # blocks wait for each other: the whole grid runs together
        tid = torch.arange(T, dtype=torch.int64)
        if self.racecheck:
            self.races = interpreter_global.GlobalRaces(self.k, self.ptr_tensors, (gx, gy, gz), (bx, by, bz))
        for b0 in range(0, nblocks, chunk):
            if self.races is not None:
                self.races.b0 = b0
            lin = torch.arange(b0, min(nblocks, b0 + chunk), dtype=torch.int64)
            nb = lin.shape[0]
            env = dict(self.values)
            env["blockIdx.x"] = (lin % gx).repeat_interleave(T)
            env["blockIdx.y"] = ((lin // gx) % gy).repeat_interleave(T)
            env["blockIdx.z"] = (lin // (gx * gy)).repeat_interleave(T)
            env["threadIdx.x"] = (tid % bx).repeat(nb)
            env["threadIdx.y"] = ((tid // bx) % by).repeat(nb)
            env["threadIdx.z"] = (tid // (bx * by)).repeat(nb)
            for axis, g, b in (("x", gx, bx), ("y", gy, by), ("z", gz, bz)):
                env[f"gridDim.{axis}"], env[f"blockDim.{axis}"] = g, b
            env["cluster_rank"] = ((lin % gx) % C).repeat_interleave(T)
            self.arrays, self.shared, self.mbars = {}, {}, {}
            self.P, self.T, self.nb = nb * T, T, nb
            self.cluster_arrives = torch.zeros(-(-nb // C), dtype=torch.int64)  # split barriers
            self.cluster_open = torch.zeros(-(-nb // C), dtype=torch.bool)
            self.block_of = torch.arange(nb, dtype=torch.int64).repeat_interleave(T)
            self.exec(self.k.body, _Scope(env, None))
            self.check_pushes_landed()
            if bool(self.cluster_open.any()):
                raise KernelRaceError(f"{self.k.name}: a cluster barrier's arrive is never waited "
                                      "for (a block may exit while another reads its shared memory)")

    # ---- statements -----------------------------------------------------------------------
    def exec(self, stmts, sc: _Scope) -> None:
        for s in stmts:
            if isinstance(s, K.Let):
                sc.env[s.name] = self.ev(s.expr, sc)
            elif isinstance(s, K.Alloc):
                self.alloc(s)
            elif isinstance(s, K.If):
                keep = self.ev(s.cond, sc)
                if isinstance(keep, bool):
                    if keep:
                        self.exec(s.body, sc)
                    continue
                if not bool(keep.any()):
                    continue
                self.exec(s.body, sc.narrow(keep, self.P))
            elif isinstance(s, K.Loop):
                self.loop(s, sc)
            elif isinstance(s, K.Load):
                self.load(s, sc)
            elif isinstance(s, K.Store):
                self.store(s, sc)
            elif isinstance(s, K.Assign):
                self.assign(s, sc)
            elif isinstance(s, K.Sync):
                self.sync(sc)
                if self.races is not None:
                    self.races.sync(self._rows(sc))
            elif isinstance(s, K.ClusterSync):
                self.cluster_sync(sc, s.phase)
                self.mbar_cluster_sync(sc, s.phase)
                if self.races is not None:
                    self.races.cluster_sync(self._rows(sc), s.phase)
            elif isinstance(s, K.Fence):
                if self.races is not None:
                    self.races.fence(self._rows(sc))
            elif isinstance(s, K.AsyncWait):
                self.async_wait(sc)
            elif isinstance(s, K.VecCopy):
                self.vec_copy(s, sc)
            elif isinstance(s, K.PackedFill):
                arr, key, element = self._local_ref(s.dst, (), sc)
                assert not element, "a packed fill writes a row"
                arr[key] = s.value
            elif isinstance(s, K.PackedOp):
                self.packed_op(s, sc)
            elif isinstance(s, K.AtomicAdd):
                self.atomic_add(s, sc)
            elif isinstance(s, K.WaitCount):
                self.wait_count(s, sc)
            elif isinstance(s, K.PushRemote):
                self.push(s, sc)
            elif isinstance(s, K.MbarWait):
                self.mbar_wait(s, sc)
            elif isinstance(s, K.MbarExpect):
                self.mbar_expect(s, sc)
            elif isinstance(s, K.MbarInit):
                self.mbar_init(s, sc)

    def alloc(self, s: K.Alloc) -> None:
        dtype = s.dtype.torch
        if s.space == "shared":
            if s.name not in self.shared:      # static: one array per block for the whole kernel
                self.shared[s.name] = _Shared(self.nb, s.dims, dtype)
        else:          # uninitialised registers: garbage a kernel must never read
            self.arrays[s.name] = _garbage((self.P, *s.dims), dtype)

    def loop(self, s: K.Loop, sc: _Scope) -> None:
        if s.kind in ("grid", "serial"):
            cur = self.ev(s.start, sc)
            stop, step = self.ev(s.stop, sc), self.ev(s.step, sc)
            if not any(isinstance(v, torch.Tensor) for v in (cur, stop, step)):
                while cur < stop:             # the same trip count in every thread
                    sc.env[s.var] = cur
                    self.exec(s.body, sc)
                    cur = cur + step
                return
            n = sc.count(self.P)
            cur = cur if isinstance(cur, torch.Tensor) else torch.full((n,), int(cur))
            while True:
                keep = cur < stop
                if not bool(keep.any()):
                    return
                inner = sc.narrow(keep, self.P)
                inner.env[s.var] = cur if inner is sc else cur[keep]
                self.exec(s.body, inner)
                cur = cur + step
        elif s.kind == "unroll":
            for u in range(s.stop.value):
                sc.env[s.var] = u
                self.exec(s.body, sc)
        else:  # lanes: a tensor dimension
            sc.env[s.var] = torch.arange(s.stop.value).view(1, -1)
            self.exec(s.body, sc)
            del sc.env[s.var]

    # ---- local arrays (uniform indices) -----------------------------------------------------
    def _index(self, index, sc) -> tuple:
        out = []
        for i in index:
            if isinstance(i, K.Var) and i.name == "v":
                out.append(slice(None))
            else:
                v = self.ev(i, sc)
                if isinstance(v, torch.Tensor):
                    raise AssertionError(f"index {KF.fmt(i)} of a local array differs between threads")
                out.append(int(v))
        return tuple(out)

    def _local_ref(self, name, index, sc):
        """(array, key of the active threads' elements, is one element per thread)."""
        arr = self.arrays[name]
        idx = self._index(index, sc)
        return arr, (sc.rows, *idx), len(idx) == arr.dim() - 1

    def vec_copy(self, s: K.VecCopy, sc: _Scope) -> None:
        with _row_lanes(sc, s.width):
            vals = self.ev(K.ArrayRef(s.src, (*s.src_index, K.Var("v"))), sc)
        arr, key, element = self._local_ref(s.dst, s.dst_index, sc)
        assert not element, "a vector copy writes a row"
        arr[(*key, slice(0, s.width))] = vals

    def packed_op(self, s: K.PackedOp, sc: _Scope) -> None:
        """dst[l] = op(dst[l], src[src_index][l]) on the 2-byte values as stored (NaN wins, as
        torch.maximum / minimum); exact, so the same as the op on the unpacked floats."""
        assert s.op in K.PACKED_OPS, s
        arr, key, element = self._local_ref(s.dst, (), sc)
        src, skey, _ = self._local_ref(s.src, s.src_index, sc)
        assert not element and arr.dtype == src.dtype and arr.dtype.itemsize == 2, s
        fn = torch.maximum if s.op == "maximum" else torch.minimum
        arr[key] = fn(arr[key], src[skey])

    # ---- array access -------------------------------------------------------------------------
    def assign(self, s: K.Assign, sc: _Scope) -> None:
        val = self.ev(s.expr, sc)
        if s.name in self.shared:
            self._shared_write(s.name, s.index, sc, val)
            return
        arr, key, _ = self._local_ref(s.name, s.index, sc)
        target = arr[key]
        if isinstance(val, torch.Tensor):
            val = val.to(arr.dtype).expand_as(target)
        arr[key] = val

    def _offsets(self, s, sc):
        off = self.ev(s.offset, sc)
        if not isinstance(off, torch.Tensor):
            off = torch.full((sc.count(self.P),), int(off), dtype=torch.int64)
        if s.width == 1:
            return off.unsqueeze(1)
        stride = 1 if s.stride is None else self.ev(s.stride, sc)
        lanes = torch.arange(s.width, dtype=torch.int64).view(1, -1)
        if isinstance(stride, torch.Tensor):
            stride = stride.view(-1, 1)
        return off.view(-1, 1) + lanes * stride

    def _rows(self, sc: _Scope):
        return torch.arange(self.P) if sc.sel is None else sc.sel

    def load(self, s: K.Load, sc: _Scope) -> None:
        offs = self._offsets(s, sc)
        if self.races is not None:
            self.races.read(s.ptr, offs, self._rows(sc))
        vals = self.values[s.ptr][offs]
        if s.dst in self.shared:
            if s.width == 1 and not s.async_copy:
                self._shared_write(s.dst, s.index, sc, vals.squeeze(1))
                return
            assert s.stride is None, "a vector into shared memory is contiguous"
            with _row_lanes(sc, s.width):
                self._shared_write(s.dst, (*s.index, K.Var("v")), sc, vals, s.async_copy)
            return
        assert not s.async_copy, "async copies write shared memory"
        arr, key, element = self._local_ref(s.dst, s.index, sc)
        if element:
            assert s.width == 1, "an element access has width 1"
            arr[key] = vals.squeeze(1)
        else:
            arr[(*key, slice(0, s.width))] = vals

    def store(self, s: K.Store, sc: _Scope) -> None:
        flat = self.values[s.ptr]
        offs = self._offsets(s, sc)
        if self.races is not None:
            self.races.write(s.ptr, offs, self._rows(sc))
        if s.src in self.shared:
            assert s.width == 1, "shared-memory stores are of one element"
            flat[offs.squeeze(1)] = self._shared_read(s.src, s.index, sc).to(flat.dtype)
            return
        arr, key, element = self._local_ref(s.src, s.index, sc)
        if element:
            flat[offs.squeeze(1)] = arr[key].to(flat.dtype)
        else:
            flat[offs] = arr[(*key, slice(0, s.width))].to(flat.dtype)

    def atomic_add(self, s: K.AtomicAdd, sc: _Scope) -> None:
        flat = self.values[s.ptr]
        n = sc.count(self.P)
        off = self.ev(s.offset, sc)
        off = off if isinstance(off, torch.Tensor) else torch.full((n,), int(off))
        val = self.ev(s.value, sc)
        val = (val if isinstance(val, torch.Tensor) else torch.full((n,), int(val))).to(flat.dtype)
        if self.races is not None:
            self.races.atomic(s.ptr, off, self._rows(sc))
        order = torch.argsort(off, stable=True)           # rows ascending within each address
        o, v = off[order], val[order]
        csum = torch.cumsum(v, 0) - v                      # sum of earlier rows' values...
        start = torch.ones_like(o, dtype=torch.bool)
        start[1:] = o[1:] != o[:-1]
        first = torch.cummax(torch.where(start, torch.arange(o.numel()), 0), 0).values
        before = csum - csum[first]                        # ... at the same address
        old = torch.empty_like(v)
        old[order] = (flat[o] + before).to(v.dtype)
        flat.index_add_(0, off, val)
        sc.env[s.dst] = old.to(torch.int64)

    def wait_count(self, s: K.WaitCount, sc: _Scope) -> None:
        """Every block runs in this chunk, in lockstep: what the waited-for blocks add before
        the wait is already there; a count still short would never be reached on a GPU."""
        flat = self.values[s.ptr]
        n = sc.count(self.P)
        off = self.ev(s.offset, sc)
        off = off if isinstance(off, torch.Tensor) else torch.full((n,), int(off))
        want = self.ev(s.value, sc)
        if self.races is not None:
            self.races.wait(s.ptr, off, self._rows(sc))
        short = flat[off].to(torch.int64) < (want if isinstance(want, torch.Tensor) else int(want))
        if bool(short.any()):
            raise KernelRaceError(f"{self.k.name}: a block waits for a count the launch never "
                                  "reaches (it would spin forever)")

    # ---- expressions ----------------------------------------------------------------------
    def ev(self, x, sc: _Scope):
        if isinstance(x, K.Var):
            val = sc.env[x.name]
            if "v" in sc.env and isinstance(val, torch.Tensor) and val.dim() == 1:
                val = val.unsqueeze(1)   # a per-thread value (hoisted out of the lanes loop)
            return val
        if isinstance(x, K.Const):
            return x.value
        if isinstance(x, K.Special):
            val = sc.env[x.name]
            if "v" in sc.env and isinstance(val, torch.Tensor) and val.dim() == 1:
                val = val.unsqueeze(1)
            return val
        if isinstance(x, K.Bin):
            return _BIN[x.op](self.ev(x.a, sc), self.ev(x.b, sc))
        if isinstance(x, K.ArrayRef):
            if x.name in self.shared:
                return self._shared_read(x.name, x.index, sc)
            arr, key, _ = self._local_ref(x.name, x.index, sc)
            val = arr[key]
            if not any(isinstance(i, slice) for i in key[1:]) and "v" in sc.env:
                val = val.unsqueeze(1)
            return val
        if isinstance(x, K.Convert):
            return convert_value(x, self.ev(x.arg, sc))
        if isinstance(x, K.Op):
            return apply_op(x, [self.ev(a, sc) for a in x.args])
        if isinstance(x, K.Shfl):
            return self.shfl(x, sc)
        if isinstance(x, K.RemoteRef):
            return self._remote_read(x, sc)
        if isinstance(x, K.Ballot):
            return self.ballot(x, sc)
        if isinstance(x, K.Elem):
            off = self.ev(x.offset, sc)
            if self.races is not None:
                self.races.read(x.ptr, off, self._rows(sc))
            return self.values[x.ptr][off] if isinstance(off, torch.Tensor) \
                else self.values[x.ptr][int(off)].item()
        if isinstance(x, K.CheckedIndex):
            v, n = self.ev(x.value, sc), self.ev(x.size, sc)
            bad = (v < 0) | (v >= n)
            if bool(bad.any()) if isinstance(bad, torch.Tensor) else bad:
                first = v[bad].flatten()[0] if isinstance(v, torch.Tensor) else v
                raise IndexError(f"{self.k.name}: {x.text}: {int(first)}")
            return v
        raise TypeError(f"cannot evaluate {x!r}")


def _and(a, b):
    return (a and b) if isinstance(a, bool) and isinstance(b, bool) else a & b


def _or(a, b):
    return (a or b) if isinstance(a, bool) and isinstance(b, bool) else a | b


_BIN = {
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "/": lambda a, b: a // b,      # index math: non-negative operands, so C's / is floor
    "%": lambda a, b: a % b, "<": lambda a, b: a < b, "<=": lambda a, b: a <= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b, "&&": _and, "||": _or,
    "^": lambda a, b: a ^ b, "&": lambda a, b: a & b, "<<": lambda a, b: a << b,
}


def run(plan, inputs, outputs, bindings, params=None, workspaces=None) -> None:
    """Interpret `plan`'s kernel on the tensors of `inputs` (the fusion's, scalars skipped) and
    `outputs`, plus the workspaces the plan asks for (`workspaces`, or fresh ones). `params`:
    the packed values of the kernel's parameters, where the runtime made them (the values of
    sources only the runtime knows, such as random-number seeds, come from there)."""
    tensors = plan.kernel_tensors(inputs, outputs)
    cfg = plan.kernel.launch_config(bindings, tensors)
    if 0 in cfg.grid:
        return
    if workspaces is None:
        workspaces = plan.workspaces(bindings, tensors, torch.device("cpu"))
    Interpreter(plan, tensors + list(workspaces), bindings, params).run(cfg)
