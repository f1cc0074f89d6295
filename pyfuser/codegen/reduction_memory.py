"""Where a reduction-family kernel's elements live, and how they move: the register buffers of
loaded vectors, the shared-memory buffers of staged loads, the loads and stores of a schedule's
accesses, and the workspaces of a grid reduction (a mixin of ReductionLowering, which provides
the names, pointers, offsets and the kind's `position`).

Invariants:
- a buffer is a row of V lanes per step ([steps][V]; half / bfloat16 vectors two to a register);
- a staged load (ReductionParams.stage) lives in shared memory [steps][bdimy][bdimx][V], filled
  by `cp.async` copies all issued before one AsyncWait (pass_long_loads); a thread reads back only
  the vectors it copied, inside a step (at_step), with one vector read a step, so no barrier is
  needed and no element is read one at a time from shared memory;
- a load a later pass of a streamed kernel reads again asks L2 to keep it (evict_last);
- with ReductionParams.prefetch the staged copies are not issued in their pass but collected
  (`prefetched`) for the inner kernel, which issues them one row ahead.
"""
from __future__ import annotations

from . import kernel_ir as K


def _c(v):
    return K.Const(int(v), "nidx_t")


def _guard(cond, body):
    return [K.If(cond, body)] if cond is not None else body


class ReductionMemory:
    """Buffers, loads, stores and workspaces of ReductionLowering (module docstring)."""

    def load_value(self, a, index):
        return self.load_value_named(self.buf(a), a, index)

    @staticmethod
    def load_value_named(name, a, index):
        dt = a.tv.dtype
        return K.Convert("load", K.ArrayRef(name, index), dt, dt)

    def workspace(self, dtype, kind: str) -> str:
        """A global buffer the runtime provides for a launch, after the outputs: a pointer
        parameter named ws<i>; `kind` is "partials" or "semaphores" (see reduction_launch.workspace_fn)."""
        i = len(self.workspaces)
        name = f"ws{i}"
        seg = len(self.s.fusion.tensor_inputs()) + len(self.s.fusion.outputs) + i
        self.tensors[name] = K.TensorParam(name, dtype, seg, True)
        self._param(self.ptr_params, name, "void*", ("ptr", seg))
        self.workspaces.append((name, dtype, kind))
        return name

    def buf(self, a) -> str:
        return self.names[("buf", id(a.node))]

    def load_stmt(self, a, index: tuple, off, q=None):
        """Load of access `a` into its buffer at `index` (a row of V lanes, or one for bcast);
        `q`: the pass of a streamed kernel loading it (a load that a later pass reads again
        asks L2 to keep it: evict_last instead of the schedule's evict_first)."""
        guard = self.in_bounds(a.node.key) if not a.node.affine else None
        load = self._load(a, index, off, q)
        # a pad's or cat's operand outside its range (reduction_resize): no load; the pad /
        # cat node discards the value
        return load if guard is None else K.If(guard, [load])

    def _load(self, a, index: tuple, off, q):
        p = self.ptr(a)
        if id(a.node) in self.staged and len(index) == 1:      # a held step, into shared memory
            return K.Load(self.buf(a), self.staged_index(index[0]), p, off, self.V, None, "", True)
        if a.mode == "vector":
            cache = a.cache
            if cache == "ef" and q is not None and any(
                    any(n is a.node for n in self.plans[later][2])
                    for later in range(q + 1, len(self.plans))):
                cache = "el"
            return K.Load(self.buf(a), index, p, off, self.V, None, cache)
        if a.mode == "strided" and self.V > 1:
            inner = self.p.groups[-1][-1]
            return K.Load(self.buf(a), index, p, off, self.V, self.stride(a, a.eff[inner][1]))
        return K.Load(self.buf(a), index, p, off, 1)

    def buffer(self, a, steps: int) -> K.Alloc:
        """The register buffer of load `a`: `steps` rows of V lanes; half / bfloat16 vectors
        are kept two to a register (half the registers of one element each)."""
        packed = self.packs(a, False)
        if packed:
            self.packed_bufs.add(self.buf(a))
        return K.Alloc(self.buf(a), a.tv.dtype, (steps, self.V), packed=packed)

    def packs(self, a, staged: bool) -> bool:
        """Whether load a's register buffer (`staged`: a staged vector's local copy) holds
        its 2-byte elements two to a 32-bit word."""
        return a.tv.dtype.itemsize == 2 and self.V % 2 == 0 and (staged or a.mode == "vector")

    def staged_copy(self, a) -> str:
        """The name of the local copy of a staged load's vector a step reads."""
        return f"{self.buf(a)}_x"

    def packed_lane(self, x, lets: list):
        """(packed array, its index without the lane, its dtype) where value `x` (given the Lets
        `lets` it was computed by) is lane v of a packed buffer read as it is: a load's conversion,
        exact widening casts and copies only; half and bfloat16 only (a 2-byte integer buffer is
        packed too); else None."""
        defs = {s.name: s.expr for s in lets if isinstance(s, K.Let)}
        while True:
            if isinstance(x, K.Var) and x.name in defs:
                x = defs[x.name]
            elif isinstance(x, K.Convert) and x.kind == "cast" and x.src.itemsize == 2 and \
                    x.src.is_floating and x.dst.itemsize >= 4 and x.dst.is_floating:
                x = x.arg
            else:
                break
        if not (isinstance(x, K.Convert) and x.kind == "load" and isinstance(x.arg, K.ArrayRef)):
            return None
        ref = x.arg
        if not ref.index or ref.index[-1] != K.Var("v"):
            return None
        for a in self.loads:
            # a buffer `buffer` allocated packed (a load's name may also be an unpacked row
            # value's array or a staged shared array), or a staged vector's packed copy
            if a.tv.dtype.is_reduced_float and (
                    (ref.name == self.buf(a) and ref.name in self.packed_bufs) or
                    (ref.name == self.staged_copy(a) and id(a.node) in self.staged
                     and self.packs(a, True))):
                return ref.name, tuple(ref.index[:-1]), a.tv.dtype
        return None

    def buffers(self, loads, steps: int) -> list:
        """The register buffers of `loads` (`buffer`), one for the operands of a cat that
        share one (ReductionSchedule.shared)."""
        out, seen = [], set()
        for a in loads:
            if self.buf(a) not in seen:
                seen.add(self.buf(a))
                out.append(self.buffer(a, steps))
        return out

    def lane_index(self, a, step, lane=None) -> tuple:
        """Index of lane `lane` (default v) of load `a`'s buffer at `step` (None: a buffer
        without steps)."""
        lane = _c(0) if a.mode == "bcast" or self.V == 1 else (lane or K.Var("v"))
        assert step is None or id(a.node) not in self.staged, "staged loads: staged_value"
        return (lane,) if step is None else (step, lane)

    def staged_value(self, a, step, lane):
        """Lane `lane` of staged load `a` at `step`: read from the step's local copy of this
        thread's vector, which at_step makes with one vector read of shared memory (element reads
        of shared memory compiled to one 16- or 32-bit load each: 8 times the shared-memory
        wavefronts of bfloat16 softmax's row)."""
        assert self.staged_reads is not None, "a staged buffer is read inside a step only"
        name = self.staged_copy(a)
        self.staged_reads[name] = (a, step)
        lane = _c(0) if self.V == 1 else (lane or K.Var("v"))
        return self.load_value_named(name, a, (lane,))

    def staged_index(self, step) -> tuple:
        """This thread's row of V lanes at `step` of a staged buffer [steps][bdimy][bdimx][V]
        (neighbouring threads' vectors are neighbours: no bank conflicts)."""
        return (step, K.Special("threadIdx.y"), K.Special("threadIdx.x"))

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
            inner = self.p.groups[-1][-1]
            st = K.Store(p, off, w, (), self.V, self.stride(a, a.eff[inner][1]))
        else:
            st = K.Store(p, off, w, (), 1)
        return inside, [st]

    def at_step(self, pos, body_fn) -> list:
        """Statements of one step at position `pos` (the kind's position lets, guarded body)."""
        lets, cond, inner, idx = self.position(pos)
        inner = inner + self.resize_lets(idx, reduced=True)    # bounds along reduced axes
        outer, self.staged_reads = self.staged_reads, {}
        try:
            body = body_fn(idx)
            reads = self.staged_reads
        finally:
            self.staged_reads = outer
        copies: list = []
        for name, (a, step) in reads.items():     # staged vectors read here: one vector read each
            # half / bfloat16 as 32-bit words, as register buffers are: a 16-bit element array
            # cost an odd element two or three instructions (extract, move, shift) where a word's
            # upper half takes one (bfloat16 layer_norm 1024x65536: 15 -> 8 a step of 8 to sum)
            copies += [K.Alloc(name, a.tv.dtype, (self.V,), packed=self.packs(a, True)),
                       K.VecCopy(name, (), self.buf(a), self.staged_index(step), self.V)]
        return lets + _guard(cond, inner + copies + body)

    def pass_long_loads(self, q) -> list:
        """Persistent: the buffers [steps][V] of the loads held from pass q on, loaded (staged
        ones: shared [steps][bdimy][bdimx][V], by async copies all in flight, then waited for)."""
        out = []
        s = K.Var("s")
        staged = False
        allocated: set = set()
        for a in self.loads:
            if self.pass_long.get(id(a.node)) == q:
                copies = self.unroll("s", self.p.steps, self.at_step(
                    self.step_expr(s, False), lambda idx, a=a: [self.load_stmt(a, (s,), self.offset(a, idx))]))
                if id(a.node) in self.staged:
                    staged = True
                    p = self.p
                    self.shared.append(K.Alloc(self.buf(a), a.tv.dtype,
                                               (p.steps, p.bdimy, p.bdimx, self.V), "shared"))
                    if getattr(p, "prefetch", False):   # issued for this row at the end of the
                        self.prefetched.append(copies)  # last one (InnerKernel.kernel_body)
                        continue
                elif self.buf(a) not in allocated:
                    allocated.add(self.buf(a))
                    out.append(self.buffer(a, self.p.steps))
                out.append(copies)
        if staged:
            out.append(K.AsyncWait())      # every copy in flight at once, then this thread's landed
        for nid, (name, first) in self.kept.items():
            if first == q:
                node = next(n for n in self.g.nodes if id(n) == nid)
                out.append(K.Alloc(name, node.tv.dtype.compute, (self.p.steps, self.V)))
        return out
