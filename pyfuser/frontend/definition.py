"""nvFuser's Python frontend: `Fusion`, `FusionDefinition`, `fd.define_*`, `fd.ops.*`, `execute`.

    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t0 = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(t0))
    out = fs.execute([torch.randn(4, 5)])

Invariants:
- Every definition call goes through the checked builder (pyfuser.ir.builder) and is recorded as
  one line of Python, so `fs.fusion_definition()` regenerates source that rebuilds the same IR.
- User mistakes raise FusionDefinitionError (definition) or ExecuteError (execute) naming the call
  and what was wrong; no raw KeyError/IndexError/TypeError escapes a definition call.
- `Fusion.execute` goes through `pyfuser.runtime.dispatch.execute_fusion`, never the evaluator.
- On leaving the `with` block the fusion must have an output; it is then verified and frozen.
"""
from __future__ import annotations

import math
import numbers

from ..errors import ExecuteError, FusionDefinitionError
from ..ir import builder as B
from ..ir.base import Scalar, Val
from ..ir.dtypes import DataType
from ..ir.fusion import Fusion as IRFusion
from ..ir.tensor import TensorView
from .definition_ops import Ops, UnknownNameError

_UNSET = object()
_DISPATCH = [None]     # the pyfuser.runtime.dispatch module, once imported
_BUILDER_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError)


class Fusion:
    """A fusion defined once through FusionDefinition, then executed many times."""

    def __init__(self):
        self._ir: IRFusion | None = None
        self._source_lines: list[str] = []

    @property
    def ir_fusion(self) -> IRFusion:
        if self._ir is None:
            raise FusionDefinitionError("this Fusion has not been defined yet (use FusionDefinition)")
        return self._ir

    _progs = None   # dispatch's _Programs of _ir (its cached-call `run`), once the first call made it

    def execute(self, inputs) -> list:
        progs = self._progs
        if progs is not None and (type(inputs) is list or type(inputs) is tuple):
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
        return outs

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
        """Python source of `nvfuser_fusion_id0(fd)` that rebuilds this fusion."""
        self.ir_fusion  # noqa: B018 (raises if undefined)
        body = "\n".join("    " + line for line in self._source_lines)
        return f"def nvfuser_fusion_id0(fd: FusionDefinition) -> None:\n{body}\n"

    def __str__(self) -> str:
        return str(self._ir) if self._ir is not None else "<undefined pyfuser Fusion>"

    def print_ir(self) -> None:
        print(self)


