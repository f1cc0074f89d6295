"""Prints a Fusion as text in nvFuser's format (`%kernel { ... TransformPrinter : ... }`).

Layout:
- Exprs are listed in the order nvFuser's statement sort gives: a depth-first post-order from the
  outputs, visiting each expr's inputs left to right (so a producer is printed right before the
  first consumer that needs it). A fusion without outputs prints all its exprs in creation order.
- Tensor results print as `T3_l[ iS4{i2} ]\\n   = rhs`; scalar results on one line `d5 = rhs;`.
  Binary ops with a C operator print infix (`a\\n   + b;`), other elementwise ops as
  `name(a, b);`; C math functions get nvFuser's `f` suffix when they compute in float (`rsqrtf`).
- The TransformPrinter section lists every TensorView in the same depth-first order (then inputs no
  output uses), each with its root domain and the Split/Merge transforms that lead to its leaf.

Invariant: printing is a pure function of the Fusion (no numbering changes, no side effects), so
golden-text tests are stable.
"""
from __future__ import annotations

from . import exprs as E
from .base import Val, format_constant
from .dtypes import DataType
from .tensor import TensorView

INFIX_BINARY = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "eq": "==", "ne": "!=", "lt": "<", "le": "<=",
    "gt": ">", "ge": ">=", "logical_and": "&&", "logical_or": "||", "bitwise_and": "&",
    "bitwise_or": "|", "bitwise_xor": "^", "bitwise_left_shift": "<<", "bitwise_right_shift": ">>",
}
INFIX_UNARY = {"neg": "-", "logical_not": "!", "bitwise_not": "~"}
# C math functions nvFuser prints with an `f` suffix when they compute in float.
C_MATH = frozenset("""exp exp2 expm1 log log2 log10 log1p sqrt rsqrt sin cos tan asin acos atan
    sinh cosh tanh asinh acosh atanh erf erfc erfinv lgamma ceil floor trunc atan2""".split())
REDUCTION_OP = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


# ---- ordering ---------------------------------------------------------------------------------
def sorted_exprs(fusion) -> list:
    """Exprs the outputs need, in depth-first post-order (nvFuser's print order)."""
    if not fusion.outputs:
        return list(fusion.exprs)
    order, seen = [], set()
    for out in fusion.outputs:
        root = out.definition
        if root is None or id(root) in seen:
            continue
        seen.add(id(root))
        stack = [[root, 0]]
        while stack:
            frame = stack[-1]
            e, i = frame
            if i < len(e.inputs):
                frame[1] += 1
                d = e.inputs[i].definition if isinstance(e.inputs[i], Val) else None
                if d is not None and id(d) not in seen:
                    seen.add(id(d))
                    stack.append([d, 0])
            else:
                stack.pop()
                order.append(e)
    return order


def sorted_tensors(fusion, exprs: list) -> list:
    """TensorViews in depth-first post-order over values from the outputs (an expr's inputs left
    to right, each before the value it helps define), then inputs no output uses."""
    tvs, seen = [], set()
    roots = list(fusion.outputs) if fusion.outputs else [v for e in exprs for v in e.outputs]
    for root in roots + list(fusion.inputs):
        if id(root) in seen:
            continue
        seen.add(id(root))
        stack = [[root, 0]]
        while stack:
            frame = stack[-1]
            v, i = frame
            args = v.definition.inputs if v.definition is not None else []
            if i < len(args):
                frame[1] += 1
                if isinstance(args[i], Val) and id(args[i]) not in seen:
                    seen.add(id(args[i]))
                    stack.append([args[i], 0])
            else:
                stack.pop()
                if isinstance(v, TensorView):
                    tvs.append(v)
    return tvs


# ---- expressions ------------------------------------------------------------------------------
def _assign(out, rhs: str) -> str:
    if isinstance(out, TensorView):
        return f"{out}\n   = {rhs}"
    return f"{out} = {rhs}"


def _func_name(e) -> str:
    name = e.info.name
    compute = next((v.dtype for v in e.inputs if isinstance(v, TensorView)), e.output.dtype)
    return name + "f" if name in C_MATH and compute is DataType.Float else name


def _elementwise(e) -> str:
    args, out = e.inputs, e.output
    name = e.info.name
    if len(args) == 1 and name in INFIX_UNARY:
        return _assign(out, f"{INFIX_UNARY[name]}{args[0]};")
    if len(args) == 2 and name in INFIX_BINARY:
        sep = "\n   " if isinstance(out, TensorView) else " "
        return _assign(out, f"{args[0]}{sep}{INFIX_BINARY[name]} {args[1]};")
    return _assign(out, f"{_func_name(e)}({', '.join(str(a) for a in args)});")


def _cast(e) -> str:
    return _assign(e.output, f"({e.dtype.cuda_type})({e.inputs[0]});")


def _scalar_cast(e) -> str:
    return _assign(e.output, f"({e.output.dtype.cuda_type})({e.inputs[0]});")


