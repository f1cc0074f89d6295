"""Lowerings of 2-D max pooling with its indices and their gradient:
`aten::max_pool2d_with_indices(x, kernel_size, stride, padding, dilation, ceil_mode)` (what
torch.compile's graphs call for `F.max_pool2d` / `nn.MaxPool2d`: ResNet's stem) and
`aten::max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
ceil_mode, indices)`.

Forward: each output element walks its window's in-bounds positions in eager's order (rows,
then columns) as a chain of elementwise ops over gathers of x viewed [..., H * W] at computed
flat positions (h * W + w): the value and position are taken where the element is greater than
the best so far or is NaN (eager's rule: the first of equal maxima, the last NaN); a window of
-inf only keeps its first in-bounds position. Out-of-bounds positions (the padding) are never
read. One pointwise kernel: k_h * k_w gathers of x for each output element.

Backward: the gradient of input position p = h * W + w is the sum of grad over the output
windows that contain p and whose index is p, in eager's order (window rows, then columns),
accumulated in float32 for half / bfloat16 (eager's accumulate type) and cast back: a gather
per candidate window (at most ceil(((k - 1) * d + 1) / s) per axis: 2 x 2 for ResNet's 3 / 2
pool), no scatter, no atomics; deterministic.

Both results are computed over a plane flattened to [..., H * W] and viewed back, so they are
written row-major: the torch.compile backend leaves a pool whose result is channels-last
(PYFUSER_CHANNELS_LAST's pass, a channels-last input) to eager (fx/support.py), rather than
copy its result into those strides.

Left to eager (UnsupportedOpError, the reason logged): inputs other than floating tensors of
rank 3 or 4, parameters that are not constant ints, a padding over half the kernel, a dilation
or stride below 1 (eager raises on those).
"""
from __future__ import annotations

from ...errors import UnsupportedOpError
from ...ir import builder as B
from ...ir.dtypes import DataType
from ...ir.tensor import TensorView
from .aten_shape import sizes_of
from .registry import lowers

ew = B.elementwise


def _pair(v, what: str, default=None) -> tuple[int, int]:
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0 and default is not None):
        return default
    if isinstance(v, int) and not isinstance(v, bool):
        return v, v
    if isinstance(v, (list, tuple)) and len(v) in (1, 2) and \
            all(isinstance(e, int) and not isinstance(e, bool) for e in v):
        return (v[0], v[0]) if len(v) == 1 else (v[0], v[1])
    raise UnsupportedOpError(f"max_pool2d: {what} must be one or two constant ints, got {v!r}")


def _num(op: str, a, b):
    """a op b: a Python int where both are ints, else a scalar expression of the Fusion."""
    if isinstance(a, int) and isinstance(b, int):
        return {"add": a + b, "mul": a * b, "div_floor": a // b}[op]
    return ew(op, a, b)


def _out_size(n, k: int, s: int, p: int, d: int, ceil: bool):
    """Eager's pooling output size (ceil_mode: a last window may start in the padding on the
    high side only if it starts inside the input or the low padding); n may be symbolic (a
    size the region's kernels take at run time): then a scalar expression of the Fusion."""
    if not isinstance(n, int):
        span = ew("add", n, 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0))
        o = ew("add", ew("div_floor", span, s), 1)
        if ceil:
            late = ew("ge", ew("mul", ew("sub", o, 1), s), ew("add", n, p))
            o = ew("sub", o, ew("where", late, 1, 0))
        return o
    span = n + 2 * p - d * (k - 1) - 1
    o = (span + (s - 1 if ceil else 0)) // s + 1
    if ceil and (o - 1) * s >= n + p:
        o -= 1
    return o


class _Pool:
    """A max_pool2d's parameters checked against its input `x` (rank 3 or 4, constant sizes)."""

    def __init__(self, x, kernel_size, stride, padding, dilation, ceil_mode):
        if not isinstance(x, TensorView) or x.ndim not in (3, 4) or not x.dtype.is_floating:
            raise UnsupportedOpError("max_pool2d: the input must be a floating tensor of rank 3 "
                                     "or 4")
        sizes = sizes_of(x)
        self.k = _pair(kernel_size, "kernel_size")
        self.s = _pair(stride, "stride", default=self.k)
        self.p = _pair(padding, "padding")
        self.d = _pair(dilation, "dilation")
        if not isinstance(ceil_mode, bool):
            raise UnsupportedOpError("max_pool2d: ceil_mode must be a constant bool")
        if min(self.k + self.s + self.d) < 1 or min(self.p) < 0 or \
                any(2 * p > k for p, k in zip(self.p, self.k)):
            raise UnsupportedOpError(f"max_pool2d: kernel {self.k}, stride {self.s}, padding "
                                     f"{self.p}, dilation {self.d} (eager raises)")
        self.lead, (self.H, self.W) = sizes[:-2], sizes[-2:]
        self.OH = _out_size(self.H, self.k[0], self.s[0], self.p[0], self.d[0], ceil_mode)
        self.OW = _out_size(self.W, self.k[1], self.s[1], self.p[1], self.d[1], ceil_mode)
        if any(isinstance(n, int) and n < 1 for n in (*self.lead, self.OH, self.OW)):
            raise UnsupportedOpError("max_pool2d: an empty input or output")

    def plane(self, a, b):
        """The element count of an a x b plane (an int or a scalar expression)."""
        return _num("mul", a, b)

    def spread(self, t: TensorView) -> TensorView:
        """A 1-D Int tensor over a plane's positions broadcast over the leading axes."""
        flags = [True] * len(self.lead) + [False]
        return B.expand(B.broadcast(t, flags), [*self.lead, -1])

    def flat(self, x: TensorView) -> TensorView:
        """x [..., A, B] viewed [..., A * B]."""
        a, b = sizes_of(x)[-2:]
        return B.reshape(x, [*self.lead, self.plane(a, b)])


