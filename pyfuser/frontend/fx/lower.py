"""Lowering a region of an aten FX graph to a Fusion, through the lowering table TorchScript uses.

`lower_region(region) -> LoweredRegion` builds one Fusion whose inputs are, in order, the
region's tensor inputs (dtype, size-1 axes as broadcast axes, stride order and contiguity from
the example values) and then the SymInt values it reads that are not an input's extent; its
outputs are the region's outputs. Each node goes through its table entry's handler
(`aten_overloads.entry_for`), with its arguments in schema order: FX nodes as the values they
lowered to, SymInts as the fusion's Scalars, everything else as the constant it is. The copy_
of a mutated input becomes an in-place output (`Fusion.aliases`, mutations.lower_copy); no other
lowering may write an input.

A 0-dim CPU tensor (an input, or a node's value) is marked for the lowering
(`lowering/device.mark_cpu_scalar`): eager's CUDA kernels read such an operand as a host scalar,
at their computation precision in some ops (lowering/scalar_operands.py). A region on CUDA takes
such an input by value, as TorchScript's groups do (`lowering.lower.by_value_input`: a scalar
fusion input made a 0-dim tensor of its dtype inside the fusion, so promotion is a 0-dim
tensor's): the kernel gets it as a parameter, no copy to the device, and the cached-call
programs replay (they are never recorded for a call that moved a 0-dim CPU tensor).

SymInts (dynamic shapes): a SymInt that is the size of one of the region's tensor inputs (its
expression is that axis' symbol) is that axis' extent; any other becomes a scalar input of the
fusion, passed at run time. A view's size list with one such scalar input and no -1 (a view to
`[s0 * 512, 768]`) takes -1 there, which the fusion resolves at run time as a signature fact.
So a Fusion never depends on the values of symbolic sizes: a new batch size reuses its kernels.

`region_key(region, plan)` is the canonical form of a region (ops, arguments, input layouts,
what its SymInts resolve to): regions with equal keys (the layers of a model, a recompile for
new sizes) share one LoweredRegion and so one Fusion and its compiled kernels.

Errors: `RegionLoweringError(node, reason)` names the node whose lowering failed; the compiler
marks it unsupported and partitions again.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from ...errors import PyfuserError, UnsupportedOpError
from ...ir import builder as B
from ...ir.base import Scalar
from ...ir.dtypes import DataType
from ...ir.fusion import Fusion
from ...ir.tensor import TensorView
from ..lowering import aten_activations, aten_backward, aten_factory, aten_indexing, aten_logical_reduction, aten_loss, aten_pointwise, aten_random, aten_reduction, aten_regression_loss, aten_resize, aten_shape, aten_vector_norm  # noqa: F401,E501 (fill the table)
from ..lowering import aten_factory_like, aten_repeat, aten_scatter  # noqa: F401 (fill the table)
from ..lowering.aten_overloads import entry_for, schema_args
from ..lowering.device import lowering_device, mark_cpu_scalar, single_device_type
from ..lowering.lower import by_value_input, tensor_input
from ..lowering.slice_bounds import OPEN, clamped_bound
from ..lowering.sink_views import sink_output_views
from .meta import hint, meta, shape_hints, stride_hints
from .mutations import CopyLoweringError, is_input_copy, lower_copy

# Ops whose size-list argument may take a -1 where it has one symbolic entry.
_SIZE_ARG = {"aten::view": 1, "aten::_unsafe_view": 1, "aten::reshape": 1}


class RegionLoweringError(PyfuserError):
    def __init__(self, node, reason: str):
        self.node = node
        super().__init__(f"{node.format_node() if hasattr(node, 'format_node') else node}: {reason}")
        self.reason = reason


@dataclass
class LoweredRegion:
    fusion: Fusion
    n_tensor_inputs: int
    scalar_inputs: list       # indices into region.inputs passed as scalars: SymInts, and the
                              # 0-dim CPU tensors of a region on CUDA (by value: FusedRegion)
    outputs: list             # per region output, the index of its fusion output
    out_layouts: list         # per region output: (axes outermost first, dense?) of eager's value


def _sym_expr(x):
    node = getattr(x, "node", None)
    return getattr(node, "expr", None)


def resolve_symints(region) -> list:
    """Per region input: None for a tensor, ("extent", k, axis) for a SymInt that is the size of
    tensor input k's axis, ("scalar",) for another SymInt (a fusion scalar input), ("value",)
    for a 0-dim CPU tensor read by a region on CUDA (a scalar fusion input too: by value)."""
    by_value = _device_type(region) == "cuda"
    sizes = {}
    for k, x in enumerate(region.inputs):
        v = meta(x)
        if isinstance(v, torch.Tensor):
            for axis, s in enumerate(v.shape):
                e = _sym_expr(s)
                if e is not None and getattr(e, "is_Symbol", False) and e not in sizes:
                    sizes[e] = (k, axis)
    plan = []
    for x in region.inputs:
        v = meta(x)
        if isinstance(v, torch.Tensor):
            plan.append(("value",) if by_value and _cpu_scalar(v) else None)
            continue
        e = _sym_expr(v)
        hit = sizes.get(e) if e is not None else None
        plan.append(("extent", *hit) if hit is not None else ("scalar",))
    return plan


def _input_sig(v) -> tuple:
    if isinstance(v, torch.Tensor):
        sizes, strides = shape_hints(v), stride_hints(v)
        ones = tuple(s == 1 for s in sizes)
        order = tuple(sorted(range(len(sizes)), key=lambda i: (-strides[i], i)))
        return ("t", str(v.dtype), v.device.type, ones, order,
                tuple(st for s, st in zip(sizes, strides) if s != 1 and st in (0, 1)),
                _dense_sig(sizes, strides))
    return ("s", type(v).__name__)


def _dense_sig(sizes, strides) -> tuple:
    """Which axes' strides are the product of the sizes inner to them (by stride)."""
    order = sorted(range(len(sizes)), key=lambda i: (strides[i], i))
    out, expected = [], 1
    for a in order:
        if sizes[a] == 1:
            continue
        out.append(strides[a] == expected)
        expected = strides[a] * sizes[a]
    return tuple(out)


