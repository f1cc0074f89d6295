"""Reduction and normalization fusions shared by the CPU-interpreter and GPU tests: builders
(Fusion IR through the builder, dtype as a parameter), input makers for every layout, and the
tolerance each comparison with eager needs.

Tolerances (stated in docs/reductions.md): a sum of n float32 values may differ from eager's by
its rounding error, about n * 2^-24 * sum|x| (different summation order); we allow
2^-20 * (1 + sqrt(n)) relative to the sum of magnitudes. Normalized outputs (softmax, norms) are
compared with rtol/atol 1e-5 (float32), 2e-3 (float16: one rounding of the result plus the float
statistics), 1.6e-2 (bfloat16), 1e-12 (float64). Integer and max/min results are exact.
"""
from __future__ import annotations

import torch

from pyfuser.ir import DataType, Fusion
from pyfuser.ir import builder as B

ew = B.elementwise
TORCH = {torch.float32: DataType.Float, torch.float16: DataType.Half,
         torch.bfloat16: DataType.BFloat16, torch.float64: DataType.Double,
         torch.int32: DataType.Int32, torch.int64: DataType.Int, torch.bool: DataType.Bool,
         torch.int8: DataType.Char}
NORM_TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2, torch.float64: 1e-12}


def fusion(build, *args):
    f = Fusion()
    with f:
        outs = build(*args)
        for o in (outs if isinstance(outs, (list, tuple)) else [outs]):
            f.add_output(o)
    return f


def tensor(rank, dt):
    return B.define_tensor([-1] * rank, TORCH[dt])


# ---- builders: (rank, dtype, axes) -> outputs -------------------------------------------------
def reduce_op(op, keepdim=False):
    def build(rank, dt, axes):
        return B.reduction(op, tensor(rank, dt), axes, keepdim)
    build.__name__ = f"{op}{'_keepdim' if keepdim else ''}"
    return build


def mean(rank, dt, axes):
    return B.mean(tensor(rank, dt), axes)


def var_mean(rank, dt, axes):
    v, m = B.var_mean(tensor(rank, dt), axes, correction=1)
    return v, m


def welford(rank, dt, axes):
    return list(B.welford(tensor(rank, dt), axes))


def sum_of_product(rank, dt, axes):
    """A pointwise producer: sum(x * y + 1) and, beside it, x * y (a full output of pass 0)."""
    x, y = tensor(rank, dt), tensor(rank, dt)
    xy = ew("mul", x, y)
    return B.reduction("sum", ew("add", xy, 1), axes), xy


def softmax(rank, dt, axes):
    x = tensor(rank, dt)
    xf = B.cast(x, DataType.Float) if TORCH[dt].is_reduced_float else x
    m = B.reduction("max", xf, axes, keepdim=True)
    e = ew("exp", ew("sub", xf, m))
    y = ew("div", e, B.reduction("sum", e, axes, keepdim=True))
    return B.cast(y, TORCH[dt])


def log_softmax(rank, dt, axes):
    x = tensor(rank, dt)
    m = B.reduction("max", x, axes, keepdim=True)
    s = ew("sub", x, m)
    return ew("sub", s, ew("log", B.reduction("sum", ew("exp", s), axes, keepdim=True)))


def _keep(t, rank, axes):
    return B.broadcast(t, [i in axes for i in range(rank)])


def layer_norm(rank, dt, axes):
    """Welford statistics in float, weight and bias over the reduced axes; (y, mean, rstd)."""
    x = tensor(rank, dt)
    shape_w = [-1] * len(axes)
    w, b = B.define_tensor(shape_w, TORCH[dt]), B.define_tensor(shape_w, TORCH[dt])
    xf = B.cast(x, DataType.Float) if TORCH[dt].is_reduced_float else x
    avg, m2, _ = B.welford(xf, axes)
    rstd = ew("rsqrt", ew("add", ew("div", m2, B.num_elements(xf, axes)), 1e-5))
    y = ew("mul", ew("sub", xf, _keep(avg, rank, axes)), _keep(rstd, rank, axes))
    wb = [B.broadcast(t, [i not in axes for i in range(rank)]) for t in (w, b)]
    y = ew("add", ew("mul", y, wb[0]), wb[1])
    return B.cast(y, TORCH[dt]), avg, rstd


def rms_norm(rank, dt, axes):
    """x * rsqrt(mean(x^2) + eps) * w, written out (the RMSNorm of the issue)."""
    x = tensor(rank, dt)
    w = B.define_tensor([-1] * len(axes), TORCH[dt])
    xf = B.cast(x, DataType.Float) if TORCH[dt].is_reduced_float else x
    ms = B.mean(ew("mul", xf, xf), axes, keepdim=True)
    y = ew("mul", xf, ew("rsqrt", ew("add", ms, 1e-6)))
    y = ew("mul", y, B.broadcast(w, [i not in axes for i in range(rank)]))
    return B.cast(y, TORCH[dt])


def logsumexp(rank, dt, axes):
    x = tensor(rank, dt)
    m = B.reduction("max", x, axes, keepdim=True)
    s = B.reduction("sum", ew("exp", ew("sub", x, m)), axes)
    return ew("add", ew("log", s), B.squeeze(m, axes))


