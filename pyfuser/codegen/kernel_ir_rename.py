"""Renaming kernel IR: a copy of statements or expressions with names and special registers
replaced, for lowerings that place one piece of kernel IR twice in a kernel.

`Rename(name, specials)`: `name(n)` gives the new name of every name the tree mentions (Vars,
Lets, arrays, pointers, loop indices); `specials` maps a Special's name to the expression that
replaces it (a Special not in it stays, unless `strict`, which refuses it: the caller's
SchedulerError). Uses: horizontal_lowering.py (each component's body under its own prefix, its
blockIdx / gridDim read from the component's block range) and reduction_kernels.py (a row's
staged copies issued again for the next row, under the next row's names).

Invariants: the copy shares no mutable part with the original (statements are rebuilt, bodies
are new lists; expressions are immutable); the lanes index `v`, which the interpreter knows by
name, is never renamed; statement and expression kinds this module does not know are refused
(a new kind of kernel IR must be added here before a lowering copies it).
"""
from __future__ import annotations

import dataclasses

from ..errors import SchedulerError
from . import kernel_ir as K

LANE_VAR = "v"


class Rename:
    def __init__(self, name, specials: dict | None = None, strict: bool = False,
                 what: str = "kernel IR"):
        self._name, self.specials, self.strict, self.what = name, specials or {}, strict, what

    def name(self, n: str) -> str:
        return n if n == LANE_VAR else self._name(n)

    def e(self, x):
        """A renamed copy of expression `x` (None stays None)."""
        if isinstance(x, K.Var):
            return K.Var(self.name(x.name))
        if isinstance(x, K.Special):
            if x.name in self.specials:
                return self.specials[x.name]
            if self.strict:
                raise SchedulerError(f"{self.what}: a renamed body reads {x.name}")
            return x
        if isinstance(x, K.Bin):
            return K.Bin(x.op, self.e(x.a), self.e(x.b))
        if isinstance(x, K.ArrayRef):
            return K.ArrayRef(self.name(x.name), tuple(self.e(i) for i in x.index))
        if isinstance(x, K.Op):
            return K.Op(x.name, tuple(self.e(a) for a in x.args), x.compute)
        if isinstance(x, K.Convert):
            return K.Convert(x.kind, self.e(x.arg), x.src, x.dst)
        if isinstance(x, K.Shfl):
            return K.Shfl(self.e(x.value), x.lane_xor, x.dtype)
        if isinstance(x, K.Ballot):
            return K.Ballot(self.e(x.pred))
        if isinstance(x, K.RemoteRef):
            return K.RemoteRef(self.name(x.name), tuple(self.e(i) for i in x.index), self.e(x.rank))
        if isinstance(x, K.CheckedIndex):
            return K.CheckedIndex(self.e(x.value), self.e(x.size), x.text)
        if isinstance(x, K.Elem):
            return K.Elem(self.name(x.ptr), self.e(x.offset))
        if x is None or isinstance(x, (K.Const, int, float, bool)):
            return x
        raise SchedulerError(f"{self.what}: cannot rename a {type(x).__name__}")

    def _t(self, xs):
        return tuple(self.e(i) for i in xs)

    def s(self, st):
        """A renamed copy of statement `st`."""
        R = dataclasses.replace
        if isinstance(st, K.Let):
            return R(st, name=self.name(st.name), expr=self.e(st.expr))
        if isinstance(st, K.Alloc):
            return R(st, name=self.name(st.name))
        if isinstance(st, K.Loop):
            return R(st, var=self.name(st.var), start=self.e(st.start), stop=self.e(st.stop),
                     step=self.e(st.step), body=self.block(st.body))
        if isinstance(st, K.If):
            return R(st, cond=self.e(st.cond), body=self.block(st.body))
        if isinstance(st, K.Load):
            return R(st, dst=self.name(st.dst), index=self._t(st.index), ptr=self.name(st.ptr),
                     offset=self.e(st.offset), stride=self.e(st.stride))
        if isinstance(st, K.Store):
            return R(st, ptr=self.name(st.ptr), offset=self.e(st.offset), src=self.name(st.src),
                     index=self._t(st.index), stride=self.e(st.stride))
        if isinstance(st, K.Assign):
            return R(st, name=self.name(st.name), index=self._t(st.index), expr=self.e(st.expr))
        if isinstance(st, K.VecCopy):
            return R(st, dst=self.name(st.dst), dst_index=self._t(st.dst_index),
                     src=self.name(st.src), src_index=self._t(st.src_index))
        if isinstance(st, K.PackedFill):
            return R(st, dst=self.name(st.dst))
        if isinstance(st, K.PackedOp):
            return R(st, dst=self.name(st.dst), src=self.name(st.src),
                     src_index=self._t(st.src_index))
        if isinstance(st, K.AtomicAdd):
            return R(st, dst=self.name(st.dst), ptr=self.name(st.ptr), offset=self.e(st.offset),
                     value=self.e(st.value))
        if isinstance(st, K.WaitCount):
            return R(st, ptr=self.name(st.ptr), offset=self.e(st.offset), value=self.e(st.value))
        if isinstance(st, (K.Comment, K.Sync, K.ClusterSync, K.Fence, K.AsyncWait)):
            return st
        raise SchedulerError(f"{self.what}: cannot rename a {type(st).__name__}")

    def block(self, stmts) -> list:
        return [self.s(x) for x in stmts]


def defined_names(stmts) -> set:
    """The names `stmts` define (Lets, Allocs, loop indices), nested bodies included."""
    out: set = set()
    for st in stmts:
        if isinstance(st, K.Let | K.Alloc):
            out.add(st.name)
        elif isinstance(st, K.Loop):
            out.add(st.var)
        if isinstance(st, K.Loop | K.If):
            out |= defined_names(st.body)
    return out
