"""Calling a TorchScript operator through `torch.ops` with positional IR arguments.

The IR passes every argument positionally, keyword-only ones included, and its text never names
the overload. `resolve(kind, args)` scores each non-`out` schema of `kind` against the runtime
values (exact type 3, convertible 1-2, misfit rejects) and picks the best (earliest on ties),
preferring schemas with exactly as many parameters as arguments (TorchScript passes them all);
`call_op` then passes positional parameters positionally and keyword-only ones by name,
converting Device arguments through the run's device map. Results: tuple -> list, None with
no declared return -> [], else [result]. Resolutions are cached per (kind, argument kinds).
`out_schema(kind, name)`: the `out=` variant a node read from a torch graph names (torch's
node API gives the overload it matched), which `resolve` never picks.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Optional

import torch


@functools.lru_cache(maxsize=None)
def _all_schemas(kind: str) -> tuple:
    try:
        return tuple(torch._C._jit_get_schemas_for_operator(kind))
    except Exception:
        return ()


def is_out_variant(schema) -> bool:
    """Whether `schema` writes a caller's `out=` tensor."""
    return any(a.is_out for a in schema.arguments)


@functools.lru_cache(maxsize=None)
def schemas(kind: str) -> tuple:
    """Schemas of `kind` without the `out=` variants."""
    return tuple(s for s in _all_schemas(kind) if not is_out_variant(s)
                 and s.overload_name != "out" and not s.overload_name.endswith("_out"))


@functools.lru_cache(maxsize=None)
def out_schema(kind: str, overload_name: Optional[str]):
    """The `out=` variant of `kind` named `overload_name` (the overload torch matched for a node
    read through torch's API, node.overload), or None: `resolve` never picks one (the IR passes
    `out` positionally, where `add(x, y, alpha, out)` would fit no other schema, and
    `min(a, out=b)` would look like `min(a, b)`), so a node that names one runs that one."""
    if not overload_name:
        return None
    return next((s for s in _all_schemas(kind) if s.overload_name == overload_name
                 and is_out_variant(s)), None)


def _fit(v: Any, t) -> int:
    k = t.kind()
    if k == "OptionalType":
        return 2 if v is None else _fit(v, t.getElementType())
    if k == "TensorType":
        return 3 if isinstance(v, torch.Tensor) else 0
    if isinstance(v, torch.Tensor):
        return 1 if k in ("AnyType", "VarType") else 0
    if k in ("IntType", "SymIntType"):
        if isinstance(v, bool):
            return 0
        return 3 if isinstance(v, int) else (2 if isinstance(v, (torch.dtype, torch.layout,
                                                                 torch.memory_format)) else 0)
    if k in ("FloatType", "SymFloatType"):
        return 3 if isinstance(v, float) else (1 if isinstance(v, int) and not isinstance(v, bool) else 0)
    if k in ("BoolType", "SymBoolType"):
        return 3 if isinstance(v, bool) else 0
    if k == "NumberType":
        return 2 if isinstance(v, (int, float, complex)) else 0
    if k == "ComplexType":
        return 3 if isinstance(v, complex) else (1 if isinstance(v, (int, float)) else 0)
    if k == "StringType":
        return 3 if isinstance(v, str) else 0
    if k == "DeviceObjType":
        return 3 if isinstance(v, torch.device) else (2 if isinstance(v, str) else 0)
    if k == "ListType":
        if not isinstance(v, (list, tuple)):
            return 0
        if not v:
            return 2
        return min(_fit(e, t.getElementType()) for e in v)
    if k == "TupleType":
        return 2 if isinstance(v, tuple) else 0
    if k == "NoneType":
        return 3 if v is None else 0
    if k == "GeneratorType":
        return 2 if v is None or isinstance(v, torch.Generator) else 0
    return 1


def _score(schema, args: list) -> Optional[int]:
    params = schema.arguments
    if len(args) > len(params):
        return None
    if any(not p.has_default_value() for p in params[len(args):]):
        return None
    total = 0
    for v, p in zip(args, params):
        s = _fit(v, p.type)
        if s == 0:
            return None
        total += s
    return total