def region_key(region, plan) -> tuple:
    index = {x: ("i", k) for k, x in enumerate(region.inputs)}
    for j, n in enumerate(region.nodes):
        index[n] = ("n", j)

    def canon(a):
        if isinstance(a, torch.fx.Node):
            return index[a]
        if isinstance(a, (list, tuple)):
            return (type(a).__name__, tuple(canon(x) for x in a))
        if isinstance(a, dict):
            return tuple(sorted((k, canon(v)) for k, v in a.items()))
        if isinstance(a, float):
            return ("f", repr(a))
        return (type(a).__name__, str(a))

    key = [("in", _input_sig(meta(x)), plan[k]) for k, x in enumerate(region.inputs)]
    for n in region.nodes:
        key.append((str(n.target), canon(n.args), canon(n.kwargs), _traced_facts(n)))
    key.append(("out", tuple(index[o] for o in region.outputs)))
    return tuple(key)


def lower_region(region, plan=None) -> LoweredRegion:
    plan = resolve_symints(region) if plan is None else plan
    fusion = Fusion()
    env: dict = {}
    scalar_inputs = []
    with fusion:
        tensors = [(k, x) for k, x in enumerate(region.inputs) if plan[k] is None]
        for k, x in tensors:
            v = meta(x)
            env[x] = tensor_input(v.dtype, shape_hints(v), stride_hints(v), f"region input {x.name}")
        for k, x in enumerate(region.inputs):
            p = plan[k]
            if p is None:
                continue
            if p[0] == "extent":
                env[x] = env[region.inputs[p[1]]].logical[p[2]].extent
            elif p[0] == "value":
                env[x] = by_value_input(meta(x).dtype, f"region input {x.name}")
                scalar_inputs.append(k)
            else:
                s = B.symbolic_scalar(_scalar_dtype(meta(x)))
                fusion.add_input(s)
                env[x] = s
                scalar_inputs.append(k)
        with lowering_device(_device_type(region)):
            for x in region.inputs:
                if _cpu_scalar(meta(x)):
                    mark_cpu_scalar(env[x])
            for n in region.nodes:
                if is_input_copy(n):          # an in-place output (mutations.py)
                    try:
                        env[n] = lower_copy(n, env)
                    except CopyLoweringError as e:
                        raise RegionLoweringError(n, str(e)) from None
                    continue
                written = len(fusion.aliases)
                env[n] = _lower_node(n, env)
                if _cpu_scalar(meta(n)):
                    mark_cpu_scalar(env[n])
                if len(fusion.aliases) != written:
                    # a functional graph's ops write nothing: in-place lowerings stay out (the
                    # graph's own copy_ nodes say what is written)
                    raise RegionLoweringError(n, "its lowering writes an input in place")
        outs = []
        for o in region.outputs:
            val = env[o]
            if not isinstance(val, TensorView):
                raise RegionLoweringError(o, "its result is not a tensor the fusion computes")
            if val not in fusion.outputs:
                fusion.add_output(val)
            outs.append(fusion.outputs.index(val))
    layouts = [_layout(meta(o)) for o in region.outputs]
    # views move past the pointwise ops after them to outputs eager lays out row-major
    sink_output_views(fusion, [fusion.outputs[k] for k, (order, dense) in zip(outs, layouts)
                               if dense and list(order) == sorted(order)])
    return LoweredRegion(fusion, len(tensors), scalar_inputs, outs, layouts)


