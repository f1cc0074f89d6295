"""Values and expressions: the nodes of the Fusion IR graph.

Invariants:
- A Val is owned by exactly one Fusion and gets its printed name (`T3`, `i7`, `d12`, `iS5`...) from
  that Fusion's per-kind counters when it is created, so printing is deterministic.
- A Val has at most one defining Expr (`definition`); `uses` lists the Exprs that read it.
- Exprs register themselves with the current Fusion on construction, so `Fusion.exprs` is in
  creation order, which is a topological order (an Expr can only read Vals that already exist).
"""
from __future__ import annotations

from typing import Optional

from .dtypes import DataType


class Val:
    """Any value of the IR: a scalar, an IterDomain or a TensorView."""

    name_prefix = "v"

    def __init__(self, fusion=None):
        from .fusion import Fusion
        self.fusion = fusion if fusion is not None else Fusion.current()
        self.number = self.fusion.next_number(self.counter_key())
        self.definition: Optional[Expr] = None
        self.uses: list[Expr] = []
        self.fusion.register_val(self)

    def counter_key(self) -> str:
        """Vals that share a key share a numbering sequence (nvFuser numbers T*, iS* apart)."""
        return type(self).__name__

    @property
    def name(self) -> str:
        return f"{self.name_prefix}{self.number}"

    def __repr__(self) -> str:
        return self.name


class Scalar(Val):
    """A scalar: a constant (`value` set) or a symbolic value bound at run time (a fusion input
    scalar or a tensor extent). Printed as its value when constant, else as `i3`, `d5`, `b2`."""

    def __init__(self, dtype: DataType, value=None, fusion=None):
        self.dtype = dtype
        self.value = value
        super().__init__(fusion)

    def counter_key(self) -> str:
        return "Scalar"

    @property
    def is_const(self) -> bool:
        return self.value is not None

    @property
    def name(self) -> str:
        return f"{self.dtype.short}{self.number}"

    def __str__(self) -> str:
        if self.is_const:
            return format_constant(self.value, self.dtype)
        return self.name

    def __repr__(self) -> str:
        return str(self)


def format_constant(value, dtype: DataType) -> str:
    """How a constant prints in IR dumps, e.g. `double(0.5)`, `3`, `true`."""
    if dtype.is_bool:
        return "true" if value else "false"
    if dtype.is_floating:
        # 17 significant digits round-trip a double exactly (nvFuser prints them the same way).
        text = f"{float(value):.17g}"
        return f"double({text})" if dtype is DataType.Double else f"float({text})"
    if dtype.is_complex:
        return f"complex({value!r})"
    return str(int(value))


class Expr:
    """An operation: reads `inputs`, defines `outputs`. Subclasses add op-specific attributes."""

    op_name = "expr"

    def __init__(self, inputs: list, outputs: list):
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        fusion = outputs[0].fusion if outputs else inputs[0].fusion
        for v in self.inputs:
            if isinstance(v, Val):
                v.uses.append(self)
        for v in self.outputs:
            assert v.definition is None, f"{v} is already defined"
            v.definition = self
        self.fusion = fusion
        fusion.register_expr(self)

    @property
    def output(self):
        assert len(self.outputs) == 1
        return self.outputs[0]

    def tensor_inputs(self) -> list:
        from .tensor import TensorView
        return [v for v in self.inputs if isinstance(v, TensorView)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.op_name}: {self.inputs} -> {self.outputs})"
