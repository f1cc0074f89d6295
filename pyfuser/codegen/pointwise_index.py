"""The kernel-IR index of each entry of pointwise_graph's index keys (a mixin of the pointwise
Lowering and of the reduction one, which provide the Lets of the axes' indices (named by
`axis_var`: r<k> in pointwise kernels), the index nodes' Lets, constants, extents and scalar
parameters): a reference axis' index, an index node's value, a slice's or pad's shifted index
("sh", clamped into its operand where it may fall outside), a stepped slice's ("st") and stepped
pad's ("dv") indices, a view's re-linearised index ("vd"); the condition under which a load
through clamped entries reads inside its operand; and the value of a pad or cat node
(`resize_expr`).

Invariants: an index never divides by 0 (a view's extents as divisors are max(extent, 1)); a
clamped entry's load is guarded by `in_bounds`, so the clamp only keeps the address valid.
"""
from __future__ import annotations

from ..ir.dtypes import DataType
from ..schedule.pointwise_graph import Minus, Plus, is_padded
from . import kernel_ir as K


class KeyIndexing:
    """Index expressions of key entries (module docstring); mixed into codegen/lowering.Lowering."""

    def key_index(self, c):
        if c == 0:
            return self.const(0)
        if c[0] == "r":
            return K.Var(self.axis_var(c[1]))
        if c[0] == "ix":
            return self.ix_vars[id(c[1])]
        if c[0] == "st":                # a stepped slice's operand: index * step
            return K.mul(self.key_index(c[1]), self.const(c[2]))
        if c[0] == "dv":                # a stepped pad's operand: max(index, 0) / step
            v = self.key_index(c[1])
            v = K.Op("where", (K.Bin("<", v, self.const(0)), self.const(0), v), DataType.Int)
            return K.Bin("/", v, self.const(c[2]))
        if c[0] == "sh":
            v = self._shifted(c)
            if c[4] is not None:        # into [0, size - 1]: the load there is skipped anyway
                last = K.Bin("-", self.extent_expr(c[4]), self.const(1))
                v = K.Op("where", (K.Bin("<", last, v), last, v), DataType.Int)
                v = K.Op("where", (K.Bin("<", v, self.const(0)), self.const(0), v), DataType.Int)
            return v
        _, view, key, j = c
        out_exts = [self.extent_expr(d) for d in view.outputs[0].logical]
        in_exts = [self.extent_expr(d) for d in view.inputs[0].logical]
        lin = self.const(0)
        for i, ci in enumerate(key):
            w = self.const(1)
            for x in out_exts[i + 1:]:
                w = K.mul(w, x)
            lin = K.add(lin, K.mul(self.key_index(ci), w))
        div = self.const(1)
        for x in in_exts[j + 1:]:
            div = K.mul(div, _at_least_one(x))
        res = lin if div == self.const(1) else K.Bin("/", lin, div)
        return res if j == 0 else K.Bin("%", res, _at_least_one(in_exts[j]))

    def axis_var(self, k: int) -> str:
        """The name of the Let holding reference axis k's index (the lowering defines it)."""
        return f"r{k}"

    def _shifted(self, c):
        """The unclamped index of an "sh" key entry."""
        _, inner, off, minus, _ = c
        return self.minus_terms(K.add(self.key_index(inner), self.const(off)), minus)

    def minus_terms(self, v, minus):
        """v less the sizes of the axes in an "sh" entry's `minus`, plus its Plus terms (a
        slice's symbolic start, a kernel parameter), less its Minus terms (a pad's symbolic
        leading size, a kernel parameter)."""
        for d in minus:
            if isinstance(d, Plus):
                v = K.add(v, self.scalar_expr(d.scalar))
            elif isinstance(d, Minus):
                v = K.Bin("-", v, self.scalar_expr(d.scalar))
            else:
                v = K.Bin("-", v, self.extent_expr(d))
        return v

    def in_bounds(self, key):
        """The condition that every clamped "sh" entry in `key` (nested ones included) is inside
        its operand unclamped, or None when there is none: a load of a pad or cat operand runs
        only there (where it does not, the pad / cat node discards its value)."""
        conds = []

        def walk(c):
            if not isinstance(c, tuple):
                return
            if c[0] in ("st", "dv"):
                walk(c[1])
            elif c[0] == "sh":
                walk(c[1])
                if c[4] is not None:
                    v = self._shifted(c)
                    conds.append(K.Bin("&&", K.Bin("<=", self.const(0), v),
                                       K.Bin("<", v, self.extent_expr(c[4]))))
            elif c[0] == "vd":
                for x in c[2]:
                    walk(x)
            elif c[0] == "ix":             # the index's own load ran only there
                for x in c[1].key:
                    walk(x)
        for c in key:
            walk(c)
        out = None
        for c in conds:
            out = c if out is None else K.Bin("&&", out, c)
        return out

    def resize_expr(self, node, arg_expr):
        """A "pad" node: its operand where the index is inside the operand on every padded
        axis, else the pad value; a "cat" node: the operand whose range holds the index along
        the cat axis (a `where` chain). The indices are key_index's (the position's first
        lane: vectors never straddle a bound, schedule/pointwise_resize.index_vec_ok)."""
        if node.kind == "pad":
            e = node.expr
            inside = None
            for j, ((lo, hi), d, st) in enumerate(zip(e.pads, e.inputs[0].logical, e.steps)):
                if not is_padded((lo, hi), st):
                    continue
                i = self.key_index(node.key[j])
                lo = self.const(lo) if isinstance(lo, int) else self.scalar_expr(lo)
                n = self.extent_expr(d)
                cond = K.Bin("&&", K.Bin("<=", lo, i),
                             K.Bin("<", i, K.add(n if st == 1 else K.mul(n, self.const(st)), lo)))
                if st != 1:                     # every step-th index from lo: the operand's
                    on = K.Bin("==", K.Bin("%", K.Bin("-", i, lo), self.const(st)), self.const(0))
                    cond = K.Bin("&&", cond, on)
                inside = cond if inside is None else K.Bin("&&", inside, cond)
            value = node.args[1]
            fill = self.scalar(value)
            if value.dtype is not node.tv.dtype:
                fill = K.Convert("cast", fill, value.dtype, node.tv.dtype)
            x = arg_expr(node.args[0])
            return x if inside is None else K.Op("where", (inside, x, fill), node.tv.dtype)
        assert node.kind == "cat", node.kind
        e = node.expr
        i = self.key_index(node.key[e.dim])
        bounds, end = [], self.const(0)
        for a in node.args:                      # the non-empty operands, in order
            end = K.add(end, self.extent_expr(a.tv.logical[e.dim]))
            bounds.append(end)
        vals = [arg_expr(a) for a in node.args]
        expr = vals[-1]
        for b, v in zip(reversed(bounds[:-1]), reversed(vals[:-1])):
            expr = K.Op("where", (K.Bin("<", i, b), v, expr), node.tv.dtype)
        return expr


def _at_least_one(x):
    """An extent as a divisor of a view's re-linearised index: a symbolic one may be 0 at run
    time (the view of an empty tensor, whose index a pad's bounds check of another operand still
    computes: the interpreter raised ZeroDivisionError, dynamic fuzz seed 913463, where a GPU
    divides into garbage); max(x, 1) then, which changes no index of a tensor with elements."""
    if isinstance(x, K.Const) and isinstance(x.value, int) and x.value >= 1:
        return x
    one = K.Const(1, "nidx_t")
    return K.Op("where", (K.Bin("<", x, one), one, x), DataType.Int)
