"""What every kernel lowering shares: kernel parameters and the values of Fusion ops.

An `Emitter` is made from a schedule (pointwise, reduction...) that has `params.index_type`,
`graph.nodes`, `accesses` (each with `node`, `tv`, `seg`, `is_store`) and `orig_of` (id of a
Scalar the kernel sees -> the user's Scalar, whose Binding gives the parameter's value). It
collects the kernel's parameters in order (pointers, sizes, strides, scalars), the prologue Lets of
scalar expressions, and turns one Fusion op of a graph node into a kernel IR expression
(`node_expr`): the op of the op table in its computation dtype, operands converted as the builder
promoted them, half/bf16 results rounded where eager rounds them (`convert_arg` and `op_expr`
do that for one elementwise expr, for lowerings without graph nodes too: the embedding
backward's epilogue).

Invariant: nothing here reassociates or fuses arithmetic: one Fusion op, one kernel IR Op.
"""
from __future__ import annotations

from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.dtypes import DataType, Operand, Promotion, result_type
from ..ir.tensor import TensorView
from . import kernel_ir as K
from .kernel import Param

SCALAR_PARAM_CTYPE = {DataType.Bool: "bool", DataType.Int: "int64_t", DataType.Int32: "int",
                      DataType.Float: "float", DataType.Double: "double"}


def op_compute_dtype(e) -> DataType:
    """The dtype an elementwise expr computes in, by the builder's promotion rule."""
    info = e.info
    skip = set(getattr(info, "scalar_args", ())) | ({0} if info.name == "where" else set())
    promoted = [v for i, v in enumerate(e.inputs) if i not in skip]
    kind = Promotion.DEFAULT if info.promotion in (Promotion.ALWAYS_BOOL, Promotion.NONE) \
        else info.promotion

    def operand(v):
        if isinstance(v, TensorView):
            return Operand(v.dtype, Operand.TENSOR if v.ndim else Operand.ZERO_DIM)
        return Operand(v.dtype, Operand.SCALAR)
    return result_type(*(operand(v) for v in promoted), promotion=kind)


def convert_arg(expr, src: DataType, compute: DataType, e, i):
    """Operand i of elementwise expr e (kernel IR `expr` of dtype src) in e's computation dtype
    (where's condition as it is)."""
    if e.info.name == "where" and i == 0:
        return expr
    dst = compute.compute
    return expr if src.compute is dst else K.Convert("cast", expr, src, dst)


def op_expr(e, args, compute: DataType, out: DataType, rounded: bool = True):
    """Elementwise expr e of converted operands `args`: the op table's op in `compute`, a half /
    bfloat16 result rounded (unless `rounded` is False: a value only stored, whose store
    rounds it)."""
    if e.info.name == "div_trunc" and compute.is_reduced_float:
        # eager (CUDA) computes trunc(a / b) on scalar_t = half/bfloat16: the quotient is
        # rounded to the reduced type before the trunc (2.999 -> bf16 3.0 -> 3, not 2)
        q = K.Convert("round", K.Op("div", tuple(args), compute), DataType.Float, compute)
        return K.Convert("round", K.Op("trunc", (q,), compute), DataType.Float, out) \
            if out.is_reduced_float else K.Op("trunc", (q,), compute)
    expr = K.Op(e.info.name, tuple(args), compute)
    if out.is_reduced_float and rounded:
        expr = K.Convert("round", expr, DataType.Float, out)
    return expr


