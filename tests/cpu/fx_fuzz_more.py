"""More ops for the torch.compile backend's fuzzer (fx_fuzz.py): the pointwise ops,
reductions and normalizations pyfuser's lowering table takes that fx_fuzz's own generators do
not draw (trigonometric and hyperbolic functions, erf / erfc / erfinv, exp2 / expm1 / log1p /
log2 / log10, reciprocal, sign, rounding, isnan / isinf / isfinite, the activations relu6,
hardtanh, hardsigmoid, hardswish, leaky_relu, elu, selu, celu, glu, softplus, mish,
logsigmoid; a vector norm and F.normalize; atan2, remainder, fmod, floor and trunc
divisions, logical and bitwise ops, xlogy, the MSE, smooth L1, Huber and soft margin losses,
lerp, addcmul, masked_fill; amin, logsumexp, std, var_mean / std_mean, max / min over a
dim, cumsum, rms_norm, group_norm, batch_norm, flip, index_add into zeros) and a few it does
not lower (prod, argmax: they must run eagerly, right).

`fx_fuzz.generate(seed, more_ops=True)` draws a seed's program as before, then 1-4 lines of
these from a random stream of their own (seed-derived), over the program's values, each an
extra output: the program without them is the seed's usual one. `bench/fuzz_fx.py --more-ops`.
Every line runs eagerly as it is drawn (a line eager rejects is drawn again), as fx_fuzz's.
Integer divisors are drawn without zeros (CPU eager raises on an integer division by zero,
a kernel gives a value: docs/fuzzing.md).
"""
from __future__ import annotations

import random

import torch

from fx_fuzz_base import BOOL, _Builder, _scalar

MORE_UNARY = ["torch.cos", "torch.tan", "torch.sinh", "torch.cosh", "torch.asin", "torch.acos",
              "torch.atan", "torch.erf", "torch.erfc", "torch.erfinv", "torch.exp2",
              "torch.expm1", "torch.log1p", "torch.log2", "torch.log10", "torch.reciprocal",
              "torch.sign", "torch.sgn", "torch.ceil", "torch.round", "torch.trunc",
              "torch.frac", "torch.isnan", "torch.isinf", "torch.isfinite", "torch.square",
              "F.relu6", "F.hardtanh", "F.hardsigmoid", "F.hardswish", "F.mish",
              "torch.bitwise_not", "F.elu", "F.softplus", "F.logsigmoid"]
# (op, extra arguments) for the activations with parameters
PARAM_UNARY = [("F.leaky_relu", ", 0.2"), ("F.elu", ", alpha=0.5"),
               ("F.softplus", ", beta=2.0, threshold=5.0"), ("F.hardtanh", ", -0.5, 2.0"),
               ("torch.clamp_min", ", 0.5"), ("torch.clamp_max", ", -0.25"),
               ("F.selu", ""), ("F.celu", ", alpha=1.3"), ("F.glu", ", -1"),
               ("F.normalize", ", dim=-1"), ("torch.linalg.vector_norm", ", ord=3.0, dim=-1")]
MORE_BINARY = ["torch.atan2", "torch.remainder", "torch.fmod", "torch.logical_and",
               "torch.logical_or", "torch.logical_xor", "torch.bitwise_and", "torch.bitwise_or",
               "torch.bitwise_xor", "torch.ge", "torch.le", "torch.floor_divide", "torch.xlogy",
               "F.mse_loss", "F.smooth_l1_loss", "F.huber_loss", "F.soft_margin_loss"]
DIVIDING = ("torch.remainder", "torch.fmod", "torch.floor_divide")
# ops whose result turns on an operand being exactly 0 (or on which of two values is larger)
TRUTH = ("torch.logical_and", "torch.logical_or", "torch.logical_xor", "torch.ge", "torch.le")
# unary ops whose result jumps at 0: sign(1e-6) is 1, sign(0) 0; ceil / floor likewise
JUMP_AT_ZERO = ("torch.sign", "torch.sgn", "torch.ceil", "torch.floor")


def _broadcastable(a, b) -> bool:
    for p, q in zip(reversed(tuple(a)), reversed(tuple(b))):
        if p != q and p != 1 and q != 1:
            return False
    return True


def _no_int_zero(u: torch.Tensor) -> bool:
    return u.is_floating_point() or (u.numel() > 0 and bool((u != 0).all()))


def _divisor_ok(b: _Builder, u: torch.Tensor) -> bool:
    """u may divide (or be atan2's x): an input, or no float element near 0. A computed value
    near 0 is rounding noise (a layer norm of a constant row: eager's ~1e-7, pyfuser's 0), and a
    division turns it into any value (seed 870988: `reciprocal(layer_norm(layer_norm(x)))`,
    1.2e8 against inf, 1.5e7 against -2e7); fx_fuzz's div and pow take inputs only for that."""
    return (not u.is_floating_point() or any(u is v for n, v in b.env.items() if n[0] == "x")
            or bool((u.abs() >= 1e-3).all()))