def _call(name: str, **attrs):
    """A printer for `name( input, attr = value, ... )` with attrs read off the expr."""
    def render(e) -> str:
        parts = [str(e.inputs[0])] + [f"{label} = {_fmt(getattr(e, field))}"
                                      for label, field in attrs.items()]
        return _assign(e.output, f"{name}( {', '.join(parts)} )")
    return render


def _fmt(x) -> str:
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(_fmt(i) for i in x) + "]"
    if isinstance(x, bool):
        return "true" if x else "false"
    return str(x)


def _reduction_init(e) -> str:
    dt, name = e.output.dtype, e.info.name
    if dt.is_floating or dt.is_complex:
        value = {"sum": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}[name]
        return format_constant(value, DataType.Double)
    if dt.is_bool:
        return format_constant(name in ("prod", "min"), DataType.Bool)
    import torch
    info = torch.iinfo(dt.torch)
    return str({"sum": 0, "prod": 1, "max": info.min, "min": info.max}[name])


def _reduction(e) -> str:
    return _assign(e.output, f"reduction( {e.inputs[0]}, op = {REDUCTION_OP[e.info.name]}, "
                             f"initial value = {_reduction_init(e)}, allreduce = false )")


def _welford(e) -> str:
    avg, m2, n = e.outputs
    return (f"{avg} (Avg),\n{m2} (Var),\n{n} (Count)\n   = Welford ( {e.inputs[0]}, "
            f"axes = {_fmt(e.axes)}, allreduce = false )")


def _full(e) -> str:
    return _assign(e.output, f"full({{{', '.join(str(s) for s in e.shape)}}}, {e.inputs[0]});")


def _iota(e) -> str:
    return _assign(e.output, f"iota({', '.join(str(a) for a in e.inputs)});")


def _indexing(e) -> str:
    return _assign(e.output, f"{e.op_name}( {e.inputs[0]}, dim = {e.dim}, index = {e.inputs[1]} )")


def _embedding_backward(e) -> str:
    return _assign(e.output, f"embedding_backward( {e.inputs[0]}, index = {e.inputs[1]}, "
                             f"num_weights = {e.num_weights}, padding_idx = {e.padding_idx} )")


def _slice(e) -> str:
    ranges = ", ".join(f"{a}:{'' if b is None else b}" + (f":{s}" if s != 1 else "")
                       for a, b, s in zip(e.starts, e.ends, e.steps))
    return _assign(e.output, f"slice( {e.inputs[0]}, [{ranges}] )")


def _pad(e) -> str:
    pads = ", ".join(f"{lo}:{hi}" + (f" step {s}" if s != 1 else "")
                     for (lo, hi), s in zip(e.pads, e.steps))
    return _assign(e.output, f"pad( {e.inputs[0]}, [{pads}], value = {e.inputs[1]} )")


def _cat(e) -> str:
    return _assign(e.output, f"cat( {', '.join(str(t) for t in e.inputs)}, dim = {e.dim} )")


def _random(e) -> str:
    a, b = e.inputs
    return _assign(e.output, f"rng_{e.kind}({{{', '.join(str(s) for s in e.shape)}}}, {a}, {b}, "
                             f"{e.output.dtype.cuda_type});")


PRINTERS = {
    E.ElementwiseOp: _elementwise,
    E.CastOp: _cast,
    E.ScalarCast: _scalar_cast,
    E.SetOp: lambda e: _call("Set", **{k: k for k in ("contiguous", "may_alias")
                                       if getattr(e, k)})(e),
    E.BroadcastOp: _call("broadcast"),
    E.ExpandOp: _call("expand", sizes="sizes"),
    E.SqueezeOp: _call("squeeze", dims="dims"),
    E.ViewOp: _call("view", new_shape="new_shape"),
    E.PermuteOp: _call("permute", dims="dims"),
    E.ReductionOp: _reduction,
    E.WelfordOp: _welford,
    E.FullOp: _full,
    E.IotaOp: _iota,
    E.GatherOp: _indexing,
    E.IndexSelectOp: _indexing,
    E.EmbeddingBackwardOp: _embedding_backward,
    E.SliceOp: _slice,
    E.CatOp: _cat,
    E.PadOp: _pad,
    E.RandomOp: _random,
}


def print_expr(e) -> str:
    for cls in type(e).__mro__:
        if cls in PRINTERS:
            return PRINTERS[cls](e)
    return _assign(e.outputs[0], f"{e.op_name}({', '.join(str(a) for a in e.inputs)});")


# ---- transforms -------------------------------------------------------------------------------
def print_transforms(tv: TensorView) -> str:
    lines = [str(tv), f" root domain : ({','.join(str(d) for d in tv.root)})"]
    lines += [f"  {t}" for t in tv.domain.transforms]
    return "\n".join(lines)


def print_fusion(fusion) -> str:
    exprs = sorted_exprs(fusion)
    body = [print_expr(e) for e in exprs]
    tvs = sorted_tensors(fusion, exprs)
    parts = ["%kernel {", *body, "", "TransformPrinter :", *(print_transforms(t) for t in tvs), "}"]
    return "\n".join(parts)


__all__ = ["print_fusion", "print_expr", "sorted_exprs", "sorted_tensors"]