def _cpu_scalar(v) -> bool:
    """A 0-dim CPU tensor: what a CUDA kernel of eager reads as a host scalar
    (lowering/device.py), Dynamo's unspecialised floats among them."""
    return isinstance(v, torch.Tensor) and v.dim() == 0 and v.device.type == "cpu"


def _device_type(region):
    """The device type of the region's tensors ("cuda", "cpu"; 0-dim CPU tensors, which eager
    reads as scalars next to CUDA tensors, count only where they are all), None when they do
    not say one: lowerings whose results depend on it (lowering/device.py) follow eager there."""
    vals = [meta(x) for x in list(region.inputs) + list(region.nodes)]
    vals = [t for v in vals for t in (v if isinstance(v, (tuple, list)) else (v,))
            if isinstance(t, torch.Tensor)]
    return single_device_type([t for t in vals if not _cpu_scalar(t)] or vals)


def _layout(v):
    from .meta import layout
    return layout(v) if isinstance(v, torch.Tensor) else (None, False)


def _scalar_dtype(v) -> DataType:
    if isinstance(v, torch.SymFloat):
        return DataType.Double
    if isinstance(v, torch.SymBool):
        return DataType.Bool
    return DataType.Int


def _lower_node(n, env):
    if n.target is operator.getitem:
        src, idx = n.args
        vals = env[src]
        val = vals[idx] if isinstance(vals, (tuple, list)) and idx < len(vals) else None
        if not isinstance(val, TensorView):
            raise RegionLoweringError(n, f"output {idx} of {src.name} is not produced by its lowering")
        return val
    entry = entry_for(n.target)
    args = schema_args(n.target, n.args, n.kwargs)
    lowered = [_arg(a, env) for a in args]
    pos = _SIZE_ARG.get(entry.kind)
    if pos is not None:
        lowered[pos] = _one_symbolic_as_minus_one(lowered[pos])
        for i in _minus_ones_traced_as_one(n, pos):
            lowered[pos][i] = 1
    if entry.kind == "aten::slice":
        for i in _bounds_past_size(n):
            lowered[i] = clamped_bound(lowered[0].logical[_slice_dim(n)].full_extent, lowered[i])
    if entry.kind == "aten::slice_backward":
        size = lowered[1][lowered[2] % len(lowered[1])]
        for i in _bounds_past_size(n) if isinstance(size, Scalar) else ():
            lowered[i] = clamped_bound(size, lowered[i])
    try:
        result = entry.handler(*lowered)
    except PyfuserError as e:
        raise RegionLoweringError(n, str(e)) from None
    if isinstance(result, tuple):
        outs = meta(n)
        if isinstance(outs, (tuple, list)):
            for i, (r, m) in enumerate(zip(result, outs)):
                if r is not None and m is not None and not _matches(r, m):
                    raise RegionLoweringError(n, f"output {i}: the lowering gives {r.dtype.name} "
                                                 f"rank {r.ndim}, eager {m.dtype} rank {m.dim()}")
        return result
    if not isinstance(result, TensorView):
        raise RegionLoweringError(n, "its lowering does not give a tensor")
    m = meta(n)
    if isinstance(m, torch.Tensor) and not _matches(result, m):
        raise RegionLoweringError(n, f"the lowering gives {result.dtype.name} rank {result.ndim}, "
                                     f"eager {m.dtype} rank {m.dim()}")
    return _ones_as_broadcasts(result, _traced_ones(n))


