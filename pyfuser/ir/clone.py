"""Deep copies of Fusion graphs, the same objects `copy.deepcopy(obj, memo)` builds, faster.

The segmenter and the schedulers copy a Fusion (or its vals and exprs) before changing it; with
copy.deepcopy that copy was a third of a warm start (a cached kernel's first call in a new
process). `deep_clone` walks the same graph with a direct path for what a Fusion is made of:
lists, tuples, dicts, atomic values (numbers, strings, enums, torch dtypes, functions, classes)
and pyfuser's own plain classes (instances with a __dict__, no __slots__ and no copy hooks),
which it rebuilds with `cls.__new__` and a copied __dict__, as deepcopy's default path does.
Everything else, including any class with __deepcopy__ / __reduce__ hooks, goes to
copy.deepcopy with the same memo, so its hooks run as before.

Invariants: `memo` maps id(original) -> copy for every object copied, as deepcopy's does
(callers use it to find the copy of an original); objects put in `memo` beforehand are shared,
not copied.
"""
from __future__ import annotations

import copy
import enum
import sys
import types

import torch

# what copy.deepcopy returns as is (bound methods are not: deepcopy copies their __self__)
_ATOMIC = {type(None), int, float, bool, str, bytes, complex, type, range, torch.dtype,
           types.FunctionType, types.BuiltinFunctionType}
_PLAIN: dict = {}     # class -> True when deep_clone may rebuild it directly
_HOOKS_ABSENT = ("__deepcopy__", "__copy__", "__setstate__")
_HOOKS_INHERITED = ("__reduce__", "__reduce_ex__", "__getstate__")


def _plain(cls) -> bool:
    ok = _PLAIN.get(cls)
    if ok is None:
        ok = (cls.__module__.startswith("pyfuser.")
              and all("__slots__" not in k.__dict__ for k in cls.__mro__[:-1])
              and not any(hasattr(cls, h) for h in _HOOKS_ABSENT)
              and all(getattr(cls, h, None) is getattr(object, h, None) for h in _HOOKS_INHERITED))
        _PLAIN[cls] = ok
    return ok


def deep_clone(obj, memo: dict):
    """copy.deepcopy(obj, memo) for Fusion graphs (see the module docstring)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 50000))
    try:
        return _clone(obj, memo)
    finally:
        sys.setrecursionlimit(old)


def _clone(obj, memo):
    i = id(obj)
    if i in memo:
        return memo[i]
    cls = type(obj)
    if cls in _ATOMIC or isinstance(obj, enum.Enum):
        return obj
    if cls is list:
        c: list = []
        memo[i] = c
        c.extend([_clone(x, memo) for x in obj])
        return c
    if cls is dict:
        d: dict = {}
        memo[i] = d
        for k, v in obj.items():
            d[_clone(k, memo)] = _clone(v, memo)
        return d
    if cls is tuple:
        t = tuple([_clone(x, memo) for x in obj])
        if i in memo:               # a cycle through the tuple made it already
            return memo[i]
        memo[i] = t
        return t
    if _plain(cls):
        new = cls.__new__(cls)
        memo[i] = new
        state = new.__dict__
        for k, v in obj.__dict__.items():
            state[k] = _clone(v, memo)
        return new
    return copy.deepcopy(obj, memo)