def _coords(n_out, n_minor):
    """(row, col) Int tensors of a plane of n_out positions, n_minor per row, counted
    row-major."""
    o = B.iota(B.constant(n_out, DataType.Int) if isinstance(n_out, int) else n_out)
    return ew("div_floor", o, n_minor), ew("remainder", o, n_minor)


def _in_range(v, n: int):
    return ew("logical_and", ew("ge", v, 0), ew("lt", v, n))


@lowers("aten::max_pool2d_with_indices", n_args=(2, 3, 4, 5, 6), const_args=(1, 2, 3, 4, 5))
def _max_pool2d_with_indices(x, kernel_size, stride=(), padding=0, dilation=1,
                             ceil_mode=False):
    pool = _Pool(x, kernel_size, stride, padding, dilation, ceil_mode)
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = pool.k, pool.s, pool.p, pool.d
    oh, ow = _coords(pool.plane(pool.OH, pool.OW), pool.OW)
    plane = pool.flat(x)
    best = idx = seen = None
    cols = []                                   # (w, w in range) of each window column
    for j in range(kw):
        w = ew("add", ew("mul", ow, sw), j * dw - pw)
        cols.append((w, _in_range(w, pool.W)))
    for i in range(kh):
        h = ew("add", ew("mul", oh, sh), i * dh - ph)
        h_ok, h_at = _in_range(h, pool.H), ew("mul", h, pool.W)
        for w, w_ok in cols:
            ok = ew("logical_and", h_ok, w_ok)
            atb = pool.spread(ew("where", ok, ew("add", h_at, w), 0))
            v = B.gather(plane, atb, len(pool.lead))
            okb = pool.spread(ok)
            if best is None:                       # the window's first position
                best = ew("where", okb, v, float("-inf"))
                idx, seen = atb, okb
                continue
            take = ew("logical_and", okb, ew("logical_or", ew("gt", v, best), ew("isnan", v)))
            first = ew("logical_and", okb, ew("logical_not", seen))
            idx = ew("where", ew("logical_or", take, first), atb, idx)
            best = ew("where", take, v, best)
            seen = ew("logical_or", seen, okb)
    shape = [*pool.lead, pool.OH, pool.OW]
    return B.cast(B.reshape(best, shape), x.dtype), B.reshape(idx, shape)


@lowers("aten::max_pool2d_with_indices_backward", n_args=(8,), const_args=(2, 3, 4, 5, 6))
def _max_pool2d_with_indices_backward(grad, x, kernel_size, stride, padding, dilation,
                                      ceil_mode, indices):
    pool = _Pool(x, kernel_size, stride, padding, dilation, ceil_mode)
    if not isinstance(grad, TensorView) or grad.dtype != x.dtype or \
            not _same(sizes_of(grad), [*pool.lead, pool.OH, pool.OW]):
        raise UnsupportedOpError("max_pool2d_with_indices_backward: the gradient must have the "
                                 "output's sizes and the input's dtype")
    if not isinstance(indices, TensorView) or indices.dtype != DataType.Int or \
            not _same(sizes_of(indices), sizes_of(grad)):
        raise UnsupportedOpError("max_pool2d_with_indices_backward: the indices must be int64 "
                                 "of the output's sizes")
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = pool.k, pool.s, pool.p, pool.d
    h, w = _coords(pool.plane(pool.H, pool.W), pool.W)
    here = pool.spread(ew("add", ew("mul", h, pool.W), w))
    g, ix = pool.flat(grad), pool.flat(indices)
    acc_dtype = x.dtype.compute
    total = None
    # eager's candidate windows: rows from start to end (exclusive), the same for columns
    rows = _candidates(h, kh, sh, ph, dh, pool.OH)
    cols = _candidates(w, kw, sw, pw, dw, pool.OW)
    for r, r_ok in rows:
        for c, c_ok in cols:
            ok = ew("logical_and", r_ok, c_ok)
            at = pool.spread(ew("where", ok, ew("add", ew("mul", r, pool.OW), c), 0))
            hit = ew("logical_and", pool.spread(ok), ew("eq", B.gather(ix, at, len(pool.lead)),
                                                        here))
            term = ew("where", hit, B.cast(B.gather(g, at, len(pool.lead)), acc_dtype), 0.0)
            total = term if total is None else ew("add", total, term)
    return B.cast(B.reshape(total, [*pool.lead, pool.H, pool.W]), x.dtype)


def _same(a: list, b: list) -> bool:
    """Whether two size lists agree where both sizes are constants (symbolic ones are bound
    and checked against the tensors at run time)."""
    return len(a) == len(b) and all(x == y for x, y in zip(a, b)
                                    if isinstance(x, int) and isinstance(y, int))


def _candidates(v, k: int, s: int, p: int, d: int, n_out: int) -> list:
    """[(window index, in range)] of the windows along one axis that may hold input position v
    (an Int tensor), in eager's order: from start = 0 where v + p < (k - 1) * d + 1, else
    (v + p - (k - 1) * d - 1) // s + 1, to end = min((v + p) // s + 1, n_out), exclusive."""
    reach = (k - 1) * d + 1
    start = ew("where", ew("lt", ew("add", v, p), reach), 0,
               ew("add", ew("div_floor", ew("add", v, p - reach), s), 1))
    end = ew("minimum", ew("add", ew("div_floor", ew("add", v, p), s), 1), n_out)
    out = []
    for t in range(-(-reach // s)):
        r = ew("add", start, t)
        out.append((r, ew("lt", r, end)))
    return out
