"""Lowering of the embedding_backward scheduler: EmbeddingBackwardParams -> kernel IR (printed by
cuda.py, run by the interpreter like every other kernel). docs/embedding_backward.md.

Block (x, y) owns vocabulary rows [x * R, x * R + R) and columns [y * S, y * S + S) of the
output, S = block * cols; thread `tid` owns the columns tid + k * block (k < cols) of the slice,
so no two threads touch one accumulator element and nothing needs an atomic.
1. Each thread zeroes its columns of the shared accumulator acc[R][S] (float; double for double).
2. Chunks of block * unroll tokens, in order: thread tid tests tokens chunk + u * block + tid
   (u < unroll): it reads the index (checked against num_weights, the output's row count, a
   kernel parameter, as the forward lookup's:
   CheckedIndex, a trap on the GPU) and votes whether it lies in the block's rows and is not
   the padding index. Per u, a warp ballot gives each warp's count (lane 0 writes it to shared
   `wcnt[u][warp]`) and each lane's rank among the lanes below it (popc of the ballot under a
   lane mask). After a barrier, every thread adds the counts in (u, warp) order: its own
   (u, warp)'s start and the chunk's total; each matching thread writes its row and token to
   slot start + rank of the lists `lrow` / `ltok` (token order: u, then warp, then lane).
3. After a second barrier, every thread walks the lists in order, `match_unroll` matches at a
   time: first their gradient loads (all issued before the first add), then the adds, in list
   order. The sum of the row being added to stays in registers (`run`) while consecutive
   matches hit the same row (a long run of one index: a token-type table) and goes back to
   acc when the row changes, so every element is the sequential sum of its tokens in token
   order, whatever R, S or the unrolls.
4. Each thread writes its columns of the R rows once (converted to the output dtype, through
   the epilogue's pointwise ops where the fusion has them: embedding_backward_epilogue.py);
   the padding row and rows no token hits are zeros, so the output needs no memset.
The next chunk's counts and lists are written only after its first barrier, which every
thread reaches after reading the previous chunk's lists: two barriers a chunk.

Invariants: every Ballot is reached by whole warps (outside every condition but the uniform
chunk loop); shared elements are written by one thread between two barriers; int index
arithmetic only where layout.needs_int64 says every offset fits.
"""
from __future__ import annotations

from ..ir.dtypes import DataType
from ..schedule.embedding_backward import WARP, EmbeddingBackwardParams, embedding_op
from . import kernel_ir as K
from .embedding_backward_epilogue import Epilogue
from .kernel import LaunchConfig, Param

V_ = K.Var
TID = K.Special("threadIdx.x")


def C(v):
    return K.Const(int(v), "nidx_t")


def I(v):                                   # noqa: E743 (an int constant)
    return K.Const(int(v), "int")


def _bin(op, a, b):
    return K.Bin(op, a, b)


def _coords_offset(t, sizes: list, strides: list):
    """The offset of row-major linear position `t` in a tensor of these sizes and strides
    (kernel IR Vars), the last axis fastest."""
    off, rest = None, t
    for k, (n, st) in enumerate(zip(reversed(sizes), reversed(strides))):
        coord = rest if k == len(sizes) - 1 else _bin("%", rest, n)
        off = K.mul(coord, st) if off is None else K.add(off, K.mul(coord, st))
        rest = _bin("/", rest, n)
    return C(0) if off is None else off