class Emitter:
    def __init__(self, sched):
        self.s = sched
        self.p = sched.params
        self.it = self.p.index_type
        self.ptr_params, self.size_params, self.stride_params, self.scalar_params = [], [], [], []
        self.tensors: dict = {}
        self.prologue: list = []
        self._scalars: dict = {}
        self._param_names: set = set()
        self.store_only = self._store_only_nodes()

    def _store_only_nodes(self) -> set:
        """ids of graph nodes whose value is only stored, directly or through set/alias nodes,
        to outputs of its own dtype. A half/bf16 op result among them is not rounded in its Let:
        the store's conversion to the storage type is that same rounding (round to nearest
        even), done once instead of twice."""
        users: dict = {}
        for n in self.s.graph.nodes:
            for a in n.args:
                if not isinstance(a, Scalar):
                    users.setdefault(id(a), []).append(n)
        stored = {id(a.node) for a in self.s.accesses if a.is_store}
        out: set = set()
        for n in reversed(self.s.graph.nodes):           # users come after their producers
            us = users.get(id(n), [])
            if (us or id(n) in stored) and all(
                    u.kind in ("set", "alias") and id(u) in out and u.tv.dtype is n.tv.dtype
                    for u in us):
                out.add(id(n))
        return out

    # ---- params ---------------------------------------------------------------------------
    def _param(self, bucket, name, ctype, source):
        if name not in self._param_names:
            self._param_names.add(name)
            bucket.append(Param(name, ctype, source))
        return K.Var(name)

    def ptr(self, a) -> str:
        name = f"T{a.tv.number}"
        if name not in self.tensors:
            self.tensors[name] = K.TensorParam(name, a.tv.dtype, a.seg, a.is_store,
                                               id(a.tv) not in getattr(self.s, "inplace_tvs", ()))
            self._param(self.ptr_params, name, "void*", ("ptr", a.seg))
        return name

    def stride(self, a, j):
        """Stride of access `a` along its axis j: a kernel parameter; for a load through a view
        (j = ("rm", view, i)) the product of the view output's extents after axis i."""
        if isinstance(j, tuple):
            _, view, i = j
            st = self.const(1)
            for d in view.outputs[0].logical[i + 1:]:
                st = K.mul(st, self.extent_expr(d))
            return st
        return self._param(self.stride_params, f"T{a.tv.number}_s{j}", self.it, ("stride", a.seg, j))

    def random_number(self, n_ops: int, k: int, digits: int, index, lane=None):
        """The op table's Philox number (ir/philox.py) of random op `k` of the launch's `n_ops`
        at element `index`, from the launch's seed and offset (kernel parameters; the launch
        reserves 4 * n_ops of the offset) combined with the two device words at `pf_rng`
        (seed ^ pf_rng[0], offset + pf_rng[1]: runtime/rng.py). With `lane`: `index` is lane
        0's, a multiple of 4, and the number is the lane's (philox_uniform_q): lanes 4q..4q+3
        write one quad expression, whose Philox block the compiler computes once for the
        four."""
        seed = self._param(self.scalar_params, "pf_seed", "int64_t", ("philox", "seed"))
        offset = self._param(self.scalar_params, "pf_offset", "int64_t",
                             ("philox", "offset", 4 * n_ops))
        # the device words a CUDA graph's replays refresh (zeros outside one: runtime/rng.py)
        if "pf_rng" not in self.tensors:
            self.tensors["pf_rng"] = K.TensorParam("pf_rng", DataType.Int, -1, False)
            self._param(self.scalar_params, "pf_rng", "void*", ("philox", "state"))
        seed = K.Bin("^", seed, K.Elem("pf_rng", K.Const(0, "int")))
        offset = K.add(offset, K.Elem("pf_rng", K.Const(1, "int")))
        k, digits = K.Const(k, "int"), K.Const(digits, "int")
        if lane is None:
            return K.Op("philox_uniform", (seed, offset, k, index, digits), DataType.Int)
        four = K.Const(4, "int")
        quad = K.add(K.Bin("/", index, K.Const(4, "int64_t")), K.Bin("/", lane, four))
        return K.Op("philox_uniform_q", (seed, offset, k, quad, K.Bin("%", lane, four), digits),
                    DataType.Int)

    def const(self, v: int):
        return K.Const(int(v), "nidx_t")

    def scalar(self, s: Scalar):
        """Kernel expression (register type of s.dtype) of a fusion Scalar."""
        if s.is_const:
            return K.Const(s.value, K.REGISTER_CTYPE[s.dtype], s.dtype)
        hit = self._scalars.get(id(s))
        if hit is not None:
            return hit
        d = s.definition
        if d is None:
            ctype = SCALAR_PARAM_CTYPE.get(s.dtype, "int64_t" if s.dtype.is_integral else "float")
            pdt = {"int64_t": DataType.Int, "float": DataType.Float}.get(ctype, s.dtype)
            v = self._param(self.scalar_params, s.name, ctype, ("scalar", self.s.orig_of[id(s)]))
            expr = v if pdt is s.dtype else K.Convert("cast", v, pdt, s.dtype)
        elif isinstance(d, E.ScalarCast):
            expr = K.Convert("cast", self.scalar(d.inputs[0]), d.inputs[0].dtype, s.dtype)
        else:
            compute = op_compute_dtype(d)
            args = [convert_arg(self.scalar(v), v.dtype, compute, d, i)
                    for i, v in enumerate(d.inputs)]
            expr = op_expr(d, args, compute, s.dtype)
        if not isinstance(expr, (K.Var, K.Const)):
            name = f"s{s.number}"
            self.prologue.append(K.Let(name, K.REGISTER_CTYPE[s.dtype], expr, f"{s.name}"))
            expr = K.Var(name)
        self._scalars[id(s)] = expr
        return expr

    def checked_index(self, a, j, value):
        """`value`, the index gathered access `a` reads along its axis j, checked to lie in
        [0, size of axis j) (K.CheckedIndex: torch.embedding's and index_select's error, a
        device-side trap on the GPU, IndexError in the interpreter)."""
        return K.CheckedIndex(value, self.extent_expr(a.tv.logical[j]),
                              f"index out of range in {a.tv.name} (axis {j})")

    def decompose(self, lin, gis, out: list) -> dict:
        """Lets g<i> (appended to `out`) for groups `gis` (outer first) of the linear index
        `lin` over them (group extents `e<i>`); {gi: Var(g<i>)}."""
        rest, res = lin, {}
        for pos in range(len(gis) - 1, -1, -1):
            gi = gis[pos]
            if pos == 0:
                out.append(K.Let(f"g{gi}", "nidx_t", rest))
            else:
                out.append(K.Let(f"g{gi}", "nidx_t", K.Bin("%", rest, K.Var(f"e{gi}"))))
                rest = K.Bin("/", rest, K.Var(f"e{gi}"))
            res[gi] = K.Var(f"g{gi}")
        return res

    def extent_expr(self, d):
        return self.scalar_expr(d.full_extent)

    def scalar_expr(self, s):
        """An Int Scalar's value: a constant, else a kernel parameter bound at run time."""
        if s.is_const:
            return self.const(s.value)
        return self._param(self.size_params, f"x{s.number}", self.it, ("scalar", self.s.orig_of[id(s)]))

    # ---- ops ------------------------------------------------------------------------------
    def node_expr(self, node, arg_expr) -> object:
        """The kernel IR expression of an "op", "cast" or "full" node; `arg_expr(tensor node)`
        gives an argument's value (register type of its dtype)."""
        dt = node.tv.dtype
        if node.kind == "full":
            fill = node.args[0]
            return K.Convert("cast", self.scalar(fill), fill.dtype, dt) if fill.dtype is not dt \
                else self.scalar(fill)
        if node.kind == "cast":
            src = node.args[0]
            return K.Convert("cast", arg_expr(src), src.tv.dtype, dt)
        e = node.expr
        compute = op_compute_dtype(e)
        args = []
        for i, a in enumerate(node.args):
            if isinstance(a, Scalar):
                args.append(convert_arg(self.scalar(a), a.dtype, compute, e, i))
            else:
                args.append(convert_arg(arg_expr(a), a.tv.dtype, compute, e, i))
        return op_expr(e, args, compute, dt, id(node) not in self.store_only)

    def params(self) -> list:
        return self.ptr_params + self.size_params + self.stride_params + self.scalar_params