def fits(schema, args: list) -> bool:
    """Whether the runtime `args` fit `schema` (as `resolve` scores them)."""
    return _score(schema, args) is not None


def _arg_key(v: Any):
    if isinstance(v, torch.Tensor):
        return "T"
    if isinstance(v, (list, tuple)):
        return (type(v).__name__,) + tuple(sorted({_arg_key(e) for e in v}, key=str))
    return type(v).__name__


_CACHE: dict = {}


def resolve(kind: str, args: list):
    """The best-fitting schema for the runtime args, or None."""
    key = (kind, tuple(_arg_key(a) for a in args))
    if key in _CACHE:
        return _CACHE[key]
    best, best_score = None, (False, -1)
    for s in schemas(kind):
        sc = _score(s, args)
        # TorchScript passes every argument, defaults included: a schema with exactly as many
        # parameters as arguments is the one the graph was made with (`addmm` with 5, not
        # `addmm.dtype`, whose `out_dtype` an int `beta` would fit better).
        rank = (len(s.arguments) == len(args), sc if sc is not None else -1)
        if sc is not None and rank > best_score:
            best, best_score = s, rank
    _CACHE[key] = best
    return best


def _is_device_param(t) -> bool:
    k = t.kind()
    if k == "OptionalType":
        return _is_device_param(t.getElementType())
    return k == "DeviceObjType"


def call_op(kind: str, args: list, map_device: Callable, schema=None) -> list:
    """Run `kind` through torch.ops (with `schema` when the caller resolved it already); raises
    LookupError when no overload fits."""
    if schema is None:
        schema = resolve(kind, args)
    if schema is None:
        sigs = "; ".join(str(s) for s in schemas(kind)[:6]) or "no schemas known"
        types = ", ".join(_describe(a) for a in args)
        raise LookupError(f"no overload of {kind} takes ({types}); candidates: {sigs}")
    op, params, one, none = _layout(kind, schema)
    pos, kw = [], {}
    for v, (name, kw_only, device) in zip(args, params):
        if device and v is not None:
            v = map_device(torch.device(v))
        if kw_only:
            kw[name] = v
        else:
            pos.append(v)
    result = op(*pos, **kw)
    if isinstance(result, (tuple, list)) and not one:
        return list(result)
    if result is None and none:
        return []
    return [result]


_LAYOUTS: dict = {}


def _layout(kind: str, schema):
    """(OpOverload, per parameter (name, keyword-only, a Device), one return, no return); cached
    by the schema's identity (schemas() hands out the same objects; they do not all hash)."""
    got = _LAYOUTS.get(id(schema))
    if got is None or got[0] is not schema:
        params = tuple((p.name, p.kwarg_only, _is_device_param(p.type)) for p in schema.arguments)
        got = _LAYOUTS[id(schema)] = (schema, overload(kind, schema), params,
                                      len(schema.returns) == 1, not schema.returns)
    return got[1:]


def overload(kind: str, schema):
    """The torch.ops OpOverload of `kind` for `schema`."""
    ns, name = kind.split("::", 1)
    packet = getattr(getattr(torch.ops, ns), name)
    return getattr(packet, schema.overload_name or "default")


def is_device_param(t) -> bool:
    return _is_device_param(t)


def _describe(v: Any) -> str:
    if isinstance(v, torch.Tensor):
        return f"Tensor[{v.dtype}, {tuple(v.shape)}]"
    if isinstance(v, (list, tuple)):
        return f"{type(v).__name__}[{', '.join(_describe(e) for e in v[:3])}]"
    return type(v).__name__


def arg_names(kind: str, index: int) -> set:
    """Names of parameter `index` across the schemas of `kind` (for make_inputs' heuristics)."""
    return {s.arguments[index].name for s in schemas(kind) if len(s.arguments) > index}
