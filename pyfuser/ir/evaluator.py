"""The reference evaluator: runs any Fusion with eager PyTorch ops, on any device.

`evaluate(fusion, inputs)` binds sizes first (`shapes.bind`, which validates the inputs), then walks
`fusion.exprs` in order, skipping exprs no output needs, and dispatches on the Expr class through
HANDLERS. Elementwise ops call the op table's `ref`, scalars are passed as Python numbers (so they
act as PyTorch's wrapped numbers), and data movement uses the torch op eager would use.

Invariants (this is the oracle every other test compares against):
- results equal eager PyTorch's, dtype included: half/bfloat16 ops round exactly where eager does;
- metadata ops (broadcast, expand, squeeze, view/reshape, permute) return views of their input
  wherever torch does; `set` copies;
- an output that is an input is returned as the same tensor object; an output registered in
  `fusion.aliases` (output -> input) is written into that input, which is returned.
"""
from __future__ import annotations

import torch

from . import exprs as E
from .base import Scalar
from .shapes import Bindings, bind
from .tensor import TensorView


class _Env:
    """Values computed so far: tensors by Val identity, scalars from the Bindings."""

    def __init__(self, bindings: Bindings, device, used=()):
        self.b, self.tensors, self.device = bindings, {}, device
        self.used, self.rng = used, None        # (launch state, op numbers) once drawn

    def __getitem__(self, v):
        if isinstance(v, TensorView):
            return self.tensors[id(v)]
        return self.b.value(v)

    def __setitem__(self, v, value):
        self.tensors[id(v)] = value


def compute_dtype(e):
    """The dtype an elementwise expr computes in: its output's, or for comparisons and
    complex-to-real ops its promoted tensor operands' (None when it has none)."""
    from .dtypes import Promotion
    if e.info.promotion not in (Promotion.ALWAYS_BOOL, Promotion.COMPLEX_TO_FLOAT):
        return e.output.dtype
    skip = set(e.info.scalar_args) | ({0} if e.op_name == "where" else set())
    return next((v.dtype for i, v in enumerate(e.inputs)
                 if i not in skip and isinstance(v, TensorView)), None)


def _scalar_arg(e, i, v, env, compute):
    """A scalar operand as eager would see it: a Python number (a wrapped number, which takes
    its category only), or, when the scalar already has the computation dtype (nvFuser's typing
    of a FusionDefinition can make it so: `where(c, 0.1, 0.2)` in float64), a 0-dim tensor of
    that dtype, so the op computes in it. Half/bfloat16 stay numbers: eager computes them in
    float with the scalar at full precision."""
    value = env[v]
    if compute is None or v.dtype is not compute or compute.is_reduced_float or \
            i in e.info.scalar_args:
        return value
    return torch.tensor(value, dtype=compute.torch, device=env.device)


def _elementwise(e, env: _Env):
    out = e.output
    if isinstance(out, Scalar):
        return None  # computed by bind() on the host
    compute = compute_dtype(e)
    args = [_scalar_arg(e, i, v, env, compute) if isinstance(v, Scalar) else env[v]
            for i, v in enumerate(e.inputs)]
    try:
        result = e.info.ref(*args)
    except TypeError:
        # Some torch functions (maximum, atan2...) take no Python numbers: pass scalars as 0-dim
        # tensors of the computation dtype (what a kernel computes with).
        compute = next((v.dtype for v in e.inputs if isinstance(v, TensorView)
                        and not v.dtype.is_bool), out.dtype).torch
        if not any(isinstance(a, (bool, int, float, complex)) for a in args):
            raise
        result = e.info.ref(*(torch.tensor(a, dtype=compute, device=env.device)
                              if isinstance(a, (bool, int, float, complex)) else a for a in args))
    if not isinstance(result, torch.Tensor):
        result = torch.tensor(result, device=env.device)
    if result.dtype != out.dtype.torch:
        result = result.to(out.dtype.torch)
    return result


def _cast(e, env):
    return env[e.inputs[0]].to(e.dtype.torch)