def _input_divisor(b: _Builder, u: torch.Tensor) -> bool:
    """u may be the divisor of a rounding division (floor / trunc, remainder, fmod): an integer
    or an input. A computed float divisor one rounding apart moves a quotient near an integer
    across it (dynamic seed 918710: `floor(x / mean(x) ** 2)`, 1.0 apart on one element)."""
    return not u.is_floating_point() or any(u is v for n, v in b.env.items() if n[0] == "x")


def _unary(b: _Builder) -> bool:
    x = b.pick()
    out = b.fresh()
    if b.r.random() < 0.3:
        op, extra = b.r.choice(PARAM_UNARY)
        return b.try_line(f"{out} = {op}({x}{extra})", out, True)
    op = b.r.choice(MORE_UNARY)
    if op in ("torch.reciprocal",) + JUMP_AT_ZERO and not _divisor_ok(b, b.env[x]):
        return False
    return b.try_line(f"{out} = {op}({x})", out, True)


def _binary(b: _Builder) -> bool:
    x = b.pick()
    t = b.env[x]
    out = b.fresh()
    op = b.r.choice(MORE_BINARY)
    if op == "torch.floor_divide" and b.grad:
        return False          # no derivative: AOTAutograd raises at compile time (seed 870299)
    if op in TRUTH and not _divisor_ok(b, t):
        # a computed float near 0 may be rounding noise on one side and 0 on the other (seed
        # 275007: a bfloat16 layer norm of one-element rows, eager's 1e-6, pyfuser's exact 0,
        # through logical_or); such a value neither divides nor decides a truth value
        return False
    if b.r.random() < 0.3 and op not in ("torch.atan2",):
        c = _scalar(b.r, t)
        if op in DIVIDING and c in ("0", "0.0"):
            c = "2"
        if op.startswith("torch.bitwise") or op.startswith("torch.logical"):
            c = b.r.choice(["True", "3"]) if not t.is_floating_point() else "True"
        return b.try_line(f"{out} = {op}({x}, {c})", out, True)
    pred = (lambda u: _broadcastable(u.shape, t.shape)) if op not in DIVIDING + ("torch.atan2",) \
        else (lambda u: _broadcastable(u.shape, t.shape) and _no_int_zero(u) and
              (_input_divisor(b, u) if op in DIVIDING else _divisor_ok(b, u)))
    if op in TRUTH:
        pred = (lambda u: _broadcastable(u.shape, t.shape) and _divisor_ok(b, u))
    if op == "torch.atan2" and b.grad:
        if not t.is_floating_point():    # its backward negates a bool operand: AOTAutograd
            return False                 # raises at compile time, eager's backward too (870906)
        pred = (lambda u: _broadcastable(u.shape, t.shape) and u.is_floating_point()
                and _divisor_ok(b, u))
    y = b.pick(pred)
    if y is None:
        return False
    return b.try_line(f"{out} = {op}({x}, {y})", out, True)


def _ternary(b: _Builder) -> bool:
    """lerp, addcmul, masked_fill, a division with a rounding mode."""
    x = b.pick()
    t = b.env[x]
    out = b.fresh()
    kind = b.r.choice(["lerp", "addcmul", "masked_fill", "div"])
    same = b.pick(lambda u: _broadcastable(u.shape, t.shape) and u.dtype == t.dtype)
    if kind == "lerp":
        w = b.r.choice(["0.25", "-0.5", "1.5"])
        if b.r.random() < 0.3:
            w = b.pick(lambda u: _broadcastable(u.shape, t.shape) and u.dtype == t.dtype) or w
        line = f"{out} = torch.lerp({x}, {same or x}, {w})"
    elif kind == "addcmul":
        z = b.pick(lambda u: _broadcastable(u.shape, t.shape))
        line = f"{out} = torch.addcmul({x}, {same or x}, {z or x}, value={b.r.choice([1, 0.5, -2])})"
    elif kind == "masked_fill":
        m = b.pick(lambda u: u.dtype == BOOL and _broadcastable(u.shape, t.shape))
        v = b.r.choice(["0.0", "-1e4", "float('-inf')", "3", "True"])
        line = f"{out} = {x}.masked_fill({m or f'{x} > 0'}, {v})"
    else:
        y = b.pick(lambda u: _broadcastable(u.shape, t.shape) and _no_int_zero(u)
                   and _input_divisor(b, u))
        if y is None:
            return False
        mode = b.r.choice(["'floor'", "'trunc'"])
        line = f"{out} = torch.div({x}, {y}, rounding_mode={mode})"
    return b.try_line(line, out, True)


