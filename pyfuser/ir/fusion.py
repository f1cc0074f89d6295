"""Fusion: the container of one program in Fusion IR.

A Fusion owns its Vals and Exprs, its ordered inputs and outputs, and the counters that name its
values. Building happens inside `with fusion:` (or `FusionGuard(fusion)`), which makes it the
current fusion for value constructors.

Invariants:
- `exprs` is in creation order, which is topological.
- Inputs are TensorViews or symbolic Scalars that no Expr defines; outputs are TensorViews.
- A TensorView that is an input or an output is in global memory (`_g`); others are local (`_l`).
- `scalar_typing` is the scalar promotion rule the builder applies in this Fusion ("eager", the
  default, or "nvfuser" for FusionDefinitions; see dtypes.result_type).
- The runtime caches what it derives from a Fusion (segments, executors, fast-call programs) in
  attributes named `_pyfuser_*`; any change to the program (a new expr, input or output) drops
  them, so a Fusion edited after it ran never replays a stale plan.
"""
from __future__ import annotations

import threading

from ..errors import FusionDefinitionError

_state = threading.local()
RUNTIME_CACHE_PREFIX = "_pyfuser_"


class Fusion:
    scalar_typing = "eager"

    def __init__(self):
        self.inputs: list = []
        self.outputs: list = []
        self.exprs: list = []
        self.vals: list = []
        self._counters: dict[str, int] = {}
        # Outputs that alias an input's storage (in-place updates), output -> input.
        self.aliases: dict = {}

    # --- the current fusion ------------------------------------------------------------------
    @staticmethod
    def current() -> "Fusion":
        stack = getattr(_state, "stack", None)
        if not stack:
            raise FusionDefinitionError("no current Fusion: build IR inside `with fusion:`")
        return stack[-1]

    def __enter__(self) -> "Fusion":
        if not hasattr(_state, "stack"):
            _state.stack = []
        _state.stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _state.stack.pop()

    # --- registration ------------------------------------------------------------------------
    def next_number(self, key: str) -> int:
        n = self._counters.get(key, 0)
        self._counters[key] = n + 1
        return n

    def register_val(self, val) -> None:
        self.vals.append(val)

    def register_expr(self, expr) -> None:
        self.exprs.append(expr)
        self._drop_runtime_caches()

    def _drop_runtime_caches(self) -> None:
        for key in [k for k in self.__dict__ if k.startswith(RUNTIME_CACHE_PREFIX)]:
            del self.__dict__[key]

    def add_input(self, val) -> None:
        from .base import Scalar
        from .tensor import TensorView
        if not isinstance(val, (TensorView, Scalar)):
            raise FusionDefinitionError(f"fusion input must be a tensor or scalar, got {val!r}")
        if val.definition is not None:
            raise FusionDefinitionError(f"{val} is computed in the fusion; it cannot be an input")
        if val not in self.inputs:
            self.inputs.append(val)
            self._drop_runtime_caches()

    def add_output(self, val) -> None:
        from .tensor import TensorView
        if not isinstance(val, TensorView) or val.fusion is not self:
            raise FusionDefinitionError(
                f"add_output takes a tensor of this fusion, got {val!r}")
        self.outputs.append(val)
        self._drop_runtime_caches()

    def is_boundary(self, tv) -> bool:
        return tv in self.inputs or tv in self.outputs

    # --- queries -----------------------------------------------------------------------------
    def tensor_inputs(self) -> list:
        from .tensor import TensorView
        return [v for v in self.inputs if isinstance(v, TensorView)]

    def used_exprs(self) -> list:
        """The exprs that some output depends on, in topological order."""
        needed, stack = set(), list(self.outputs)
        while stack:
            v = stack.pop()
            e = v.definition
            if e is not None and id(e) not in needed:
                needed.add(id(e))
                stack.extend(e.inputs)
        return [e for e in self.exprs if id(e) in needed]

    def __str__(self) -> str:
        from .printer import print_fusion
        return print_fusion(self)
