"""Checks the invariants of a Fusion; run by FusionDefinition on exit and by tests between stages.

`verify(fusion)` raises IRVerifyError (an AssertionError) naming the first broken invariant:
- every Val and Expr belongs to this fusion; each Val is defined by at most one Expr and its
  `definition` is that Expr;
- `fusion.exprs` is topological (an expr reads only inputs, constants, extents or values
  defined by an earlier expr); fusion inputs have no definition;
- outputs are TensorViews whose dependencies end in inputs, constants or tensor extents;
- elementwise ops: tensor operands have the output's rank and the computation dtype (the output
  dtype, or the common operand dtype for comparisons); `scalar_args` are scalars; where's
  condition is Bool;
- broadcast flags match input and output ranks and mark broadcast axes; reduction axes are
  reduction IterDomains of the output root and no other axis is;
- each TensorDomain's Split/Merge history leads from its root to exactly its leaf axes.
"""
from __future__ import annotations

from ..errors import PyfuserError
from . import exprs as E
from .base import Scalar, Val
from .dtypes import DataType, Promotion
from .iterdomain import Merge, Split
from .tensor import TensorView


class IRVerifyError(AssertionError, PyfuserError):
    """A Fusion breaks an IR invariant (a bug in whoever built or transformed it)."""


def _check(cond, message: str) -> None:
    if not cond:
        raise IRVerifyError(message)


def verify(fusion) -> None:
    _check_ownership_and_order(fusion)
    _check_boundary(fusion)
    for e in fusion.exprs:
        for cls in type(e).__mro__:
            if cls in EXPR_CHECKS:
                EXPR_CHECKS[cls](e)
                break
    for v in fusion.vals:
        if isinstance(v, TensorView):
            _check_transforms(v)


# ---- graph structure --------------------------------------------------------------------------
def _check_ownership_and_order(fusion) -> None:
    defined: set[int] = set()
    extents = {id(d.extent) for v in fusion.vals if isinstance(v, TensorView)
               for d in v.root + v.leaf} | \
              {id(d.expanded_extent) for v in fusion.vals if isinstance(v, TensorView)
               for d in v.root if d.expanded_extent is not None}
    inputs = {id(v) for v in fusion.inputs}
    for e in fusion.exprs:
        _check(e.fusion is fusion, f"{e!r} belongs to another fusion")
        for v in e.inputs:
            _check(isinstance(v, Val), f"{e.op_name}: operand {v!r} is not an IR value")
            _check(v.fusion is fusion, f"{e.op_name}: operand {v} belongs to another fusion")
            if v.definition is not None:
                _check(id(v) in defined, f"exprs are not topological: {e.op_name} reads {v} "
                                         "before the expr that defines it")
            else:
                leaf_ok = id(v) in inputs or id(v) in extents or \
                    (isinstance(v, Scalar) and v.is_const)
                _check(leaf_ok, f"{e.op_name}: operand {v} is neither a fusion input, a constant, "
                                "a tensor extent nor computed in the fusion")
        for v in e.outputs:
            _check(id(v) not in defined, f"{v} is defined twice")
            _check(v.definition is e, f"{v}.definition is not the expr that defines it")
            defined.add(id(v))


def _check_boundary(fusion) -> None:
    for v in fusion.inputs:
        _check(v.definition is None, f"fusion input {v} has a definition")
        _check(v.fusion is fusion, f"fusion input {v} belongs to another fusion")
    for v in fusion.outputs:
        _check(isinstance(v, TensorView), f"fusion output {v!r} is not a TensorView")
        _check(v.fusion is fusion, f"fusion output {v} belongs to another fusion")
        _check(v.definition is not None or v in fusion.inputs,
               f"fusion output {v} is neither computed nor an input")


