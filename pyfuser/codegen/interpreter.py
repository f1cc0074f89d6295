"""CPU interpreter of kernel IR: runs a generated kernel's logic with torch, every thread at once.

The grid of the plan's LaunchConfig is processed in chunks of blocks; within a chunk every thread
is one row of torch tensors (index values are int64 tensors of shape [threads], lane values
[threads, V]). Loads and stores go through flat views of the real tensors' storage with the
kernel's own offsets, so indexing bugs show up as wrong results exactly as on a GPU.

Semantics mirror the CUDA printer: `If` and grid-stride loops narrow the set of active threads
(the body runs on the compacted subset, so inactive threads never evaluate anything), unrolled
loops run in Python, the lanes loop is a tensor dimension (values hoisted out of it, per thread or per unrolled step,
are [threads] tensors and broadcast over the lanes). Op values come from the op table's
PyTorch reference in the op's register type (half/bf16 compute in float32 and are rounded where
the kernel rounds).
"""
from __future__ import annotations

import torch

from ..ir.ops import OPS
from . import kernel_ir as K

ELEMENT_BUDGET = 1 << 22          # elements (threads x unroll x vector) per chunk
SCALAR_ARG_OPS = {"leaky_relu": (1,), "softplus": (1, 2), "hardtanh": (1, 2), "threshold": (1, 2),
                  "addcmul": (3,)}


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