class _Builder:
    def __init__(self, p: EmbeddingBackwardParams, grad, ids, out, epilogue: Epilogue):
        self.p, self.grad, self.ids, self.out, self.epilogue = p, grad, ids, out, epilogue
        self.params = [Param("grad", "void*", ("ptr", p.grad_seg)),
                       Param("ids", "void*", ("ptr", p.ids_seg)),
                       Param("out", "void*", ("ptr", p.out_seg)),
                       Param("n_tok", "int", ("numel", p.ids_seg)),
                       Param("n_w", "int64_t", ("size", p.out_seg, 0)),
                       Param("H", p.index_type, ("size", p.grad_seg, grad.ndim - 1))]
        if not p.grad_dense:
            for a in range(grad.ndim):
                self.params += [Param(f"gsz{a}", p.index_type, ("size", p.grad_seg, a)),
                                Param(f"gst{a}", p.index_type, ("stride", p.grad_seg, a))]
        if not p.ids_dense:
            for a in range(ids.ndim):
                self.params += [Param(f"isz{a}", p.index_type, ("size", p.ids_seg, a)),
                                Param(f"ist{a}", p.index_type, ("stride", p.ids_seg, a))]
        self.params += epilogue.params

    # ---- offsets ------------------------------------------------------------------------------
    def ids_offset(self, t):
        if self.p.ids_dense:
            return t
        n = self.ids.ndim
        return _coords_offset(t, [V_(f"isz{a}") for a in range(n)],
                              [V_(f"ist{a}") for a in range(n)])

    def grad_offset(self, t, col):
        """Offset of column `col` of token t's gradient row."""
        if self.p.grad_dense:
            return K.add(K.mul(t, V_("H")), col)
        n = self.grad.ndim - 1
        row = _coords_offset(t, [V_(f"gsz{a}") for a in range(n)],
                             [V_(f"gst{a}") for a in range(n)])
        return K.add(row, K.mul(col, V_(f"gst{n}")))

    # ---- the kernel ---------------------------------------------------------------------------
    def col(self, k):
        return K.add(V_("c0"), K.add(C(k * self.p.block), TID))

    def slot(self, k):
        return K.add(C(k * self.p.block), TID)

    def body(self) -> list:
        p = self.p
        S = p.block * p.cols
        body = [
            K.Let("lane", "nidx_t", _bin("%", TID, C(WARP))),
            K.Let("warp", "nidx_t", _bin("/", TID, C(WARP))),
            K.Let("r0", "int64_t", K.mul(K.Special("blockIdx.x"), K.Const(p.rows, "int64_t")),
                  "the block's first vocabulary row"),
            K.Let("c0", "nidx_t", K.mul(K.Special("blockIdx.y"), C(S)), "its first column"),
            K.Alloc("acc", p.acc, (p.rows, S), "shared"),
            K.Alloc("wcnt", DataType.Int32, (p.unroll * p.warps,), "shared"),
            K.Alloc("lrow", DataType.Int32, (p.block * p.unroll,), "shared"),
            K.Alloc("ltok", DataType.Int32, (p.block * p.unroll,), "shared"),
            K.Alloc("run", p.acc, (p.cols,)),
            K.Alloc("cur", DataType.Int32, ()),
            K.Alloc("hit", DataType.Bool, (p.unroll,)),
            K.Alloc("rowv", DataType.Int32, (p.unroll,)),
            K.Alloc("base", DataType.Int32, (p.unroll,)),
            K.Alloc("nmatch", DataType.Int32, ()),
            K.Alloc("gval", self.grad.dtype, (p.match_unroll, p.cols)),
            K.Alloc("outv", self.out.dtype, (p.cols,)),
            *self.epilogue.allocs,
            K.Loop("r", C(0), C(p.rows), C(1), "serial",
                   [K.Assign("acc", (V_("r"), self.slot(k)), self._zero())
                    for k in range(p.cols)], "zero this thread's columns"),
            *[K.Assign("run", (I(k),), self._zero()) for k in range(p.cols)],
            K.Assign("cur", (), I(0)),
            K.Loop("chunk", C(0), V_("n_tok"), C(p.block * p.unroll), "serial",
                   self._test() + [K.Sync()] + self._compact() + [K.Sync()] + self._accumulate(),
                   "chunks of tokens, in order"),
            *[K.Assign("acc", (K.ArrayRef("cur", ()), self.slot(k)), K.ArrayRef("run", (I(k),)))
              for k in range(p.cols)],
            K.Loop("r", C(0), C(p.rows), C(1), "serial", self._write(), "write the tile once"),
        ]
        return body

    def _zero(self):
        return K.Const(0.0, "double" if self.p.acc is DataType.Double else "float", self.p.acc)

    def _test(self) -> list:
        """Each thread votes on its unroll tokens of the chunk; lane 0 of each warp counts."""
        p = self.p
        out = []
        for u in range(p.unroll):
            t = V_(f"t{u}")
            idx = K.CheckedIndex(K.Elem("ids", self.ids_offset(t)),
                                 V_("n_w"),
                                 "embedding_dense_backward: index out of range")
            inside = _bin("&&", _bin("<=", V_("r0"), V_(f"ix{u}")),
                          _bin("<", V_(f"ix{u}"), K.add(V_("r0"), K.Const(p.rows, "int64_t"))))
            if p.padding_idx >= 0:       # (past the rows: no checked index equals it)
                inside = _bin("&&", inside, _bin("!=", V_(f"ix{u}"),
                                                   K.Const(p.padding_idx, "int64_t")))
            out += [K.Let(f"t{u}", "nidx_t", K.add(V_("chunk"), K.add(C(u * p.block), TID))),
                    K.Assign("hit", (I(u),), K.Const(False, "bool")),
                    K.If(_bin("<", t, V_("n_tok")), [
                        K.Let(f"ix{u}", "int64_t", idx),
                        K.If(inside, [K.Assign("hit", (I(u),), K.Const(True, "bool")),
                                      K.Assign("rowv", (I(u),),
                                               _bin("-", V_(f"ix{u}"), V_("r0")))])])]
        for u in range(p.unroll):
            out += [K.Let(f"m{u}", "int64_t", K.Ballot(K.ArrayRef("hit", (I(u),))),
                          "the warp's votes"),
                    K.If(_bin("==", V_("lane"), C(0)), [
                        K.Assign("wcnt", (K.add(C(u * p.warps), V_("warp")),),
                                 K.Op("popc", (V_(f"m{u}"),), DataType.Int))])]
        return out

    def _compact(self) -> list:
        """Starts of this thread's (u, warp) in the chunk's lists, the total, then its slots."""
        p = self.p
        out = [K.Assign("nmatch", (), I(0))]
        for u in range(p.unroll):
            for w in range(p.warps):
                out += [K.If(_bin("==", V_("warp"), C(w)),
                             [K.Assign("base", (I(u),), K.ArrayRef("nmatch", ()))]),
                        K.Assign("nmatch", (), K.add(K.ArrayRef("nmatch", ()),
                                                     K.ArrayRef("wcnt", (C(u * p.warps + w),))))]
        below = _bin("-", _bin("<<", K.Const(1, "int64_t"), V_("lane")), K.Const(1, "int64_t"))
        for u in range(p.unroll):
            rank = K.Op("popc", (_bin("&", V_(f"m{u}"), below),), DataType.Int)
            out.append(K.If(K.ArrayRef("hit", (I(u),)), [
                K.Let(f"slot{u}", "int", K.add(K.ArrayRef("base", (I(u),)), rank)),
                K.Assign("lrow", (V_(f"slot{u}"),), K.ArrayRef("rowv", (I(u),))),
                K.Assign("ltok", (V_(f"slot{u}"),), V_(f"t{u}"))]))
        return out

    def _accumulate(self) -> list:
        p = self.p
        M = p.match_unroll
        loads, adds = [], []
        for m in range(M):
            jm = K.add(V_("j"), C(m))
            tok = V_(f"tok{m}")
            ld = [K.Let(f"tok{m}", "nidx_t", K.ArrayRef("ltok", (jm,)))]
            for k in range(p.cols):
                col = self.col(k)
                ld.append(K.If(_bin("<", col, V_("H")), [
                    K.Load("gval", (I(m), I(k)), "grad", self.grad_offset(tok, col), 1)]))
            loads.append(K.If(_bin("<", jm, K.ArrayRef("nmatch", ())), ld))
            row = V_(f"row{m}")
            switch = [K.Assign("acc", (K.ArrayRef("cur", ()), self.slot(k)),
                               K.ArrayRef("run", (I(k),))) for k in range(p.cols)]
            switch += [K.Assign("run", (I(k),), K.ArrayRef("acc", (row, self.slot(k))))
                       for k in range(p.cols)]
            switch.append(K.Assign("cur", (), row))
            add = [K.Let(f"row{m}", "int", K.ArrayRef("lrow", (jm,))),
                   K.If(_bin("!=", row, K.ArrayRef("cur", ())), switch)]
            for k in range(p.cols):
                g = K.Convert("load", K.ArrayRef("gval", (I(m), I(k))), self.grad.dtype,
                              self.grad.dtype)
                add.append(K.If(_bin("<", self.col(k), V_("H")), [
                    K.Assign("run", (I(k),), K.Op("add", (K.ArrayRef("run", (I(k),)), g),
                                                  p.acc))]))
            adds.append(K.If(_bin("<", jm, K.ArrayRef("nmatch", ())), add))
        return [K.Loop("j", C(0), K.ArrayRef("nmatch", ()), C(M), "serial", loads + adds,
                       "the chunk's matches in token order")]

    def _write(self) -> list:
        p = self.p
        v = V_("v_row")
        stmts = []
        for k in range(p.cols):
            col = self.col(k)
            pre, value = self.epilogue.value(K.ArrayRef("acc", (V_("r"), self.slot(k))), v, col, k)
            stmts.append(K.If(_bin("<", col, V_("H")), pre + [
                K.Assign("outv", (I(k),), value),
                K.Store("out", K.add(K.mul(v, V_("H")), col), "outv", (I(k),), 1)]))
        return [K.Let("v_row", "nidx_t", K.add(V_("r0"), V_("r"))),
                K.If(_bin("<", v, V_("n_w")), stmts)]


