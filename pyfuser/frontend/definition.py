"""nvFuser's Python frontend: `Fusion`, `FusionDefinition`, `fd.define_*`, `fd.ops.*`, `execute`.

Every form programs of nvFuser's frontend use:

    fs = Fusion()                                   # pytorch's torch._C._nvfuser / nvfuser._C
    with FusionDefinition(fs) as fd:
        t0 = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.relu(t0))
    out = fs.execute([torch.randn(4, 5)])
    Fusion(fs.id()).execute(...)                    # the same fusion, from the FusionCache

    with FusionDefinition() as fd:                  # NVIDIA/Fuser's nvfuser
        t0 = fd.from_pytorch(x)
        fd.add_output(t0 * 2.0)
    out = fd.execute([x]); print(fd)                # print(fd): Python source that rebuilds it

    class MyFusion(FusionDefinition):               # the subclass form
        def definition(self): ...
        def schedule(self): ...                     # accepted, checked, not applied
    out = MyFusion().execute([x])

Invariants:
- Every definition call goes through the checked builder (pyfuser.ir.builder) and is recorded
  as one canonical line of Python (`T2 = fd.ops.add(T0, S1)`), so `repr(fd)` is source that
  rebuilds the same IR, and the lines are the FusionCache key: an identical definition is a cache
  hit (same fusion id, same IR, same compiled kernels).
- The values handed out are `Tensor` / `Scalar` handles (definition_values.py) over IR values.
- Inside a FusionDefinition, scalars follow nvFuser's typing rule (ir/dtypes.py, "nvfuser"): a
  Python float constant is a Double scalar, `where` of two Double constants gives float64.
- User mistakes raise FusionDefinitionError naming the definition, the statement and the call
  (definition time), NoDefinitionError (execute of a definition never made), ExecuteError (wrong
  inputs); all are RuntimeErrors too, as nvFuser's are. No raw KeyError/IndexError/TypeError
  escapes a definition call.
- `Fusion.execute` goes through `pyfuser.runtime.dispatch.execute_fusion`, never the evaluator
  (the `Fusion` handle lives in definition_fusion.py).
"""
from __future__ import annotations

import math
import numbers

from ..errors import FusionDefinitionError
from ..ir import builder as B
from ..ir.base import Scalar as IRScalar, Val
from ..ir.dtypes import DataType
from ..ir.fusion import Fusion as IRFusion
from ..ir.tensor import TensorView
from .definition_fusion import Fusion, NoDefinitionError, definition_source, with_stride_order
from .definition_ops import Ops, UnknownNameError, api_call
from .definition_schedule import UserSchedule
from .definition_tensors import canonical_tensor, from_pytorch_kwargs
from .definition_values import Scalar, Tensor, Value
from .fusion_cache import FusionCache

_UNSET = object()
_BUILDER_ERRORS = (KeyError, IndexError, TypeError, ValueError, AttributeError, ZeroDivisionError)