# ---- per expr kind ----------------------------------------------------------------------------
def _check_elementwise(e) -> None:
    info, out = e.info, e.output
    _check(len(e.inputs) == info.arity, f"{e.op_name}: {len(e.inputs)} operands, arity {info.arity}")
    for i in info.scalar_args:
        _check(isinstance(e.inputs[i], Scalar), f"{e.op_name}: operand {i} must be a scalar")
    skip = set(info.scalar_args) | ({0} if e.op_name == "where" else set())
    if e.op_name == "where":
        _check(e.inputs[0].dtype is DataType.Bool, "where: condition is not Bool")
    tensors = [v for i, v in enumerate(e.inputs) if isinstance(v, TensorView)]
    promoted = [v for i, v in enumerate(e.inputs) if isinstance(v, TensorView) and i not in skip]
    if isinstance(out, TensorView):
        for t in tensors:
            _check(t.ndim == out.ndim, f"{e.op_name}: operand {t} has rank {t.ndim}, output "
                                       f"{out} has rank {out.ndim}")
    else:
        _check(not tensors, f"{e.op_name}: scalar output {out} computed from tensors")
    if info.promotion is Promotion.ALWAYS_BOOL:
        _check(out.dtype is DataType.Bool, f"{e.op_name}: output {out} is not Bool")
        compute = promoted[0].dtype if promoted else None
    elif info.promotion is Promotion.COMPLEX_TO_FLOAT:
        compute = promoted[0].dtype if promoted else None
        _check(compute is None or not compute.is_complex or not out.dtype.is_complex,
               f"{e.op_name}: output {out} of a complex operand must be real")
    else:
        compute = out.dtype
    for t in promoted:
        _check(t.dtype is compute, f"{e.op_name}: operand {t} is {t.dtype.name}, the op computes "
                                   f"in {compute.name if compute else None}")
    if compute is not None:
        _check(info.accepts_dtype(compute), f"{e.op_name}: does not take {compute.name}")


def _check_unary_shape(e) -> None:
    """Ops whose output has the input's axes one to one (cast, set)."""
    inp, out = e.inputs[0], e.output
    if isinstance(inp, TensorView):
        _check(isinstance(out, TensorView) and out.ndim == inp.ndim,
               f"{e.op_name}: output {out} does not have the rank of {inp}")
    if isinstance(e, E.CastOp):
        _check(out.dtype is e.dtype, f"cast: output {out} is not {e.dtype.name}")
    else:
        _check(out.dtype is inp.dtype, f"set: output {out} changes dtype")


def _check_broadcast(e) -> None:
    inp, out = e.inputs[0], e.output
    _check(len(e.flags) == out.ndim, f"broadcast: {len(e.flags)} flags for rank-{out.ndim} output {out}")
    _check(len(e.flags) - sum(e.flags) == inp.ndim,
           f"broadcast: flags {e.flags} keep {len(e.flags) - sum(e.flags)} axes of rank-{inp.ndim} {inp}")
    for i, f in enumerate(e.flags):
        if f:
            _check(out.logical[i].is_broadcast, f"broadcast: new axis {i} of {out} is not a broadcast")


def _check_reduction(e) -> None:
    inp, out = e.inputs[0], e.outputs[0]
    _check(len(out.root) == inp.ndim, f"{e.op_name}: output root of {out} has {len(out.root)} axes, "
                                      f"input {inp} has rank {inp.ndim}")
    for i, d in enumerate(out.root):
        _check(d.is_reduction == (i in e.axes),
               f"{e.op_name}: axis {i} of {out} is {'not ' if i in e.axes else ''}a reduction axis "
               f"but reduction axes are {e.axes}")


def _check_permute(e) -> None:
    _check(sorted(e.dims) == list(range(e.inputs[0].ndim)),
           f"permute: dims {e.dims} are not a permutation of rank {e.inputs[0].ndim}")


def _check_squeeze(e) -> None:
    _check(e.output.ndim == e.inputs[0].ndim - len(e.dims), f"squeeze: output rank of {e.output}")


def _check_indexing(e) -> None:
    inp, index, out = e.inputs[0], e.inputs[1], e.output
    _check(index.dtype in (DataType.Int, DataType.Int32), f"{e.op_name}: index {index} is not Int")
    _check(out.dtype is inp.dtype, f"{e.op_name}: output {out} changes dtype")
    _check(0 <= e.dim < max(inp.ndim, 1), f"{e.op_name}: dim {e.dim} out of range")
    want = index.ndim if isinstance(e, E.GatherOp) else inp.ndim - 1 + max(index.ndim, 1)
    _check(out.ndim == want, f"{e.op_name}: output {out} has rank {out.ndim}, expected {want}")