def _set(e, env):
    return env[e.inputs[0]].clone()


def _broadcast(e, env):
    x = env[e.inputs[0]]
    for axis, new in enumerate(e.flags):
        if new:
            x = x.unsqueeze(axis)
    return x


def _expand(e, env):
    return env[e.inputs[0]].expand(env.b.shape(e.output))


def _squeeze(e, env):
    return env[e.inputs[0]].squeeze(tuple(e.dims))


def _view(e, env):
    return env[e.inputs[0]].reshape(env.b.shape(e.output))


def _permute(e, env):
    return env[e.inputs[0]].permute(e.dims)


def _reduction(e, env):
    return e.info.ref(env[e.inputs[0]], list(e.axes), False)


def _welford(e, env):
    x = env[e.inputs[0]]
    count = 1
    for a in e.axes:
        count *= x.shape[a]
    avg_tv, m2_tv, n_tv = e.outputs
    if count == 0:      # no element: mean NaN (as eager's mean), sum of squared deviations 0
        shape = [s for i, s in enumerate(x.shape) if i not in e.axes]
        avg = torch.full(shape, float("nan"), dtype=avg_tv.dtype.torch, device=x.device)
        return avg, torch.zeros_like(avg, dtype=m2_tv.dtype.torch), \
            torch.zeros_like(avg, dtype=n_tv.dtype.torch)
    var, avg = torch.var_mean(x, dim=list(e.axes), correction=0)
    n = torch.full_like(avg, count, dtype=n_tv.dtype.torch)
    return avg.to(avg_tv.dtype.torch), (var * count).to(m2_tv.dtype.torch), n


def _full(e, env):
    shape = [int(env.b.value(s)) for s in e.shape]
    return torch.full(shape, env[e.inputs[0]], dtype=e.output.dtype.torch, device=env.device)


def _iota(e, env):
    length, start, step = (env[v] for v in e.inputs)
    dtype = e.output.dtype.torch
    idx = torch.arange(int(length), device=env.device, dtype=dtype)
    return idx * step + start if step != 1 or start != 0 else idx


def _gather(e, env):
    return torch.gather(env[e.inputs[0]], e.dim, env[e.inputs[1]])


def _index_select(e, env):
    x, index = env[e.inputs[0]], env[e.inputs[1]]
    if index.dim() <= 1:
        return torch.index_select(x, e.dim, index)
    picked = torch.index_select(x, e.dim, index.reshape(-1))
    return picked.reshape(*x.shape[:e.dim], *index.shape, *x.shape[e.dim + 1:])


def _embedding_backward(e, env):
    """Eager's own op (its sums are eager's, not a kernel's token order), after the op's check
    of every index against the rows (eager's op does not check them all)."""
    grad, index = env[e.inputs[0]], env[e.inputs[1]]
    rows = e.num_weights if isinstance(e.num_weights, int) else int(env.b.value(e.num_weights))
    if index.numel():                      # (one pass over the indices, one device sync)
        low, high = torch.stack(torch.aminmax(index)).tolist()
        if low < 0 or high >= rows:
            raise IndexError(f"embedding_dense_backward: index out of range (an index outside "
                             f"[0, {rows}) in {e.inputs[1].name})")
    return torch.ops.aten.embedding_dense_backward(grad, index, rows, e.padding_idx, False)


def _slice(e, env):
    def v(b):
        return int(env.b.value(b)) if isinstance(b, Scalar) else b
    return env[e.inputs[0]][tuple(slice(v(a), v(b), s)
                                  for a, b, s in zip(e.starts, e.ends, e.steps))]


def _pad(e, env):
    x, value = env[e.inputs[0]], env[e.inputs[1]]
    pads = [tuple(int(env.b.value(p)) if isinstance(p, Scalar) else p for p in pair)
            for pair in e.pads]
    fill = float(value) if x.is_floating_point() else value
    if any(s != 1 for s in e.steps):        # spread apart: the scalar everywhere, then inp
        shape = [lo + E.span(n, s) + hi for n, (lo, hi), s in zip(x.shape, pads, e.steps)]
        out = torch.full(shape, fill, dtype=x.dtype, device=x.device)
        out[tuple(slice(lo, lo + E.span(n, s), s)
                  for n, (lo, _), s in zip(x.shape, pads, e.steps))] = x
        return out
    flat = [p for lo_hi in reversed(pads) for p in lo_hi]        # F.pad: last axis first
    return torch.nn.functional.pad(x, flat, value=fill)