class FusionDefinition:
    """Defines a fusion: as a context manager (`with FusionDefinition(fs) as fd:`, or
    `FusionDefinition()` then `fd.execute`), or as a subclass with `definition()`. `fd.ops` holds
    every op; `fd.sched` the scheduling calls of `schedule()`.

    `FusionDefinition(fusion)` takes a Fusion, a FusionCache id, or nothing (a new Fusion);
    `max_length` (nvFuser's limit on the number of statements) is accepted and not needed."""

    def __init__(self, fusion=None, max_length: int = 1024):
        if fusion is None:
            fs = Fusion()
        elif isinstance(fusion, Fusion):
            fs = fusion
        elif isinstance(fusion, int) and not isinstance(fusion, bool):
            fs = Fusion(fusion)
        else:
            raise FusionDefinitionError(
                f"FusionDefinition takes a pyfuser Fusion or a fusion id, got {type(fusion).__name__}")
        d = self.__dict__
        d["_fs"] = fs
        d["ops"] = Ops(self)
        d["sched"] = UserSchedule(self)
        d["_ir"] = None
        d["_phase"] = None           # "define" inside the definition, "schedule" in schedule()
        d["_names"] = {}
        d["_lines"] = []
        d["_counter"] = 0
        d["_hidden"] = set()
        d["_orders"] = {}
        d["max_length"] = max_length

    # --- context ------------------------------------------------------------------------------
    def __enter__(self) -> "FusionDefinition":
        if self._fs._ir is not None:
            raise FusionDefinitionError(
                f"{self._title()}: this Fusion is already defined; create a new Fusion()")
        self._ir = IRFusion()
        self._ir.scalar_typing = "nvfuser"
        self._ir.__enter__()
        self._phase = "define"
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._ir.__exit__(exc_type, exc, tb)
        self._phase = None
        if exc_type is None:
            self._finish()

    def _finish(self) -> None:
        if not self._ir.outputs:
            raise FusionDefinitionError(f"{self._title()}: the fusion has no outputs; call "
                                        "fd.add_output(tensor) before the definition ends")
        from ..ir.verifier import verify
        verify(self._ir)
        cache = FusionCache.get()
        key = "\n".join(self._lines)
        entry = cache.lookup(key)
        if entry is None:
            from ..dump import dump
            dump("fusion_ir", "FusionDefinition", lambda: str(self._ir))
            entry = cache.add(key, self._ir, self._lines, self._hidden, self._orders)
        self._fs._bind(entry)
        if type(self).schedule is not FusionDefinition.schedule:
            self._phase = "schedule"
            try:
                self.schedule()
            finally:
                self._phase = None

    # --- the subclass form --------------------------------------------------------------------
    def definition(self) -> None:
        """Override in a subclass to define the fusion with `self.define_tensor`, `self.ops`..."""
        raise NoDefinitionError(
            f"{self._title()}: this FusionDefinition was never defined: build it inside "
            "`with FusionDefinition() as fd:` or subclass FusionDefinition and define definition()")

    def schedule(self) -> None:
        """Override in a subclass to make scheduling calls (`self.sched.split(...)`); they are
        checked and recorded, and pyfuser's own schedulers decide the kernel."""

    def execute(self, inputs, override_user_schedule: bool = False, **options) -> list:
        """Run the fusion (defining it first with `definition()` in the subclass form)."""
        if options:
            raise FusionDefinitionError(
                f"{self._title()}: execute got unknown option(s) {sorted(options)}")
        if not self._fs.is_defined():
            if type(self).definition is FusionDefinition.definition:
                self.definition()          # raises NoDefinitionError
            with self:
                self.definition()
        return self._fs.execute(inputs)

    def id(self) -> int:
        """The FusionCache id of the defined fusion."""
        return self._fs.id()

    @property
    def fusion(self) -> Fusion:
        return self._fs

    # --- printing -----------------------------------------------------------------------------
    def __repr__(self) -> str:
        entry = self._fs._entry
        if entry is not None:
            return definition_source(entry.id, entry.lines)
        return definition_source(FusionCache.get().num_fusions(), self._lines)

    __str__ = __repr__

    def print_ir(self) -> None:
        print(self._fs._ir if self._fs._ir is not None else self._ir or "<empty FusionDefinition>")

    def _title(self) -> str:
        name = type(self).__name__
        return "FusionDefinition" if name == "FusionDefinition" else f"FusionDefinition {name}"

    def _display_name(self, val) -> str:
        return self._names.get(id(val), str(val))

    def __getattr__(self, name: str):
        if name.startswith("_"):
            raise AttributeError(name)
        ops = self.__dict__.get("ops")
        if ops is not None and callable(getattr(type(ops), name, None)):
            return getattr(ops, name)  # `fd.permute(...)` behaves as `fd.ops.permute(...)`
        raise UnknownNameError(f"{self._title()} has no attribute {name!r}")

    # --- handles ------------------------------------------------------------------------------
    def _unwrap(self, x):
        """User arguments -> IR values (handles of this definition only)."""
        if isinstance(x, Value):
            if x._fd is not self:
                raise FusionDefinitionError(
                    f"operand {x!r} belongs to another FusionDefinition")
            return x._val
        if isinstance(x, (list, tuple)):
            items = [self._unwrap(v) for v in x]
            return items if isinstance(x, list) or type(x) is not tuple else tuple(items)
        return x

    def _wrap(self, x):
        if isinstance(x, TensorView):
            return Tensor(x, self)
        if isinstance(x, IRScalar):
            return Scalar(x, self)
        if isinstance(x, list):
            return [self._wrap(v) for v in x]
        if isinstance(x, tuple):
            return tuple(self._wrap(v) for v in x)
        return x

    def _where(self, call: str) -> str:
        return f"{self._title()} statement {len(self._lines) + 1}, fd.{call}"

    # --- running and recording a call ---------------------------------------------------------
    def _run(self, call: str, build, args=(), kwargs=None):
        """Run `build()` (builder calls) as definition call `fd.<call>(*args, **kwargs)`."""
        if self._phase != "define":
            if self._phase == "schedule":
                raise FusionDefinitionError(
                    f"{call.split('.')[-1]}: schedule() may only make scheduling calls "
                    "(fd.sched.*); define ops in definition()")
            raise FusionDefinitionError(
                f"{call.split('.')[-1]}: definition calls must be made inside "
                "`with FusionDefinition(fs) as fd:` (or in definition())")
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
        many = isinstance(result, (tuple, list))
        outs = list(result) if many else [result]
        names = []
        for v in outs:
            if isinstance(v, Val):
                prefix = "T" if isinstance(v, TensorView) else "S"
                names.append(f"{prefix}{self._counter}")
                self._counter += 1
        text = ", ".join([self._render(a) for a in args] +
                         [f"{k}={self._render(v)}" for k, v in kwargs.items()])
        lhs = ""
        if names:
            lhs = ", ".join(names) + ("," if many and len(names) == 1 else "") + " = "
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
        if isinstance(a, complex) and not (math.isfinite(a.real) and math.isfinite(a.imag)):
            return f"complex(float('{a.real}'), float('{a.imag}'))"
        return repr(a)

    # --- leaves ---------------------------------------------------------------------------------
    @api_call
    def define_tensor(self, *args, **kwargs) -> TensorView:
        """A tensor input, in any of nvFuser's forms (definition_tensors.py)."""
        return self._define_tensor(canonical_tensor(args, kwargs))

    @api_call
    def from_pytorch(self, tensor, static_sizes: bool = False) -> TensorView:
        """A tensor input shaped like `tensor` (dtype, rank, broadcast axes, layout); pyfuser
        runs on the CPU too, so CPU tensors are accepted (nvFuser only takes CUDA tensors)."""
        return self._define_tensor(from_pytorch_kwargs(tensor, static_sizes))

    def _define_tensor(self, kw: dict) -> TensorView:
        sizes = kw["symbolic_sizes"]

        def build():
            return B.define_tensor(sizes, kw["dtype"], kw["contiguous"], kw.get("stride_order"))
        return self._run("define_tensor", build, (), kw)

    @api_call
    def define_constant(self, value, dtype: DataType | None = None) -> IRScalar:
        value = _python_number(value, "define_constant")
        if dtype is not None and not isinstance(dtype, DataType):
            raise FusionDefinitionError(f"define_constant: dtype must be a DataType, got {dtype!r}")
        kwargs = {"dtype": dtype} if dtype is not None else {}
        return self._run("define_constant",
                         lambda: B.constant(_convert(value, dtype) if dtype else value, dtype),
                         (value,), kwargs)

    @api_call
    def define_scalar(self, value_or_dtype=_UNSET, dtype=_UNSET) -> IRScalar:
        """A constant (given a value) or a scalar input of the fusion (given a dtype or nothing:
        a Double input)."""
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

    @api_call
    def add_output(self, value, stride_order=None, alias_input=None) -> None:
        """An output of the fusion. `alias_input=t` writes it into input t instead of returning
        it; `stride_order` (also the second positional argument) gives its layout: axis i is
        the stride_order[i]-th outermost."""
        if isinstance(stride_order, TensorView) and alias_input is None:
            stride_order, alias_input = None, stride_order
        if not isinstance(value, TensorView):
            raise FusionDefinitionError(
                f"add_output: expects a tensor of this fusion, got {type(value).__name__} {value!r}")
        kwargs = {}
        if alias_input is not None:
            _check_alias(value, alias_input, self._ir)
            kwargs["alias_input"] = alias_input
        if stride_order is not None:
            order = list(stride_order) if isinstance(stride_order, (list, tuple)) else stride_order
            if not isinstance(order, list) or sorted(order) != list(range(value.ndim)) or \
                    any(isinstance(i, bool) for i in order):
                raise FusionDefinitionError(
                    f"add_output: stride_order {stride_order!r} is not a permutation of the "
                    f"{value.ndim} axes of {self._display_name(value)}")
            if alias_input is not None:
                raise FusionDefinitionError("add_output: give stride_order or alias_input, not both")
            kwargs["stride_order"] = order

        def build():
            index = len(self._ir.outputs)
            self._ir.add_output(value)
            if alias_input is not None:
                self._ir.aliases[value] = alias_input
                self._hidden.add(index)
            if stride_order is not None:
                self._orders[index] = kwargs["stride_order"]
        self._run("add_output", build, (value,), kwargs)


def _check_alias(value, target, ir) -> None:
    if not isinstance(target, TensorView) or target not in ir.inputs:
        raise FusionDefinitionError(
            f"add_output: alias_input must be a tensor input of this fusion, got {target!r}")
    if target.dtype is not value.dtype or target.ndim != value.ndim:
        raise FusionDefinitionError(
            f"add_output: alias_input {target.name} ({target.dtype.name}, rank {target.ndim}) must "
            f"have the dtype and rank of the output ({value.dtype.name}, rank {value.ndim})")


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


__all__ = ["Fusion", "FusionDefinition", "FusionCache", "NoDefinitionError", "Tensor", "Scalar",
           "with_stride_order", "definition_source"]
