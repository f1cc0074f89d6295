"""The aten-overload view of the lowering table: `torch.ops.aten.<op>.<overload>` -> its entry.

An FX graph from AOTAutograd calls OpOverloads (`aten.add.Tensor`, `aten.sum.dim_IntList`). The
overload's schema names the same aten op a TorchScript node kind does (`aten::add`), and lists
its arguments in the order TorchScript nodes list their inputs (keyword-only ones included), so
the one table of `registry.LOWERINGS` serves both frontends:

    entry = entry_for(op)                       # LOWERINGS["aten::add"], or None
    args = schema_args(op, node.args, node.kwargs)   # positional, schema defaults filled in
    entry.handler(*lowered(args))

Overloads of one op share its entry; a handler tells them apart by its arguments as it does for
TorchScript (the overload of a TorchScript node is not part of its kind either).

Invariant: nothing here knows any op's semantics; it only maps names and argument positions.
"""
from __future__ import annotations

from .registry import LOWERINGS, Lowering


def schema_name(op) -> str | None:
    """"aten::add" for torch.ops.aten.add.Tensor; None for anything that is not an OpOverload."""
    schema = getattr(op, "_schema", None)
    return schema.name if schema is not None and hasattr(op, "overloadpacket") else None


def entry_for(op) -> Lowering | None:
    name = schema_name(op)
    return LOWERINGS.get(name) if name is not None else None


def is_mutable(op) -> bool:
    """The overload writes one of its arguments (an in-place or out= variant)."""
    return bool(op._schema.is_mutable)


class MissingArgument(ValueError):
    pass


def schema_args(op, args, kwargs) -> list:
    """The call's arguments in schema order: positional ones as given, keyword-only ones (and
    omitted trailing ones) from `kwargs` or the schema's default."""
    out = []
    for i, a in enumerate(op._schema.arguments):
        if not a.kwarg_only and i < len(args):
            out.append(args[i])
        elif a.name in kwargs:
            out.append(kwargs[a.name])
        elif a.has_default_value():
            out.append(a.default_value)
        else:
            raise MissingArgument(f"{op}: argument {a.name!r} is missing")
    return out


def argument_names(op) -> list[str]:
    return [a.name for a in op._schema.arguments]