def _check_embedding_backward(e) -> None:
    grad, index, out = e.inputs[0], e.inputs[1], e.output
    _check(index.dtype in (DataType.Int, DataType.Int32), f"{e.op_name}: index {index} is not Int")
    _check(out.dtype is grad.dtype and grad.dtype.is_floating,
           f"{e.op_name}: output {out} must have the floating dtype of {grad}")
    n = e.num_weights
    _check(out.ndim == 2 and (out.logical[0].extent is n if isinstance(n, Scalar) else
                              out.logical[0].extent.value == n),
           f"{e.op_name}: output {out} is not [{n}, H]")


def _check_slice(e) -> None:
    inp, out = e.inputs[0], e.output
    _check(len(e.starts) == len(e.ends) == inp.ndim == out.ndim,
           f"slice: bounds {e.starts}, {e.ends} do not match ranks of {inp} and {out}")
    _check(all(isinstance(a, Scalar) or isinstance(b, Scalar) or
               (0 <= a and (b is None or a <= b)) for a, b in zip(e.starts, e.ends)),
           f"slice: bad bounds {e.starts} {e.ends}")
    _check(all(b.dtype is DataType.Int for b in e.starts + e.ends if isinstance(b, Scalar)),
           f"slice: bounds {e.starts} {e.ends} that are not Int scalars")
    _check(len(e.steps) == inp.ndim and all(type(s) is int and s >= 1 for s in e.steps),
           f"slice: steps {e.steps} are not one int >= 1 per axis")


def _check_pad(e) -> None:
    inp, out = e.inputs[0], e.output
    _check(len(e.pads) == inp.ndim == out.ndim and out.dtype is inp.dtype,
           f"pad: pads {e.pads} do not match {inp} and {out}")
    _check(all(p.dtype is DataType.Int if isinstance(p, Scalar) else p >= 0
               for pair in e.pads for p in pair), f"pad: negative or non-Int pads {e.pads}")
    _check(len(e.steps) == inp.ndim and all(type(s) is int and s >= 1 for s in e.steps),
           f"pad: steps {e.steps} are not one int >= 1 per axis")


def _check_cat(e) -> None:
    out = e.output
    for t in e.inputs:
        _check(t.ndim == out.ndim and t.dtype is out.dtype,
               f"cat: input {t} does not match the rank and dtype of {out}")


def _check_random(e) -> None:
    _check(e.output.dtype.is_floating, f"{e.op_name}: output {e.output} is not floating")
    _check(len(e.shape) == e.output.ndim, f"{e.op_name}: shape {e.shape} vs {e.output}")
    _check(all(isinstance(v, Scalar) for v in e.inputs), f"{e.op_name}: parameters must be scalars")


EXPR_CHECKS = {
    E.ElementwiseOp: _check_elementwise,
    E.CastOp: _check_unary_shape,
    E.SetOp: _check_unary_shape,
    E.BroadcastOp: _check_broadcast,
    E.ReductionOp: _check_reduction,
    E.WelfordOp: _check_reduction,
    E.PermuteOp: _check_permute,
    E.SqueezeOp: _check_squeeze,
    E.GatherOp: _check_indexing,
    E.IndexSelectOp: _check_indexing,
    E.EmbeddingBackwardOp: _check_embedding_backward,
    E.SliceOp: _check_slice,
    E.CatOp: _check_cat,
    E.PadOp: _check_pad,
    E.RandomOp: _check_random,
}


# ---- transforms -------------------------------------------------------------------------------
def _check_transforms(tv: TensorView) -> None:
    current = list(tv.root)
    for t in tv.domain.transforms:
        ins = [t.input] if isinstance(t, Split) else [t.outer, t.inner]
        _check(isinstance(t, (Split, Merge)), f"{tv}: unknown transform {t!r}")
        for d in ins:
            _check(any(d is c for c in current),
                   f"{tv}: transform `{t}` reads {d}, which is not a current axis")
        current = [c for c in current if not any(c is d for d in ins)] + list(t.outputs)
    got, want = sorted(id(d) for d in current), sorted(id(d) for d in tv.leaf)
    _check(got == want, f"{tv}: replaying its transforms from the root domain gives "
                        f"({', '.join(map(str, current))}), not the leaf domain")