def _reduction(b: _Builder) -> bool:
    x = b.pick(lambda u: u.dim() >= 1)
    if x is None:
        return False
    t = b.env[x]
    out = b.fresh()
    d = b.r.randrange(-t.dim(), t.dim())
    keep = b.r.random() < 0.5
    kind = b.r.choice(["amin", "logsumexp", "std", "var_mean", "std_mean", "max", "min",
                       "cumsum", "prod", "argmax"])
    if kind == "amin":
        dims = tuple(sorted(b.r.sample(range(t.dim()), b.r.randint(1, t.dim()))))
        line = f"{out} = torch.amin({x}, {dims}, keepdim={keep})"
    elif kind == "logsumexp":
        line = f"{out} = torch.logsumexp({x}, {d}, keepdim={keep})"
    elif kind == "std":
        line = f"{out} = torch.std({x}, {d}, correction={b.r.choice([0, 1])}, keepdim={keep})"
    elif kind in ("var_mean", "std_mean"):
        k = b.r.choice([0, 1])
        if k == 1 and t.is_floating_point() and not bool(t.isfinite().all()):
            # the mean of a Welford pass over a row holding an infinity depends on the order
            # (eager's: -inf for [0, -inf], NaN for [-inf, 0]; pyfuser's chunks differ): seed
            # 870670, an output neither right nor wrong
            return False
        line = f"{out} = torch.{kind}({x}, {d}, keepdim={keep})[{k}]"
    elif kind in ("max", "min"):
        line = f"{out} = torch.{kind}({x}, {d}, keepdim={keep})[0]"
    elif kind == "cumsum":
        line = f"{out} = torch.cumsum({x}, {d})"
    elif kind == "prod":
        line = f"{out} = torch.prod({x}, {d}, keepdim={keep})"
    else:
        line = f"{out} = torch.argmax({x}, {d}, keepdim={keep})"
    return b.try_line(line, out, True)


def _norm(b: _Builder) -> bool:
    x = b.pick(lambda u: u.dim() >= 1 and u.dtype.is_floating_point)
    if x is None:
        return False
    t = b.env[x]
    out = b.fresh()
    kind = b.r.choice(["rms_norm", "rms_norm", "group_norm", "batch_norm"])
    if kind == "rms_norm":
        k = b.r.randint(1, min(2, t.dim()))
        norm = tuple(t.shape[-k:])
        line = f"{out} = F.rms_norm({x}, {norm!r}, eps={b.r.choice([1e-6, 1e-3, None])})"
        w = b.pick(lambda u: tuple(u.shape) == norm and u.dtype == t.dtype)
        if w is not None and b.r.random() < 0.5:
            line = line.replace(", eps=", f", {w}, eps=")
    elif kind == "group_norm":
        if t.dim() < 2 or t.shape[1] == 0:
            return False
        c = t.shape[1]
        groups = [g for g in range(1, c + 1) if c % g == 0]
        line = f"{out} = F.group_norm({x}, {b.r.choice(groups)}, eps=1e-3)"
    else:
        if t.dim() < 2:
            return False
        line = f"{out} = F.batch_norm({x}, None, None, training=True, eps=1e-3)"
    return b.try_line(line, out, True)


def _flip_or_index_add(b: _Builder) -> bool:
    """`torch.flip` of a value over one or two axes (negative dims too), sometimes under a
    softmax or a sum over the last axis; or `index_add` along axis 0 of a floating value's rows
    into zeros of as many rows or up to 3 more, at a literal index (repeats allowed): the
    lowerings of the thirty-first session in random company."""
    x = b.pick(lambda u: u.dim() >= 1 and min(u.shape) >= 1)
    if x is None:
        return False
    t = b.env[x]
    out = b.fresh()
    if b.r.random() < 0.6 or not t.dtype.is_floating_point:
        dims = b.r.sample(range(t.dim()), b.r.randint(1, min(2, t.dim())))
        dims = [d - t.dim() if b.r.random() < 0.3 else d for d in dims]
        call = f"torch.flip({x}, {dims})"
        if t.dtype.is_floating_point and b.r.random() < 0.4:
            call = b.r.choice(["torch.softmax({}, -1)", "{}.sum(-1)"]).format(call)
    else:
        rows = t.shape[0] + b.r.randint(0, 3)
        idx = [b.r.randrange(rows) for _ in range(t.shape[0])]
        call = (f"torch.zeros(({rows},) + tuple({x}.shape[1:]), dtype={x}.dtype)"
                f".index_add(0, torch.tensor({idx}), {x})")
    return b.try_line(f"{out} = {call}", out, True)


GENERATORS = [_unary, _unary, _binary, _binary, _ternary, _reduction, _norm]


def extra_ops(b: _Builder, seed: int) -> list:
    """1-4 lines of the ops above over the program's values (the names of what they made),
    drawn from a random stream of their own."""
    main, b.r = b.r, random.Random(seed * 104729 + 31)
    made = []
    try:
        want = b.r.randint(1, 4)
        for _ in range(40):
            if len(made) >= want:
                break
            if b.r.choice(GENERATORS)(b):
                made.append(f"v{b.count}")
        # one seed in three: a flip or index_add too, from a stream of its own (the lines
        # above stay each seed's)
        b.r = random.Random(seed * 7727 + 5)
        if b.r.random() < 0.35 and _flip_or_index_add(b):
            made.append(f"v{b.count}")
        return made
    finally:
        b.r = main
