"""The embedding_backward kernel's epilogue (schedule/embedding_backward.py): the pointwise ops
after the EmbeddingBackwardOp, computed where the kernel writes an element of the weight
gradient, so that a tied embedding's two gradients are added without writing the embedding's
own [num_weights, H] gradient and reading it again.

At element (v, c): the embedding's value is the tile's sum rounded to the EmbeddingBackwardOp's
dtype (what eager's separate op writes), each epilogue input's element is loaded from v * s0 +
c * s1 (its own strides, kernel parameters), and each op is the op table's in its computation
dtype, operands converted as the builder promoted them and half / bfloat16 results rounded, as
every pointwise kernel computes it (emitter.py's convert_arg / op_expr): the stored value is
what eager's ops give, one after the other.

Invariant: without epilogue ops the kernel is the one it was before (no parameter, no load).
"""
from __future__ import annotations

from ..ir import exprs as E
from ..ir.dtypes import DataType
from ..ir.tensor import TensorView
from ..schedule import embedding_backward as EB
from . import kernel_ir as K
from .emitter import convert_arg, op_compute_dtype, op_expr
from .kernel import Param


class Epilogue:
    def __init__(self, p: EB.EmbeddingBackwardParams, fusion):
        self.e = EB.embedding_op(fusion)
        self.exprs = EB.epilogue(fusion)
        self.inputs = EB.epilogue_inputs(fusion)
        self.p = p
        self.params, self.tensors, self.allocs = [], {}, []
        self.name_of: dict = {}
        for j, (tv, seg) in enumerate(zip(self.inputs, p.epilogue)):
            name = f"ep{j}"
            self.name_of[id(tv)] = name
            self.params += [Param(name, "void*", ("ptr", seg)),
                            Param(f"{name}_s0", p.index_type, ("stride", seg, 0)),
                            Param(f"{name}_s1", p.index_type, ("stride", seg, 1))]
            self.tensors[name] = K.TensorParam(name, tv.dtype, seg, False)
            self.allocs.append(K.Alloc(f"{name}_v", tv.dtype, (p.cols,)))

    def value(self, acc_ref, row, col, k: int) -> tuple[list, object]:
        """(statements, the stored value's expression) of column slot k at (row, col): the sum
        `acc_ref` (the accumulator's dtype) through the epilogue, in the output's dtype."""
        out = self.e.output.dtype
        if not self.exprs:
            return [], K.Convert("store", acc_ref, self.p.acc, out)
        stmts: list = []
        vals = {id(self.e.output): self._rounded(acc_ref, self.p.acc, out)}
        for tv in self.inputs:
            name = self.name_of[id(tv)]
            off = K.add(K.mul(row, K.Var(f"{name}_s0")), K.mul(col, K.Var(f"{name}_s1")))
            ref = K.ArrayRef(f"{name}_v", (K.Const(k, "int"),))
            stmts.append(K.Load(f"{name}_v", (K.Const(k, "int"),), name, off, 1))
            vals[id(tv)] = K.Convert("load", ref, tv.dtype, tv.dtype)
        for i, x in enumerate(self.exprs):
            dt = x.outputs[0].dtype
            if isinstance(x, E.CastOp):
                src = x.inputs[0]
                expr = K.Convert("cast", vals[id(src)], src.dtype, dt)
            else:
                compute = op_compute_dtype(x)
                args = [convert_arg(self._operand(v, vals), v.dtype, compute, x, a)
                        for a, v in enumerate(x.inputs)]
                expr = op_expr(x, args, compute, dt)
            name = f"epv{i}_{k}"
            stmts.append(K.Let(name, K.REGISTER_CTYPE[dt], expr, x.op_name))
            vals[id(x.outputs[0])] = K.Var(name)
        last = self.exprs[-1].outputs[0]
        return stmts, K.Convert("store", vals[id(last)], last.dtype, last.dtype)

    @staticmethod
    def _rounded(acc_ref, acc: DataType, dt: DataType):
        """The sum as a register value of dtype dt (rounded where dt is half / bfloat16)."""
        if dt.is_reduced_float:
            return K.Convert("round", acc_ref, DataType.Float, dt)
        return acc_ref if dt is acc else K.Convert("cast", acc_ref, acc, dt)

    @staticmethod
    def _operand(v, vals):
        if isinstance(v, TensorView):
            return vals[id(v)]
        return K.Const(v.value, K.REGISTER_CTYPE[v.dtype], v.dtype)