def build(p: EmbeddingBackwardParams, fusion, name: str) -> K.Kernel:
    e = embedding_op(fusion)
    grad, ids, out = e.inputs[0], e.inputs[1], fusion.outputs[0]
    epilogue = Epilogue(p, fusion)
    b = _Builder(p, grad, ids, out, epilogue)
    tensors = {"grad": K.TensorParam("grad", grad.dtype, p.grad_seg, False),
               "ids": K.TensorParam("ids", ids.dtype, p.ids_seg, False),
               "out": K.TensorParam("out", out.dtype, p.out_seg, True), **epilogue.tensors}
    return K.Kernel(name, b.params, tensors, p.index_type, (p.block, 1, 1), b.body())


def launch_fn(p: EmbeddingBackwardParams):
    """(bindings, tensors) -> the grid: row tiles along x, column slices along y."""
    def launch_config(bindings, tensors) -> LaunchConfig:
        out = tensors[p.out_seg]
        rows, hidden = int(out.shape[0]), int(out.shape[1])
        if rows == 0 or hidden == 0:
            return LaunchConfig((0, 1, 1), (p.block, 1, 1))
        slices = -(-hidden // (p.block * p.cols))
        return LaunchConfig((-(-rows // p.rows), slices, 1), (p.block, 1, 1))
    return launch_config
