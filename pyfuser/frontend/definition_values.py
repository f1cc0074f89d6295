"""The values a FusionDefinition hands out: `Tensor` and `Scalar` handles (nvFuser's Python types).

A handle wraps one Fusion IR value (`_val`) and the FusionDefinition that made it (`_fd`):
- every op of `fd.ops` is also a method, the handle being its first operand: `t.sum([0])` is
  `fd.ops.sum(t, [0])`, `(t > c).where(t, c)` is `fd.ops.where(fd.ops.gt(t, c), t, c)`;
- Python's arithmetic operators build the matching op (`-t`, `abs(t)`, `a + b`, `2 - s`, `a / b`,
  `a ** b`, `a & b`, `~a`, `a < b`...), recorded like any other definition call;
- `t.ndim`, `t.dtype`, `t.shape` (the sizes as Int scalars; `t.shape()` works too) and
  `t._get_fusion_definition()`.
`==` and `!=` keep Python's identity meaning (use fd.ops.eq / fd.ops.ne for comparisons), so
handles stay usable in sets, as dict keys and with `in`.

Invariant: a handle is only a view of its IR value; every op goes through its FusionDefinition,
which checks the handle belongs to it.
"""
from __future__ import annotations

import functools


class Value:
    __slots__ = ("_val", "_fd")

    def __init__(self, val, fd):
        object.__setattr__(self, "_val", val)
        object.__setattr__(self, "_fd", fd)

    def _get_fusion_definition(self):
        return self._fd

    @property
    def dtype(self):
        return self._val.dtype

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        ops = self._fd.ops
        if not callable(getattr(type(ops), name, None)):
            raise AttributeError(
                f"{type(self).__name__} {self!r} has no attribute {name!r} (and fd.ops has no "
                f"op of that name)")
        return functools.partial(getattr(ops, name), self)

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} values are read-only")

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        return self._fd._display_name(self._val)

    def __bool__(self):
        raise TypeError(f"the truth value of {type(self).__name__} {self!r} is only known when the "
                        "fusion runs; use fd.ops.where for a data-dependent choice")

    def _op(self, name, *args):
        return getattr(self._fd.ops, name)(*args)


class Tensor(Value):
    """A tensor of a FusionDefinition."""
    __slots__ = ()

    @property
    def ndim(self) -> int:
        return self._val.ndim

    @property
    def shape(self) -> "Shape":
        """The sizes as Int scalars (recorded as `fd.ops.tensor_sizes(T)`)."""
        return Shape(self._fd.ops.tensor_sizes(self))

    def size(self, dim: int):
        return self.shape[dim]


class Scalar(Value):
    """A scalar of a FusionDefinition: a constant or a scalar input."""
    __slots__ = ()


class Shape(list):
    """A tensor's sizes: a list of Scalars, also callable (`t.shape()`) as in later nvFuser."""

    def __call__(self) -> "Shape":
        return self


def _binary(op: str, reflected: bool = False):
    def method(self, other):
        return self._op(op, other, self) if reflected else self._op(op, self, other)
    method.__name__ = f"__{'r' if reflected else ''}{op}__"
    return method


def _unary(op: str):
    def method(self):
        return self._op(op, self)
    method.__name__ = f"__{op}__"
    return method


# Python operator -> op of fd.ops (reflected forms swap the operands).
BINARY_OPERATORS = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "pow": "pow",
                    "and": "bitwise_and", "or": "bitwise_or", "xor": "bitwise_xor",
                    "lshift": "bitwise_left_shift", "rshift": "bitwise_right_shift"}
COMPARISONS = {"lt": "lt", "le": "le", "gt": "gt", "ge": "ge"}
UNARY_OPERATORS = {"neg": "neg", "abs": "abs", "invert": "bitwise_not"}

for _cls in (Tensor, Scalar):
    for _py, _op_name in BINARY_OPERATORS.items():
        setattr(_cls, f"__{_py}__", _binary(_op_name))
        setattr(_cls, f"__r{_py}__", _binary(_op_name, reflected=True))
    for _py, _op_name in COMPARISONS.items():
        setattr(_cls, f"__{_py}__", _binary(_op_name))
    for _py, _op_name in UNARY_OPERATORS.items():
        setattr(_cls, f"__{_py}__", _unary(_op_name))