def _traced_ones(n) -> tuple:
    """The axes of node n's traced tensor result whose size is the constant 1 (part of the
    region key: Dynamo's graph holds such a size as the constant, so it is 1 on every call)."""
    m = meta(n)
    if n.op != "call_function" or not isinstance(m, torch.Tensor):
        return ()
    return tuple(i for i, s in enumerate(m.shape) if type(s) is int and s == 1)


def _ones_as_broadcasts(tv: TensorView, ones: tuple) -> TensorView:
    """tv with the axes the trace says are 1 but the Fusion holds as full axes (a size a slice,
    pad or cat computes from a symbolic input extent: `x[:, 2:]` of a static [4, 3] x, whose
    input extent the Fusion keeps symbolic so that regions of other sizes share it, or the pad of
    a slice's gradient `pad(g[:, :0], [0, 1])`) made broadcast axes through a view, checked when
    the sizes are bound: a later op broadcasts them, as eager does (`x[:, 2:] * x`, the expand of
    a sum's gradient), where a full axis of size 1 ran the region eagerly on every call (dynamic
    fuzz seed 913008)."""
    axes = tv.logical
    if not any(not axes[i].is_broadcast for i in ones) or \
            any(d.expanded_extent is not None for d in axes):
        return tv
    return B.reshape(tv, [1 if i in ones else d.extent for i, d in enumerate(axes)])


def _traced_facts(n) -> tuple:
    """What the lowering of node n takes from the traced sizes (its example values) besides its
    arguments: part of the region key."""
    entry = entry_for(n.target) if n.op == "call_function" else None
    pos = _SIZE_ARG.get(entry.kind) if entry is not None else None
    return (tuple(_bounds_past_size(n)),
            tuple(_minus_ones_traced_as_one(n, pos)) if pos is not None else (),
            _traced_ones(n))


def _minus_ones_traced_as_one(n, pos: int) -> list:
    """The positions of a view's size list where it has -1 and the traced result has the
    constant size 1 (`x.reshape(x.shape[0], -1)` of an [n, 1] x): lowered as 1, a broadcast axis
    that later ops broadcast, not an extent inferred at run time (which an expand or a binary op
    with an [n, m] operand could not broadcast: the region ran eagerly on every call; fuzz seed
    912022). Dynamo's graph holds that size as the constant 1, so it is 1 on every call."""
    args = schema_args(n.target, n.args, n.kwargs)
    sizes, out = (args[pos] if len(args) > pos else None), meta(n)
    if not isinstance(sizes, (list, tuple)) or not isinstance(out, torch.Tensor) or \
            len(sizes) != out.dim():
        return []
    return [i for i, (s, o) in enumerate(zip(sizes, out.shape))
            if isinstance(s, int) and s == -1 and type(o) is int and o == 1]