def _cat(e, env):
    return torch.cat([env[v] for v in e.inputs], e.dim)


def _random(e, env):
    """torch's default generator of the fusion's device draws the values."""
    a, b = (env[v] for v in e.inputs)
    shape = [int(env.b.value(s)) for s in e.shape]
    out = torch.empty(shape, dtype=e.output.dtype.torch, device=env.device)
    return out.uniform_(a, b) if e.kind == "uniform" else out.normal_(a, b)


def _philox(e, env):
    """The kernel's random numbers (ir/philox.py) at every element's row-major index: one draw
    of the launch state per evaluate, each random op numbered in expr order, as a kernel does."""
    from .philox import uniform
    if env.rng is None:
        from ..runtime.rng import host_draw
        ops = [x for x in env.used if isinstance(x, E.PhiloxUniformOp)]
        env.rng = (host_draw(env.device, 4 * len(ops)), {id(x): k for k, x in enumerate(ops)})
    (seed, offset), number = env.rng
    shape = [int(env.b.value(s)) for s in e.shape]
    n = 1
    for s in shape:
        n *= s
    index = torch.arange(n, dtype=torch.int64).view(shape)
    u = uniform(seed, offset, number[id(e)], index, e.digits)
    return u.to(device=env.device, dtype=e.output.dtype.torch)


def _scalar(e, env):
    return None  # scalar results are in the Bindings


HANDLERS = {
    E.ElementwiseOp: _elementwise,
    E.CastOp: _cast,
    E.SetOp: _set,
    E.BroadcastOp: _broadcast,
    E.ExpandOp: _expand,
    E.SqueezeOp: _squeeze,
    E.ViewOp: _view,
    E.PermuteOp: _permute,
    E.ReductionOp: _reduction,
    E.WelfordOp: _welford,
    E.FullOp: _full,
    E.IotaOp: _iota,
    E.GatherOp: _gather,
    E.IndexSelectOp: _index_select,
    E.EmbeddingBackwardOp: _embedding_backward,
    E.SliceOp: _slice,
    E.CatOp: _cat,
    E.PadOp: _pad,
    E.RandomOp: _random,
    E.PhiloxUniformOp: _philox,
    E.ScalarCast: _scalar,
}


def _handler(e):
    for cls in type(e).__mro__:
        if cls in HANDLERS:
            return HANDLERS[cls]
    raise NotImplementedError(f"the reference evaluator has no handler for {type(e).__name__}")


def evaluate(fusion, inputs, device=None) -> list:
    """Run `fusion` on `inputs` (tensors and numbers, in fusion.inputs order) with eager ops.
    `device`: where tensors made without tensor inputs go (a segment of a larger fusion runs on
    that fusion's device), else the device of the tensor inputs, else torch's default device."""
    inputs = list(inputs)
    bindings = bind(fusion, inputs)
    device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), None) or \
        device or torch.get_default_device()
    used = fusion.used_exprs()
    env = _Env(bindings, device, used)
    for v, x in zip(fusion.inputs, inputs):
        if isinstance(v, TensorView):
            env[v] = x
    needed = {id(e) for e in used}
    for e in fusion.exprs:
        if id(e) not in needed:
            continue
        result = _handler(e)(e, env)
        if result is None:
            continue
        results = result if isinstance(result, tuple) else (result,)
        for out, r in zip(e.outputs, results):
            env[out] = r
    outs = []
    for out in fusion.outputs:
        value = env[out]
        target = fusion.aliases.get(out)
        if target is not None:
            dest = env[target]
            dest.copy_(value)
            value = dest
        outs.append(value)
    return outs
