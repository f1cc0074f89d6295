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


# what deep_clone does with an object of a class, looked up once per class: a copy is mostly
# attribute values and list items, so an atomic one is stored as it is, without a call (a third
# less time copying the segmenter's groups than a call per value); so are an empty list and a
# list item copied (or cut) already, found in the memo without a call
_ATOM, _LIST, _DICT, _TUPLE, _OBJ, _OTHER = range(6)
_KIND: dict = {}      # class -> one of the kinds above
_ABSENT = object()


def _kind(cls) -> int:
    """The kind of a class not yet in _KIND, stored there."""
    k = (_ATOM if cls in _ATOMIC or issubclass(cls, enum.Enum) else
         _LIST if cls is list else _DICT if cls is dict else _TUPLE if cls is tuple else
         _OBJ if _plain(cls) else _OTHER)
    _KIND[cls] = k
    return k


def _clone(obj, memo):
    i = id(obj)
    c = memo.get(i, _ABSENT)
    if c is not _ABSENT:
        return c
    cls = type(obj)
    k = _KIND.get(cls)
    if k is None:
        k = _kind(cls)
    if k == _OBJ:
        new = cls.__new__(cls)
        memo[i] = new
        state = new.__dict__
        for name, v in obj.__dict__.items():
            kv = _KIND.get(type(v))
            if kv == _ATOM:
                state[name] = v
            elif kv == _LIST and not v:       # an empty list (most `uses` of a group's copy)
                c = memo.get(id(v), _ABSENT)
                if c is _ABSENT:
                    c = memo[id(v)] = []
                state[name] = c
            else:
                state[name] = _clone(v, memo)
        return new
    if k == _LIST:
        c = []
        memo[i] = c
        for x in obj:                         # items copied already (or cut: None) looked up here
            if _KIND.get(type(x)) == _ATOM:
                c.append(x)
            else:
                y = memo.get(id(x), _ABSENT)
                c.append(_clone(x, memo) if y is _ABSENT else y)
        return c
    if k == _ATOM:
        return obj
    if k == _DICT:
        d: dict = {}
        memo[i] = d
        for key, v in obj.items():
            d[_clone(key, memo)] = _clone(v, memo)
        return d
    if k == _TUPLE:
        t = tuple([_clone(x, memo) for x in obj])
        if i in memo:               # a cycle through the tuple made it already
            return memo[i]
        memo[i] = t
        return t
    return copy.deepcopy(obj, memo)