def _slice_dim(n) -> int:
    args = schema_args(n.target, n.args, n.kwargs)
    return args[1] % max(meta(args[0]).dim(), 1)


def _bounds_past_size(n) -> list:
    """For an aten.slice node, the positions (2: start, 3: end) of its constant bounds that lie
    outside its input's axis at the traced sizes (`x[:, :512]` of a sequence of 20, `x[5:]` or
    `x[-5:]` of 3). The axis is symbolic in the Fusion, where such a bound stays a constant
    checked when the sizes are bound (slice_bounds.py; `x[-5:]` has the constant extent 5),
    which then fails on every call Dynamo's guards let this graph take (the slice's size says on
    which side of the bound n lies) and ran the region eagerly; lowered as the clamped bound
    instead (slice_bounds.clamped_bound, a scalar of n): right for any size. Part of the region
    key, so regions traced on the two sides do not share a Fusion."""
    if str(n.target) not in ("aten.slice.Tensor", "aten.slice_backward.default"):
        return []
    args = schema_args(n.target, n.args, n.kwargs)
    if str(n.target) == "aten.slice_backward.default":
        # its gradient's pads (the start, the size less the end) likewise: input_sizes, dim,
        # start, end at positions 1-4 (a recompile for n < 12 of `x[:12]`'s gradient)
        sizes, dim = args[1], args[2]
        if not isinstance(sizes, (list, tuple)) or not sizes or not isinstance(dim, int):
            return []
        size = sizes[dim % len(sizes)]
        size = meta(size) if isinstance(size, torch.fx.Node) else size
        if not isinstance(size, (int, torch.SymInt)):
            return []
        size, positions = hint(size), (3, 4)
    elif str(n.target) == "aten.slice.Tensor":
        x = meta(args[0]) if isinstance(args[0], torch.fx.Node) else None
        if not isinstance(x, torch.Tensor) or x.dim() == 0 or not isinstance(args[1], int):
            return []
        size, positions = hint(x.shape[_slice_dim(n)]), (2, 3)
    return [i for i in positions if isinstance(args[i], int) and not isinstance(args[i], bool)
            and (size < args[i] < OPEN or args[i] < -size)]


def _matches(tv, m) -> bool:
    return isinstance(tv, TensorView) and tv.dtype.torch == m.dtype and tv.ndim == m.dim()


def _arg(a, env):
    if isinstance(a, torch.fx.Node):
        if a not in env:
            raise UnsupportedOpError(f"{a.name} is not available to the region")
        return env[a]
    if isinstance(a, (list, tuple)):
        return [_arg(x, env) for x in a]
    if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise UnsupportedOpError(f"a symbolic value {a} that is not an FX node")
    if isinstance(a, torch.device):
        return str(a)
    return a


def _one_symbolic_as_minus_one(sizes):
    """A size list whose one entry is a scalar input (not an extent the fusion knows) takes -1
    there instead: an extent the binding infers, which the kernel signature knows about. Not
    where another entry is 0: a -1 among no elements has no value (`grad.view(1, s1, 0)`, the
    backward of a reshape of an empty slice, ran eagerly on every call; dynamic fuzz seed
    913203), and the scalar is bound as it is."""
    if not isinstance(sizes, list) or any(_is_zero(s) for s in sizes):
        return sizes
    inputs = Fusion.current().inputs
    sym = [i for i, s in enumerate(sizes) if isinstance(s, Scalar) and any(s is v for v in inputs)]
    if len(sym) == 1 and -1 not in sizes:
        sizes = list(sizes)
        sizes[sym[0]] = -1
    return sizes


def _is_zero(s) -> bool:
    if isinstance(s, Scalar):
        return s.is_const and s.value == 0
    return isinstance(s, int) and s == 0


__all__ = ["LoweredRegion", "RegionLoweringError", "lower_region", "region_key",
           "resolve_symints", "hint"]