class Interpreter:
    def __init__(self, plan, tensors, bindings):
        self.k: K.Kernel = plan.kernel_ir
        self.values = {}
        for p in self.k.params:
            src = p.source
            if src[0] == "ptr":
                self.values[p.name] = _flat(tensors[src[1]])
            elif src[0] == "size":
                self.values[p.name] = int(tensors[src[1]].shape[src[2]])
            elif src[0] == "stride":
                self.values[p.name] = int(tensors[src[1]].stride(src[2]))
            elif src[0] == "numel":
                self.values[p.name] = int(tensors[src[1]].numel())
            else:
                self.values[p.name] = bindings.value(src[1])
        self.arrays: dict = {}

    # ---- driving --------------------------------------------------------------------------
    def run(self, cfg) -> None:
        gx, gy, _ = cfg.grid
        T = cfg.block[0]
        per_thread = max(1, max((s.width for s in self.k.walk() if isinstance(s, (K.Load, K.Store))),
                                default=1)) * max((s.stop.value for s in self.k.walk()
                                                   if isinstance(s, K.Loop) and s.kind == "unroll"),
                                                  default=1)
        nblocks = gx * gy
        chunk = max(1, ELEMENT_BUDGET // (T * per_thread))
        for b0 in range(0, nblocks, chunk):
            lin = torch.arange(b0, min(nblocks, b0 + chunk), dtype=torch.int64)
            nb = lin.shape[0]
            env = dict(self.values)
            env["blockIdx.x"] = (lin % gx).repeat_interleave(T)
            env["blockIdx.y"] = (lin // gx).repeat_interleave(T)
            env["threadIdx.x"] = torch.arange(T, dtype=torch.int64).repeat(nb)
            env["gridDim.x"], env["gridDim.y"] = gx, gy
            self.arrays = {}
            self.P = nb * T
            self.exec(self.k.body, _Scope(env, None))

    # ---- statements -----------------------------------------------------------------------
    def exec(self, stmts, sc: _Scope) -> None:
        for s in stmts:
            if isinstance(s, K.Let):
                sc.env[s.name] = self.ev(s.expr, sc)
            elif isinstance(s, K.Alloc):
                self.arrays[s.name] = torch.zeros((self.P, *s.dims), dtype=s.dtype.torch)
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
                arr = self.arrays[s.name]
                val = self.ev(s.expr, sc)
                idx = self._index(s.index, sc)
                target = arr[(sc.rows, *idx)]
                if isinstance(val, torch.Tensor):
                    val = val.to(arr.dtype).expand_as(target)
                arr[(sc.rows, *idx)] = val

    def loop(self, s: K.Loop, sc: _Scope) -> None:
        if s.kind == "grid":
            cur = self.ev(s.start, sc)
            stop, step = self.ev(s.stop, sc), self.ev(s.step, sc)
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

    def _index(self, index, sc) -> tuple:
        out = []
        for i in index:
            if isinstance(i, K.Var) and i.name == "v":
                out.append(slice(None))
            else:
                out.append(int(self.ev(i, sc)))
        return tuple(out)

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

    def load(self, s: K.Load, sc: _Scope) -> None:
        flat = self.values[s.ptr]
        offs = self._offsets(s, sc)
        arr = self.arrays[s.dst]
        arr[(sc.rows, *self._index(s.index, sc), slice(0, s.width))] = flat[offs]

    def store(self, s: K.Store, sc: _Scope) -> None:
        flat = self.values[s.ptr]
        offs = self._offsets(s, sc)
        arr = self.arrays[s.src]
        flat[offs] = arr[(sc.rows, *self._index(s.index, sc), slice(0, s.width))]

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
            return sc.env[x.name]
        if isinstance(x, K.Bin):
            a, b = self.ev(x.a, sc), self.ev(x.b, sc)
            if x.op == "+":
                return a + b
            if x.op == "-":
                return a - b
            if x.op == "*":
                return a * b
            if x.op == "/":
                return a // b     # index math: non-negative operands, so C's / is floor
            if x.op == "%":
                return a % b
            if x.op == "<":
                return a < b
            if x.op == "&&":
                return a & b
            raise AssertionError(x.op)
        if isinstance(x, K.ArrayRef):
            arr = self.arrays[x.name]
            idx = self._index(x.index, sc)
            val = arr[(sc.rows, *idx)]
            if not any(isinstance(i, slice) for i in idx) and "v" in sc.env:
                val = val.unsqueeze(1)
            return val
        if isinstance(x, K.Convert):
            return self.convert(x, self.ev(x.arg, sc))
        if isinstance(x, K.Op):
            return self.op(x, [self.ev(a, sc) for a in x.args])
        raise TypeError(f"cannot evaluate {x!r}")

    @staticmethod
    def convert(x: K.Convert, v):
        scalar = not isinstance(v, torch.Tensor)
        if x.kind == "cast" and scalar:
            v = torch.tensor(v, dtype=x.src.compute.torch)
        if x.kind == "load":
            out = v.float() if x.src.is_reduced_float else v
        elif x.kind == "store":
            out = v.to(x.dst.torch)
        elif x.kind == "round":
            out = (torch.tensor(v, dtype=torch.float32) if scalar else v).to(x.dst.torch).float()
        else:
            out = v.to(x.dst.torch)
            if x.dst.is_reduced_float:
                out = out.float()
        if scalar and isinstance(out, torch.Tensor):
            return out.item()
        return out

    @staticmethod
    def op(x: K.Op, args):
        info = OPS[x.name]
        reg = x.compute.compute.torch
        if not any(isinstance(a, torch.Tensor) for a in args):
            targs = [torch.tensor(a, dtype=torch.bool if i == 0 and x.name == "where" else reg)
                     for i, a in enumerate(args)]
            return info.ref(*targs).item()
        keep_scalar = SCALAR_ARG_OPS.get(x.name, ())
        targs = []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) or i in keep_scalar:
                targs.append(a)
            else:
                dt = torch.bool if (x.name == "where" and i == 0) else reg
                targs.append(torch.tensor(a, dtype=dt))
        return info.ref(*targs)


def run(plan, inputs, outputs, bindings) -> None:
    from ..ir.tensor import TensorView
    tensors = [x for v, x in zip(plan.schedule.orig.inputs, inputs) if isinstance(v, TensorView)]
    tensors.extend(outputs)
    cfg = plan.kernel.launch_config(bindings, tensors)
    if 0 in cfg.grid:
        return
    Interpreter(plan, tensors, bindings).run(cfg)