def row_scaled_sum(rank, dt, axes):
    """sum(x * s) with s a per-row input (kept axes only) and a row-level output s * 2."""
    x = tensor(rank, dt)
    kept = [i for i in range(rank) if i not in axes]
    s = B.define_tensor([-1] * len(kept), TORCH[dt])
    sb = B.broadcast(s, [i in axes for i in range(rank)])
    return B.reduction("sum", ew("mul", x, sb), axes), ew("mul", s, 2)


FLOAT_BUILDERS = [reduce_op("sum"), reduce_op("max"), reduce_op("min"), reduce_op("sum", True),
                  mean, var_mean, welford, sum_of_product, softmax, log_softmax, layer_norm,
                  rms_norm, logsumexp, row_scaled_sum]
INT_BUILDERS = [reduce_op("sum"), reduce_op("max"), reduce_op("min"), reduce_op("prod")]


# ---- inputs -------------------------------------------------------------------------------------
def make(shape, dt, layout="contiguous", gen=None):
    """A tensor of logical `shape`: contiguous, "transposed" (storage order reversed), "sliced"
    (every other element of a larger tensor along the last axis) or "offset" (storage offset
    of one element, misaligned for vectors)."""
    def draw(s):
        if dt.is_floating_point:
            return torch.randn(s, generator=gen, dtype=torch.float64).to(dt)
        if dt == torch.bool:
            return torch.randint(0, 2, s, generator=gen).bool()
        return torch.randint(-5, 6, s, generator=gen).to(dt)
    shape = list(shape)
    if layout == "transposed":
        return draw(shape[::-1]).permute(*reversed(range(len(shape))))
    if layout == "sliced" and shape:
        big = draw(shape[:-1] + [2 * shape[-1]])
        return big[..., ::2]
    if layout == "offset":
        n = 1
        for s in shape:
            n *= s
        return draw([n + 1])[1:].view(shape)
    return draw(shape)


def special_rows(n_rows, n, dt, axis=1, gen=None):
    """Random rows with the edge cases of an online max / sum along `axis` (rows of n)."""
    x = torch.randn(n_rows, n, generator=gen, dtype=torch.float64)
    inf, nan = float("inf"), float("nan")
    cases = [lambda r: r[::3].fill_(-inf),                 # scattered -inf
             lambda r: r.fill_(-inf),                      # every element -inf
             lambda r: r[n // 2:n // 2 + 1].fill_(inf),    # one +inf
             lambda r: r[n - 1:].fill_(nan),               # NaN at the end
             lambda r: (r.fill_(-inf), r[n - 1:].fill_(2.0)),   # one finite value, last
             lambda r: r[:(n + 1) // 2].fill_(-inf),       # the first half's threads all -inf
             lambda r: r[n // 3:].fill_(-inf),             # the last two thirds -inf
             lambda r: r.copy_(torch.arange(n, dtype=torch.float64) * 0.37),   # rising
             lambda r: r.mul_(30).add_(1000.0),            # exp(x) overflows without a shift
             lambda r: (r.fill_(inf), r[:1].fill_(-inf))]  # +inf everywhere but one -inf
    for i, case in enumerate(cases[:n_rows]):
        case(x[i])
    x = x.to(dt)
    return x if axis == 1 else x.t().contiguous()


def inputs_for(f, shape, dt, axes, layout, gen=None):
    """Inputs of fusion f: the first tensor input has `shape` in `layout`, others follow their
    declared ranks (reduced-axes shape for weights, kept-axes shape for per-row inputs)."""
    from pyfuser.ir import exprs as E
    out = []
    for i, v in enumerate(f.tensor_inputs()):
        if i == 0 or v.ndim == len(shape):
            out.append(make(shape, v.dtype.torch, layout if i == 0 else "contiguous", gen))
            continue
        flags = next(u.flags for u in v.uses if isinstance(u, E.BroadcastOp))
        sub = [s for s, new in zip(shape, flags) if not new]     # the axes it is broadcast over
        out.append(make(sub, v.dtype.torch, "contiguous", gen))
    return out


def check_close(got, want, builder_name, n_reduced, what=""):
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if not want.dtype.is_floating_point or builder_name in ("max", "min"):
        assert torch.equal(got, want) or (want.dtype.is_floating_point and torch.equal(
            got.isnan(), want.isnan()) and torch.equal(got[~got.isnan()], want[~want.isnan()])), \
            f"{what}: values differ\n{got}\n{want}"
        return
    r = NORM_TOL[want.dtype]
    atol = r
    if builder_name.startswith("sum") or builder_name in ("mean", "var_mean", "welford",
                                                          "row_scaled_sum", "logsumexp"):
        scale = max(1.0, float(want.double().abs().max())) if want.numel() else 1.0
        atol = max(r, 2.0 ** -20 * (1 + n_reduced ** 0.5) * scale * (1 if r <= 1e-5 else 64))
    torch.testing.assert_close(got.double(), want.double(), rtol=r, atol=atol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")
