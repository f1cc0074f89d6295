"""The driver that walks a TorchScript graph and builds a Fusion (nvFuser's `parseJitIR` role).

Graph inputs become Fusion inputs in order: tensors from their declared type or from an example
tensor (dtype, rank, size-1 axes as broadcast, contiguity and stride order from the strides);
int/float/bool inputs become symbolic scalars. Constants and constant lists are folded into the
node arguments. Every other node must have an entry in the lowering table.

Invariant: a graph that lowers computes, through the Fusion, exactly what the eager runner
computes on inputs that match the specialisation (same dtypes, ranks, size-1 axes); callers guard
other inputs (ir.shapes.bind raises ExecuteError on a mismatch).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...errors import PyfuserError, UnsupportedOpError
from ...ir import builder as B
from ...ir.base import Scalar
from ...ir.dtypes import DataType
from ...ir.fusion import Fusion
from ...ir.tensor import TensorView
from ..torchscript.types import (BoolType, FloatType, IntType, ListType, OptionalType,
                                 TensorType)
from . import aten_activations, aten_backward, aten_factory, aten_indexing, aten_logical_reduction, aten_loss, aten_pointwise, aten_random, aten_reduction, aten_regression_loss, aten_resize, aten_shape, aten_vector_norm, aten_weight_norm  # noqa: F401,E501  (fill the table)
from . import aten_arg_reduction, aten_factory_like, aten_pooling, aten_repeat, aten_scatter  # noqa: F401,E501  (fill the table)
from .device import lowering_device, single_device_type
from .registry import LOWERINGS

_LIST_KINDS = ("prim::ListConstruct", "prim::TupleConstruct")
_SCALAR_TYPES = {IntType: DataType.Int, FloatType: DataType.Double, BoolType: DataType.Bool}


@dataclass(frozen=True)
class HostValue:
    """A graph output the host answers without the kernel: the dtype (TorchScript's int code)
    or the sizes (all, or one dim) of a TensorView of the Fusion, which need not be an output
    (passes/shape_reads.py moves such reads into groups)."""
    kind: str                 # "dtype" or "size"
    tv: TensorView
    dim: int | None = None

    def value(self, bindings):
        """The value for inputs bound as `bindings` (ir.shapes.bind)."""
        if self.kind == "dtype":
            from ..torchscript.types import DTYPE_TO_CODE
            return DTYPE_TO_CODE[self.tv.dtype.torch]
        shape = bindings.shape(self.tv)
        return list(shape) if self.dim is None else shape[self.dim]


@dataclass
class LoweredGraph:
    fusion: Fusion
    # For each graph output: the index of the fusion output that gives it, or a HostValue.
    output_map: list
    # The graph inputs that are fusion inputs, in order (specialised ones are not).
    input_indices: list = None
    # Graph inputs whose example values were folded in as constants (specialised_inputs).
    specialised: tuple = ()
    # Graph inputs (0-dim CPU tensors beside CUDA ones) that enter as scalars by value.
    by_value: tuple = ()

    def fusion_args(self, args) -> list:
        """The fusion's inputs among a call's graph inputs (a by-value input as its Python
        number: `.item()` of a CPU tensor reads host memory, no copy to the device)."""
        if self.by_value:
            return [args[i].item() if i in self.by_value else args[i]
                    for i in self.input_indices]
        return args if self.input_indices is None else [args[i] for i in self.input_indices]

    @property
    def host_values(self) -> bool:
        return any(isinstance(m, HostValue) for m in self.output_map)


def where(node) -> str:
    line = f" (line {node.src_line})" if getattr(node, "src_line", None) else ""
    outs = ", ".join(f"%{o.debug_name}" for o in node.outputs)
    return f"{node.kind}{line}" + (f" defining {outs}" if outs else "")


def node_support(node) -> tuple[bool, str]:
    """Whether `node` can be lowered on its own terms (kind, argument count, constant args).
    A constant argument may also be a host value (an int/float/bool, or a list of them and
    constants: `prim::ListConstruct` of `aten::size` results): the group is specialised on
    its value (specialised_inputs)."""
    entry = LOWERINGS.get(node.kind)
    if entry is None:
        return False, f"{node.kind} has no lowering"
    n = len(node.inputs)
    if entry.n_args and n not in entry.n_args:
        return False, f"{node.kind} with {n} arguments is not supported"
    for pos in entry.const_args:
        if pos < n and not (is_constant(node.inputs[pos]) or is_host_value(node.inputs[pos])):
            return False, (f"{node.kind}: argument {pos} must be a constant or a host int/float/"
                           f"bool (list), not {node.inputs[pos].type}")
    for i, v in enumerate(node.inputs):
        if i not in entry.const_args and not _is_value_arg(v):
            return False, f"{node.kind}: argument {i} of type {v.type} is not a tensor or number"
    why = entry.check(node) if entry.check is not None else None
    if why is not None:
        return False, f"{node.kind}: {why}"
    return True, ""


def is_constant(v) -> bool:
    k = v.node.kind
    if k == "prim::Constant":
        return True
    return k in _LIST_KINDS and all(is_constant(i) for i in v.node.inputs)


def is_host_value(v) -> bool:
    """An int/float/bool value, or a list/tuple construct of such values and constants: what
    a group can take from the host and specialise on (never a tensor)."""
    t = v.type
    if type(t) in _SCALAR_TYPES or (isinstance(t, ListType) and type(t.elem) in _SCALAR_TYPES):
        return True
    return v.node.kind in _LIST_KINDS and all(
        is_constant(i) or is_host_value(i) for i in v.node.inputs)


def specialised_inputs(graph) -> tuple:
    """Indices of the graph inputs used, directly or through list/tuple constructs, as an
    argument the lowering needs as a constant: the group is lowered with their example values
    folded in, and its guard checks those values exactly."""
    wanted: set = set()

    def mark(v, seen):
        if v in seen:
            return
        seen.add(v)
        if v.node.kind == "prim::Param":
            wanted.add(v.offset)
        elif v.node.kind in _LIST_KINDS:
            for i in v.node.inputs:
                mark(i, seen)

    seen: set = set()
    for node in graph.nodes():
        entry = LOWERINGS.get(node.kind)
        if entry is None:
            continue
        for pos in entry.const_args:
            if pos < len(node.inputs):
                mark(node.inputs[pos], seen)
    return tuple(sorted(i for i in wanted if not isinstance(graph.inputs[i].type, TensorType)))


def _is_value_arg(v) -> bool:
    return is_constant(v) or isinstance(v.type, TensorType) or type(v.type) in _SCALAR_TYPES \
        or is_tensor_list(v)


def is_tensor_list(v) -> bool:
    """A `prim::ListConstruct` of tensors (cat's and stack's operands; `aten::index`'s
    `Tensor?[]` when every entry is a tensor): a group takes the tensors and builds the list
    inside (passes/groups.absorb)."""
    if v.node.kind != "prim::ListConstruct" or not isinstance(v.type, ListType):
        return False
    elem = v.type.elem.elem if isinstance(v.type.elem, OptionalType) else v.type.elem
    return isinstance(elem, TensorType) and bool(v.node.inputs) and \
        all(isinstance(i.type, TensorType) for i in v.node.inputs)


def constant_value(v):
    """The Python value of a constant (or constant list), as its declared type says: IR text
    spells a bool `False` as `value=0` and torch prints a float 1e10 as `10000000000`."""
    node = v.node
    if node.kind in _LIST_KINDS:
        return [constant_value(i) for i in node.inputs]
    return _as_declared(node.attr("value") if node.has_attr("value") else None, v.type)


def _as_declared(value, t):
    if isinstance(t, OptionalType):
        return None if value is None else _as_declared(value, t.elem)
    if isinstance(t, BoolType) and isinstance(value, int):
        return bool(value)
    if isinstance(t, FloatType) and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(t, IntType) and isinstance(value, bool):
        return int(value)
    if isinstance(t, ListType) and isinstance(value, (list, tuple)):
        return [_as_declared(e, t.elem) for e in value]
    return value


def lower_graph(graph, example_inputs=None, by_value=()) -> LoweredGraph:
    """Build a Fusion from `graph`; raises UnsupportedOpError naming the node that cannot lower.
    Inputs in specialised_inputs(graph) take their example value as a constant (they must be
    given); the others become fusion inputs (`input_indices`). Inputs in `by_value` (0-dim
    tensors, e.g. on the CPU beside CUDA tensors) become scalar fusion inputs made into a 0-dim
    tensor of their dtype inside the fusion (`full`), so promotion ranks them as 0-dim tensors,
    as eager does, while the value reaches the kernel as a parameter (no copy to the device)."""
    fusion = Fusion()
    env: dict = {}
    special = specialised_inputs(graph)
    indices = []
    by_value = tuple(i for i in by_value if i not in special)
    with fusion:
        for i, v in enumerate(graph.inputs):
            example = example_inputs[i] if example_inputs is not None else None
            if i in special:
                if example_inputs is None:
                    raise UnsupportedOpError(f"graph input %{v.debug_name} gives a size or other "
                                             "constant argument; lower with example inputs")
                env[v] = _host_constant(v, example)
                continue
            env[v] = _by_value_input(v, example) if i in by_value else _lower_input(v, example)
            indices.append(i)
        with lowering_device(_device_type(example_inputs, by_value)):
            for node in graph.nodes():
                _lower_node(node, env)
        output_map = []
        for v in graph.outputs:
            val = env.get(v)
            if isinstance(val, HostValue):
                output_map.append(val)
                continue
            if not isinstance(val, TensorView):
                raise UnsupportedOpError(f"graph output %{v.debug_name} is not a tensor computed by the fusion")
            if val not in fusion.outputs:
                fusion.add_output(val)
            output_map.append(fusion.outputs.index(val))
    return LoweredGraph(fusion, output_map, indices, special, by_value)


def _device_type(examples, by_value):
    """The device type of the example tensors ("cuda", "cpu"), leaving out 0-dim tensors (a CPU
    scalar beside CUDA tensors); None without examples or with several (lowering/device.py)."""
    return single_device_type(x for i, x in enumerate(examples or ())
                              if isinstance(x, torch.Tensor) and x.dim() > 0 and i not in by_value)


def _by_value_input(v, example):
    """A 0-dim tensor input passed as a scalar: a scalar fusion input of its category (int64,
    double, bool or complex double: every value of the tensor's dtype fits exactly) and a 0-dim
    tensor of the tensor's own dtype made from it."""
    if not isinstance(example, torch.Tensor) or example.dim() != 0:
        raise UnsupportedOpError(f"graph input %{v.debug_name}: only a 0-dim tensor can be "
                                 "passed by value")
    return by_value_input(example.dtype, f"graph input %{v.debug_name}")


def by_value_input(dtype, what: str):
    """A 0-dim tensor of torch `dtype` passed by value (the FX frontend's too): a scalar fusion
    input of its category (int64, double, bool or complex double: every value of the dtype fits
    exactly) and a 0-dim tensor of `dtype` made from it (`full`)."""
    try:
        dt = DataType.from_torch(dtype)
    except ValueError:
        raise UnsupportedOpError(f"{what}: dtype {dtype} is not supported") from None
    s = B.symbolic_scalar(DataType.from_python(torch.zeros((), dtype=dtype).item()))
    Fusion.current().add_input(s)
    return B.full([], s, dt)


def _host_constant(v, value):
    """A specialised input's example value, checked to be a plain host constant."""
    if not _is_python_constant(value):
        raise UnsupportedOpError(f"graph input %{v.debug_name} ({type(value).__name__}) is used "
                                 "as a constant argument but is not an int/float/bool (list)")
    return list(value) if isinstance(value, tuple) else value


def _is_python_constant(x) -> bool:
    """Not a value of the Fusion (TensorView or Scalar), nor a list holding one."""
    if isinstance(x, (list, tuple)):
        return all(_is_python_constant(e) for e in x)
    return not isinstance(x, (TensorView, Scalar, torch.Tensor))


_SHAPE_READS = ("aten::size", "prim::dtype")


def _shape_read(node, tv) -> HostValue:
    """prim::dtype(t), aten::size(t) or aten::size(t, <constant dim>) as a HostValue; only as
    graph outputs (the kernel cannot use them)."""
    if any(u.user.kind != "prim::Return" for u in node.output().uses):
        raise UnsupportedOpError(f"{where(node)}: its result is used inside the group")
    if node.kind == "prim::dtype":
        return HostValue("dtype", tv)
    if len(node.inputs) == 1:
        return HostValue("size", tv)
    dim = constant_value(node.inputs[1]) if is_constant(node.inputs[1]) else None
    if not isinstance(dim, int) or not -tv.ndim <= dim < tv.ndim:
        raise UnsupportedOpError(f"{where(node)}: dim must be a constant in [-{tv.ndim}, {tv.ndim})")
    return HostValue("size", tv, dim % tv.ndim)


def _lower_input(v, example):
    t = v.type
    if isinstance(example, torch.Tensor):
        return _tensor_input(example.dtype, list(example.shape), list(example.stride()), v)
    if isinstance(t, TensorType):
        if t.dtype is None or t.sizes is None:
            raise UnsupportedOpError(
                f"graph input %{v.debug_name} has type {t}; its dtype and rank must be known "
                "(give example inputs)")
        sizes = [-1 if s is None else s for s in t.sizes]
        return _tensor_input(t.dtype, sizes, list(t.strides) if t.strides else None, v)
    if type(t) in _SCALAR_TYPES or isinstance(example, (bool, int, float)):
        dtype = _SCALAR_TYPES.get(type(t)) or DataType.from_python(example)
        s = B.symbolic_scalar(dtype)
        Fusion.current().add_input(s)
        return s
    raise UnsupportedOpError(f"graph input %{v.debug_name} of type {t} cannot enter a fusion")


def axis_order(sizes, strides) -> list:
    """Axes innermost first, by stride. A size-1 axis' stride is arbitrary (torch gives (1, 1)
    to a transposed (1, 6) tensor), so size-1 axes never make an input look permuted: when the
    other axes are in row-major order the whole order is row-major, else size-1 axes go
    outermost. The fusion's stride order and the guard's both come from here."""
    n = len(sizes)
    big = [i for i in range(n) if sizes[i] != 1]
    order = sorted(big, key=lambda i: (strides[i], i))
    if order == sorted(big, reverse=True):
        return list(range(n - 1, -1, -1))
    return order + [i for i in range(n - 1, -1, -1) if sizes[i] == 1]


def _tensor_input(dtype, sizes, strides, v):
    return tensor_input(dtype, sizes, strides, f"graph input %{v.debug_name}")


def tensor_input(dtype, sizes, strides, what: str):
    """A fusion input for a tensor of this dtype and layout (sizes may be -1 where unknown):
    size-1 axes are broadcast axes, the others symbolic extents; contiguity and stride order
    come from the strides (axis_order). `what` names the input in errors."""
    try:
        dt = DataType.from_torch(dtype)
    except ValueError:
        raise UnsupportedOpError(f"{what}: dtype {dtype} is not supported") from None
    sizes = [1 if s == 1 else s for s in sizes]
    stride_order = None
    contiguity = None
    if strides and None not in strides and -1 not in sizes:
        order = axis_order(sizes, strides)
        stride_order = [0] * len(sizes)
        for rank, axis in enumerate(order):
            stride_order[axis] = rank
        contiguity = _contiguity(sizes, strides)
        if stride_order == list(range(len(sizes) - 1, -1, -1)):
            stride_order = None
    return B.define_tensor([s if s == 1 else -1 for s in sizes], dt, contiguity, stride_order)


def _contiguity(sizes, strides) -> list:
    """Per axis: stride equals the product of the sizes of the axes inner to it (by stride)."""
    order = sorted(range(len(sizes)), key=lambda i: (strides[i], i))
    expected, result = 1, [True] * len(sizes)
    for axis in order:
        if sizes[axis] == 1:
            result[axis] = None
            continue
        result[axis] = strides[axis] == expected
        expected = strides[axis] * sizes[axis]
    return result


def _lower_node(node, env) -> None:
    kind = node.kind
    if kind == "prim::Constant" or (kind in _LIST_KINDS and is_constant(node.output())):
        env[node.output()] = constant_value(node.output())
        return
    if kind in _LIST_KINDS:
        env[node.output()] = [env[i] if i in env else constant_value(i) for i in node.inputs]
        return
    if kind in _SHAPE_READS and node.inputs and isinstance(env.get(node.inputs[0]), TensorView):
        env[node.output()] = _shape_read(node, env[node.inputs[0]])
        return
    ok, reason = node_support(node)
    if not ok:
        raise UnsupportedOpError(f"{where(node)}: {reason}")
    args = [env[i] if i in env else constant_value(i) for i in node.inputs]
    for pos in LOWERINGS[kind].const_args:
        if pos < len(args) and not _is_python_constant(args[pos]):
            raise UnsupportedOpError(f"{where(node)}: argument {pos} must be a constant (it is "
                                     "computed in the group)")
    try:
        result = LOWERINGS[kind].handler(*args)
    except PyfuserError as e:
        raise UnsupportedOpError(f"{where(node)}: {e}") from None
    results = result if isinstance(result, tuple) else (result,)
    for i, out in enumerate(node.outputs):
        val = results[i] if i < len(results) else None
        if val is None and out.has_uses():
            raise UnsupportedOpError(f"{where(node)}: output {i} is used but not produced by the lowering")
        env[out] = val
