"""nvFuser's `Fusion` handle (pyfuser/frontend/definition.py's executable object): a fusion
defined once through a FusionDefinition (or found by its FusionCache id) and executed many
times through `pyfuser.runtime.dispatch.execute_fusion`, never the evaluator. After its first
call, `execute` calls the fusion's recorded cached-call programs directly. Outputs marked
hidden (alias_input) are left out and `add_output(stride_order=)` outputs laid out as asked
(`_post_process`); `definition_source` prints a definition as nvFuser's Python.
"""
from __future__ import annotations

from ..errors import ExecuteError, FusionDefinitionError
from ..ir.fusion import Fusion as IRFusion
from .fusion_cache import FusionCache

_DISPATCH = [None]     # the pyfuser.runtime.dispatch module, once imported


class NoDefinitionError(FusionDefinitionError, NotImplementedError):
    """execute() of a FusionDefinition that was never defined and has no definition() method."""


class Fusion:
    """A fusion defined once through FusionDefinition, then executed many times.

    `Fusion()` is empty until a `with FusionDefinition(fs)` block defines it; `Fusion(id)` is the
    fusion of a FusionCache id (`fs.id()`)."""

    def __init__(self, fusion_id=None):
        self._ir: IRFusion | None = None
        self._entry = None
        self._post = None          # (hidden output indices, {output index: stride order}) or None
        if fusion_id is not None:
            self._bind(FusionCache.get().entry(fusion_id))

    def _bind(self, entry) -> None:
        self._entry, self._ir = entry, entry.ir
        self._progs = None
        self._post = (entry.hidden_outputs, entry.output_orders) \
            if entry.hidden_outputs or entry.output_orders else None

    @property
    def ir_fusion(self) -> IRFusion:
        if self._ir is None:
            raise FusionDefinitionError("this Fusion has not been defined yet (use FusionDefinition)")
        return self._ir

    def id(self) -> int:
        """The FusionCache id of this fusion."""
        if self._entry is None:
            raise FusionDefinitionError("this Fusion has not been defined yet, so it has no id")
        return self._entry.id

    def is_defined(self) -> bool:
        return self._ir is not None

    _progs = None   # dispatch's _Programs of _ir (its cached-call `run`), once the first call made it

    def execute(self, inputs) -> list:
        progs = self._progs
        if progs is not None and self._post is None and (type(inputs) is list or type(inputs) is tuple):
            return progs.run(inputs)       # the same as execute_fusion(self._ir, inputs)
        if self._ir is None:
            raise ExecuteError("execute: the Fusion is not defined yet; build it inside "
                               "`with FusionDefinition(fs) as fd:` first")
        if not isinstance(inputs, (list, tuple)):
            raise ExecuteError(f"execute: inputs must be a list, got {type(inputs).__name__}")
        dispatch = _DISPATCH[0]
        if dispatch is None:               # imported once: an import statement per call costs
            from ..runtime import dispatch     # about a microsecond
            _DISPATCH[0] = dispatch
        outs = dispatch.execute_fusion(self._ir, inputs)   # it never changes the caller's list
        if self._progs is None:
            self._progs = dispatch.programs(self._ir)
        return outs if self._post is None else _post_process(outs, *self._post)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_progs", None)          # a cache of this object (and generated functions)
        return state

    @property
    def last_run(self):
        """RunReport of the last execute: segments (kind, scheduler) in order, kernels run."""
        from ..runtime.dispatch import last_report
        return last_report(self._ir) if self._ir is not None else None

    def fusion_definition(self) -> str:
        """Python source of `nvfuser_fusion_idN(fd)` that rebuilds this fusion (as repr(fd))."""
        self.ir_fusion  # noqa: B018 (raises if undefined)
        return definition_source(self._entry.id, self._entry.lines)

    def __str__(self) -> str:
        return str(self._ir) if self._ir is not None else "<undefined pyfuser Fusion>"

    def print_ir(self) -> None:
        print(self)


def _post_process(outs, hidden, orders) -> list:
    """Outputs as the definition asked: alias_input outputs (already written into their input)
    left out, add_output(stride_order=) outputs in that layout."""
    result = []
    for i, t in enumerate(outs):
        if i in hidden:
            continue
        order = orders.get(i)
        result.append(t if order is None else with_stride_order(t, order))
    return result


def with_stride_order(t, order):
    """`t`, or a copy of it, whose axis i is the order[i]-th outermost (0 = outermost)."""
    import torch
    outer_first = sorted(range(t.dim()), key=lambda i: order[i])
    strides, acc = [0] * t.dim(), 1
    for axis in reversed(outer_first):
        strides[axis] = acc
        acc *= max(t.shape[axis], 1)
    if list(t.stride()) == strides:
        return t
    out = torch.empty_strided(t.shape, strides, dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out


def definition_source(fusion_id, lines) -> str:
    """The printed form of a definition: an import line, then `def nvfuser_fusion_idN(fd)`."""
    body = "\n".join("    " + line for line in lines) if lines else "    pass"
    return ("from pyfuser import FusionDefinition, DataType\n"
            f"def nvfuser_fusion_id{fusion_id}(fd : FusionDefinition) -> None :\n{body}\n")
