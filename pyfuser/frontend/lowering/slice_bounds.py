"""Python's slice bounds where the axis' size or a bound is symbolic (a SymInt under dynamic
shapes): `x[start:end]` along an axis of n elements, as eager computes it, for
lowering/aten_resize.py's `aten::slice`.

Eager's rule (aten::slice, step 1): a negative bound counts from the end (+ n), then start is
clamped into [0, n] and end into [start, n]; None (or eager's INT64_MAX) is the end. Here a
bound or n may be an Int Scalar of the Fusion, and the clamped bounds are then scalar
expressions the host computes when the sizes are bound (`where`, `maximum`, `minimum` on
scalars, with eager's semantics: ir/shapes.py), never a guess from the traced sizes:

- `clamped(n, start, end)` -> (start', end'): start' an int >= 0 or an Int Scalar, end' an
  int, an Int Scalar or None ("to the end"), with start' <= end' <= n except where start' is a
  constant past a symbolic n (then start' == end' when end' is not None: an empty slice,
  which reads nothing; with end' None the run-time check below applies).
  A constant start >= 0 stays that constant (the kernel reads at a constant shift and keeps its
  vectors); a constant end >= 0 on a symbolic axis stays a constant, checked against the size
  at run time (a call where it does not fit runs the region eagerly, which gives eager's
  clamped result): Dynamo guards on it fitting (`5 <= s1` for `x[:, :5]`), so a kernel of
  constant extent serves every call of the graph.

A stepped slice (`x[s:e:step]`, a constant step) takes the same clamped bounds;
`stepped_span(e - s, step)` is the extent from its first element to just past its last, which
its gradient's pad needs (the high side: n - s - span).

A frontend that knows a constant bound lies outside the axis (Dynamo's graph is guarded on it)
passes `clamped_bound(n, bound)` instead, a scalar: clamped for every size, no run-time check.

Invariant: for every run-time n and bound values, [start', end') is the range eager's slice
takes, or the slice's run-time check fails and the call runs eagerly (a constant end past n, a
constant start past n with an open end) (tests/cpu/test_compile_dynamic_slices.py checks
negative, None and out-of-range bounds against eager on several sizes).
"""
from __future__ import annotations

from ...ir import builder as B
from ...ir.base import Scalar

OPEN = 2 ** 62          # an end at least this large means "to the end" (eager's INT64_MAX)

ew = B.elementwise


def _sym(v) -> bool:
    return isinstance(v, Scalar)


def _from_end(b, n):
    """A bound counted from the end where it is negative: b + n for b < 0."""
    if not _sym(b):
        return b if b >= 0 else (b + n if not _sym(n) else ew("add", n, b))
    return ew("where", ew("lt", b, 0), ew("add", b, n), b)


def _max(a, b):
    if not _sym(a) and not _sym(b):
        return max(a, b)
    return ew("maximum", a, b)


def _min(a, b):
    if not _sym(a) and not _sym(b):
        return min(a, b)
    return ew("minimum", a, b)


def constant_length(start, end):
    """The extent of `x[start:end]` that does not depend on the axis' size n as long as
    n >= -start: a negative constant start with an open or a negative constant end (`x[:, -1:]`,
    `x[..., -3:-1]`); None otherwise. The frontend gives the slice that constant extent (checked
    when the sizes are bound: a call with n < -start runs eagerly), so `x[:, -1:]` is a
    broadcast axis of one element, as `x[:, 2:3]` is, which a binary op with an [N, n] operand
    broadcasts (as a symbol bound to 1, the region ran eagerly on every call)."""
    if isinstance(start, bool) or not isinstance(start, int) or start >= 0:
        return None
    if end is None or (isinstance(end, int) and not isinstance(end, bool) and end >= OPEN):
        return -start
    if isinstance(end, int) and not isinstance(end, bool) and start < end < 0:
        return end - start
    return None


def clamped_bound(n, b):
    """A constant bound b clamped into [0, n] as a scalar of the axis' size n (an Int Scalar):
    min(n, b) for b >= 0, max(n + b, 0) for b < 0. For a bound a frontend knows to lie outside
    the axis at its traced sizes (fx/lower.py `_bounds_past_size`): a scalar, so that the
    clamping is computed for every size instead of checked (a constant end past the size, a
    negative start before it, ran the region eagerly)."""
    return _min(n, b) if b >= 0 else _max(ew("add", n, b), 0)


def stepped_span(length, step: int):
    """The extent from a stepped slice's first element to just past its last, for a slice of
    `length` = end - start >= 0 (an int or an Int Scalar) and a constant step >= 1:
    length - (length - 1) mod step, 0 for an empty slice (eager's `x[s:e:step]` takes
    ceil(length / step) elements, the last at start + that span - 1). A stepped slice's
    gradient is zeros but at those elements: its high side is the size less start less this."""
    if step == 1:
        return length
    if not _sym(length):
        return max(length - (length - 1) % step, 0)
    return _max(ew("sub", length, ew("remainder", ew("sub", length, 1), step)), 0)


def clamped(n, start, end):
    """(start', end') of `x[start:end]` on an axis of n elements (see the module docstring); n
    an int or an Int Scalar, start / end None, ints or Int Scalars."""
    if end is not None and not _sym(end) and end >= OPEN:
        end = None
    if start is None:
        start = 0
    if _sym(start) or start < 0:                     # clamped into [0, n]: a scalar of n
        start = _min(_max(_from_end(start, n), 0), n)
    elif not _sym(n):
        start = min(start, n)
    if end is None:
        return start, (n if _sym(start) else None)
    if not _sym(end) and end >= 0 and not _sym(start) and _sym(n):
        return start, max(end, start)               # checked against n at run time
    return start, _max(_min(_from_end(end, n), n), start)
