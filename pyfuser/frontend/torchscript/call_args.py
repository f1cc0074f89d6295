"""Binding a call's arguments to a fused graph's inputs: keywords and defaults.

A graph's inputs are positional. `Binder.from_object(obj, module)` reads the parameters of the
PyTorch object `pyfuser.jit` was given through torch's own API (a ScriptFunction's `schema`, a
ScriptModule's `forward.schema`, `self` left out) or, for a plain Python function, Python's
`inspect.signature`; `bind(args, kwargs)` returns the positional inputs: keywords placed by
name, missing trailing ones filled with their defaults, as a Python call would.

Invariant: the result has exactly one value per parameter; anything a Python call would reject
(a missing argument without a default, an unknown keyword, one given twice, too many) is a
one-line PyfuserError naming the function and the argument.
"""
from __future__ import annotations

import inspect

import torch

from ...errors import PyfuserError

_NO_DEFAULT = object()


class Binder:
    def __init__(self, name: str, params: list):
        self.name = name
        self.params = params                       # [(name, default or _NO_DEFAULT)]
        self.names = [p for p, _ in params]
        self.index = {p: i for i, p in enumerate(self.names)}
        self.count = len(params)

    @classmethod
    def from_object(cls, obj, module=None):
        """The Binder of `obj`'s parameters, or None where they cannot be read (IR text)."""
        if module is not None and hasattr(module, "forward"):
            schema = getattr(module.forward, "schema", None)
            return cls._from_schema(schema, skip_self=True) if schema is not None else None
        schema = getattr(obj, "schema", None)
        if isinstance(obj, torch.jit.ScriptFunction) and schema is not None:
            return cls._from_schema(schema, skip_self=False)
        if callable(obj) and not isinstance(obj, torch.nn.Module):
            try:
                sig = inspect.signature(obj)
            except (TypeError, ValueError):
                return None
            params = []
            for p in sig.parameters.values():
                if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                    return None
                params.append((p.name, _NO_DEFAULT if p.default is p.empty else p.default))
            return cls(getattr(obj, "__name__", "function"), params)
        return None

    @classmethod
    def _from_schema(cls, schema, skip_self: bool):
        args = list(schema.arguments)[1 if skip_self else 0:]
        params = [(a.name, a.default_value if a.has_default_value() else _NO_DEFAULT)
                  for a in args]
        return cls(schema.name, params)

    def bind(self, args: tuple, kwargs: dict) -> tuple:
        n = len(self.params)
        if len(args) > n:
            raise PyfuserError(f"{self.name}() takes {n} arguments, got {len(args)}")
        out = list(args) + [_NO_DEFAULT] * (n - len(args))
        for k, v in kwargs.items():
            i = self.index.get(k)
            if i is None:
                raise PyfuserError(f"{self.name}() got an unexpected keyword argument '{k}'")
            if i < len(args):
                raise PyfuserError(f"{self.name}() got multiple values for argument '{k}'")
            out[i] = v
        for i, v in enumerate(out):
            if v is _NO_DEFAULT:
                d = self.params[i][1]
                if d is _NO_DEFAULT:
                    raise PyfuserError(f"{self.name}() missing required argument "
                                       f"'{self.names[i]}'")
                out[i] = d
        return tuple(out)