class FusionDefinition:
    """Context manager that defines the Fusion `fs`; `fd.ops` holds every op."""

    def __init__(self, fusion: Fusion | None = None):
        if fusion is not None and not isinstance(fusion, Fusion):
            raise FusionDefinitionError(
                f"FusionDefinition takes a pyfuser Fusion, got {type(fusion).__name__}")
        self.__dict__["_fs"] = fusion if fusion is not None else Fusion()
        self.__dict__["ops"] = Ops(self)
        self._ir: IRFusion | None = None
        self._active = False
        self._names: dict[int, str] = {}
        self._lines: list[str] = []
        self._counter = 0

    # --- context ------------------------------------------------------------------------------
    def __enter__(self) -> "FusionDefinition":
        if self._fs._ir is not None:
            raise FusionDefinitionError("this Fusion is already defined; create a new Fusion()")
        self._ir = IRFusion()
        self._ir.__enter__()
        self._active = True
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._ir.__exit__(exc_type, exc, tb)
        self._active = False
        if exc_type is not None:
            return
        if not self._ir.outputs:
            raise FusionDefinitionError("FusionDefinition: the fusion has no outputs; "
                                        "call fd.add_output(tensor) before the `with` block ends")
        from ..ir.verifier import verify
        verify(self._ir)
        from ..dump import dump
        dump("fusion_ir", "FusionDefinition", lambda: str(self._ir))
        self._fs._ir, self._fs._source_lines = self._ir, list(self._lines)

    def __getattr__(self, name: str):
        ops = self.__dict__.get("ops")
        if ops is not None and not name.startswith("_"):
            return getattr(ops, name)  # `fd.permute(...)` behaves as `fd.ops.permute(...)`
        raise UnknownNameError(f"FusionDefinition has no attribute {name!r}")

    # --- running and recording a call ---------------------------------------------------------
    def _run(self, call: str, build, args=(), kwargs=None):
        """Run `build()` (builder calls) as definition call `fd.<call>(*args, **kwargs)`."""
        if not self._active:
            raise FusionDefinitionError(
                f"{call}: definition calls must be made inside `with FusionDefinition(fs) as fd:`")
        for a in list(args) + list((kwargs or {}).values()):
            self._check_owned(call, a)
        try:
            result = build()
        except FusionDefinitionError:
            raise
        except _BUILDER_ERRORS as e:
            raise FusionDefinitionError(f"{call.split('.')[-1]}: {e}") from None
        self._record(call, result, args, kwargs or {})
        return result

    def _check_owned(self, call: str, a) -> None:
        if isinstance(a, (list, tuple)):
            for x in a:
                self._check_owned(call, x)
        elif isinstance(a, Val) and a.fusion is not self._ir:
            raise FusionDefinitionError(
                f"{call.split('.')[-1]}: operand {a!r} belongs to another fusion")

    def _record(self, call: str, result, args, kwargs) -> None:
        outs = result if isinstance(result, tuple) else (result,)
        names = []
        for v in outs:
            if isinstance(v, Val):
                prefix = "T" if isinstance(v, TensorView) else "S"
                names.append(f"{prefix}{self._counter}")
                self._counter += 1
        text = ", ".join([self._render(a) for a in args] +
                         [f"{k}={self._render(v)}" for k, v in kwargs.items()])
        lhs = f"{', '.join(names)} = " if names else ""
        self._lines.append(f"{lhs}fd.{call}({text})")
        for v, n in zip([v for v in outs if isinstance(v, Val)], names):
            self._names[id(v)] = n

    def _render(self, a) -> str:
        if isinstance(a, Val):
            if id(a) not in self._names:
                raise FusionDefinitionError(f"{a!r} was not created through this FusionDefinition")
            return self._names[id(a)]
        if isinstance(a, DataType):
            return f"DataType.{a.name}"
        if isinstance(a, (list, tuple)):
            return "[" + ", ".join(self._render(x) for x in a) + "]"
        if isinstance(a, float) and not math.isfinite(a):
            return f"float('{a}')"
        return repr(a)

    # --- leaves ---------------------------------------------------------------------------------
    def define_tensor(self, symbolic_sizes=None, contiguous=None, dtype=DataType.Float, shape=None,
                      stride_order=None, contiguity=None) -> TensorView:
        """A tensor input: `symbolic_sizes` (-1 any size, 1 broadcast) or concrete `shape`."""
        contiguous = contiguity if contiguous is None else contiguous
        kwargs = {k: v for k, v in dict(symbolic_sizes=symbolic_sizes, shape=shape,
                                         contiguous=contiguous, dtype=dtype,
                                         stride_order=stride_order).items() if v is not None}
        sizes = _tensor_sizes(symbolic_sizes, shape)
        if contiguous is not None:
            if not isinstance(contiguous, (list, tuple)) or \
                    any(c is not None and not isinstance(c, bool) for c in contiguous):
                raise FusionDefinitionError(
                    f"define_tensor: contiguous must be a list of True/False/None, got {contiguous!r}")
        return self._run("define_tensor", lambda: B.define_tensor(sizes, dtype, contiguous,
                                                                  stride_order), (), kwargs)

    def define_constant(self, value, dtype: DataType | None = None) -> Scalar:
        value = _python_number(value, "define_constant")
        if dtype is not None and not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"define_constant: dtype must be a DataType, got {dtype!r}")
        kwargs = {"dtype": dtype} if dtype is not None else {}
        return self._run("define_constant",
                         lambda: B.constant(_convert(value, dtype) if dtype else value, dtype),
                         (value,), kwargs)

    def define_scalar(self, value_or_dtype=_UNSET, dtype=_UNSET) -> Scalar:
        """A constant (given a value) or a scalar input of the fusion (given a dtype or nothing)."""
        if isinstance(value_or_dtype, DataType):
            if dtype is not _UNSET:
                raise FusionDefinitionError("define_scalar: dtype given twice")
            value_or_dtype, dtype = _UNSET, value_or_dtype
        if dtype is not _UNSET and not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"define_scalar: dtype must be a DataType, got {dtype!r}")
        if value_or_dtype is _UNSET or value_or_dtype is None:
            dt = DataType.Double if dtype is _UNSET else dtype

            def build():
                s = B.symbolic_scalar(dt)
                self._ir.add_input(s)
                return s
            return self._run("define_scalar", build, (), {"dtype": dt})
        value = _python_number(value_or_dtype, "define_scalar")
        dt = None if dtype is _UNSET else dtype
        kwargs = {"dtype": dt} if dt is not None else {}
        return self._run("define_scalar",
                         lambda: B.constant(_convert(value, dt) if dt else value, dt),
                         (value,), kwargs)

    def add_output(self, value) -> None:
        if not isinstance(value, TensorView):
            raise FusionDefinitionError(
                f"add_output: expects a tensor of this fusion, got {type(value).__name__} {value!r}")
        self._run("add_output", lambda: self._ir.add_output(value), (value,))

    def print_ir(self) -> None:
        print(self._ir if self._ir is not None else "<empty FusionDefinition>")


def _tensor_sizes(symbolic_sizes, shape) -> list[int]:
    if (symbolic_sizes is None) == (shape is None):
        raise FusionDefinitionError("define_tensor: give exactly one of symbolic_sizes= or shape=")
    sizes = symbolic_sizes if symbolic_sizes is not None else shape
    if not isinstance(sizes, (list, tuple)):
        raise FusionDefinitionError(f"define_tensor: sizes must be a list, got {sizes!r}")
    for i, s in enumerate(sizes):
        if not isinstance(s, int) or isinstance(s, bool):
            raise FusionDefinitionError(f"define_tensor: size {i} is {s!r}, not an int")
        if symbolic_sizes is not None and s not in (-1, 1):
            raise FusionDefinitionError(
                f"define_tensor: symbolic_sizes entries must be -1 or 1, entry {i} is {s} "
                "(use shape= for concrete sizes)")
        if shape is not None and s < -1:
            raise FusionDefinitionError(f"define_tensor: shape entry {i} is {s}")
    return list(sizes)


def _python_number(value, call: str):
    if isinstance(value, (bool, int, float, complex)):
        return value
    for abc, py in ((numbers.Integral, int), (numbers.Real, float), (numbers.Complex, complex)):
        if isinstance(value, abc):  # numpy scalars and the like
            return py(value)
    raise FusionDefinitionError(f"{call}: value must be a Python number, got {type(value).__name__}")


def _convert(value, dtype: DataType):
    if dtype.is_bool:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    if isinstance(value, complex):
        raise FusionDefinitionError(f"define_constant: complex value {value} for dtype {dtype.name}")
    return float(value) if dtype.is_floating else int(value)
