"""Lowering of the transpose scheduler: TransposeParams -> kernel IR (printed by cuda.py, run by
the interpreter like every other kernel).

Kernel parameters: the input and output pointers (kernel tensors `p.in_seg` and `p.out_seg`: the
fusion may take tensors the copy does not read), then per kept input axis its size and stride
(Param sources ("size", in_seg, a) / ("stride", in_seg, a)); group sizes `gs<g>`, group input strides
`gt<g>` and the row-major output strides `os<g>` are Lets of the prologue.

- "tile": a block of (TILE, ROWS) threads stages a TILE x TILE tile of the (i, o) groups through
  shared memory `tile[TILE][TILE + 1]` (padded against bank conflicts): threads read along i
  (the input's inner group) and, after a barrier, write along o (the output's inner group), both
  coalesced; a second barrier guards the tile before the next grid-stride step reuses it.
- "rows": vector l of the output (row-major, `vec` elements) reads input row l / nv at column
  l % nv; a block moves `unroll` x `block` vectors, all loaded before the first store.
- "empty": nothing to copy (no launch).

Invariants: int index types are only chosen when `layout.needs_int64` says every offset fits, and
grid-stride loops are capped (launch config) so the increment cannot overflow.
"""
from __future__ import annotations

from ..schedule.transpose import ROWS, TransposeParams
from . import kernel_ir as K
from .kernel import Param

C = lambda v: K.Const(int(v), "nidx_t")  # noqa: E731
V_ = K.Var


def _mul_all(terms):
    out = C(1)
    for t in terms:
        out = K.mul(out, t)
    return out


def _prologue(p: TransposeParams) -> list:
    out = []
    for g, axes in enumerate(p.groups):
        out.append(K.Let(f"gs{g}", "nidx_t", _mul_all(V_(f"s{a}") for a in axes)))
        out.append(K.Let(f"gt{g}", "nidx_t", V_(f"t{axes[-1]}")))
    k = len(p.groups)
    out.append(K.Let(f"os{k - 1}", "nidx_t", C(1)))
    for g in range(k - 2, -1, -1):
        out.append(K.Let(f"os{g}", "nidx_t", K.mul(V_(f"os{g + 1}"), V_(f"gs{g + 1}"))))
    return out


def _row_offset(row, groups, out: list, tag: str):
    """Input offset of row `row` (linear over `groups`, outer -> inner); the outermost group
    takes what is left (no div/mod: the row index is in range). Lets go to `out`."""
    off, rest = C(0), row
    for k, g in enumerate(reversed(groups)):
        if k == len(groups) - 1:
            off = K.add(off, K.mul(rest, V_(f"gt{g}")))
        else:
            q = f"{tag}q{g}"
            out.append(K.Let(q, "nidx_t", K.Bin("/", rest, V_(f"gs{g}"))))
            off = K.add(off, K.mul(K.Bin("-", rest, K.mul(V_(q), V_(f"gs{g}"))), V_(f"gt{g}")))
            rest = V_(q)
    return off


def _rows_body(p: TransposeParams, dtype) -> list:
    V, o, U, B = p.vec, p.o, p.unroll, p.block
    outer = list(range(len(p.groups) - 1))
    tid = K.Special("threadIdx.x")
    body = [K.Let("nv", "nidx_t", K.Bin("/", V_(f"gs{o}"), C(V))),
            K.Let("total", "nidx_t", _mul_all([V_(f"gs{g}") for g in outer] + [V_("nv")])),
            K.Let("nblk", "nidx_t", K.Bin("/", K.add(V_("total"), C(U * B - 1)), C(U * B)))]
    lin = K.add(K.mul(K.add(K.mul(V_("blk"), C(U)), V_("u")), C(B)), tid)

    def step(inner):
        return K.Loop("u", C(0), C(U), C(1), "unroll",
                      [K.Let("l", "nidx_t", lin), K.If(K.Bin("<", V_("l"), V_("total")), inner)])

    lets: list = [K.Let("r", "nidx_t", K.Bin("/", V_("l"), V_("nv")))]
    col = K.mul(K.mul(K.Bin("-", V_("l"), K.mul(V_("r"), V_("nv"))), C(V)), V_(f"gt{o}"))
    off = K.add(col, _row_offset(V_("r"), outer, lets, ""))
    load = lets + [K.Load("buf", (V_("u"),), "in", off, V, None, p.load_cache)]
    store = [K.Store("out", K.mul(V_("l"), C(V)), "buf", (V_("u"),), V, None, p.store_cache)]
    grid = [K.Alloc("buf", dtype, (U, V)), step(load), step(store)]
    body.append(K.Loop("blk", K.Special("blockIdx.x"), V_("nblk"), K.Special("gridDim.x"), "grid",
                       grid, "blocks of vectors"))
    return body


def _tile_body(p: TransposeParams, dtype) -> list:
    t, i, o = p.tile, p.i, p.o
    tx, ty = K.Special("threadIdx.x"), K.Special("threadIdx.y")
    body = [K.Alloc("tile", dtype, (t, t + 1), "shared"),
            K.Let("tiles_o", "nidx_t", K.Bin("/", K.add(V_(f"gs{o}"), C(t - 1)), C(t))),
            K.Let("tiles_i", "nidx_t", K.Bin("/", K.add(V_(f"gs{i}"), C(t - 1)), C(t))),
            K.Let("nblk", "nidx_t", _mul_all([V_("tiles_o"), V_("tiles_i")] +
                                             [V_(f"gs{g}") for g in p.batch]))]
    blk: list = [K.Let("r0", "nidx_t", K.Bin("/", V_("blk"), V_("tiles_o"))),
                 K.Let("o0", "nidx_t", K.mul(K.Bin("%", V_("blk"), V_("tiles_o")), C(t))),
                 K.Let("i0", "nidx_t", K.mul(K.Bin("%", V_("r0"), V_("tiles_i")), C(t))),
                 K.Let("rb", "nidx_t", K.Bin("/", V_("r0"), V_("tiles_i")))]
    ib, ob, rest = C(0), C(0), V_("rb")
    for g in reversed(p.batch):
        blk.append(K.Let(f"b{g}", "nidx_t", K.Bin("%", rest, V_(f"gs{g}"))))
        ib = K.add(ib, K.mul(V_(f"b{g}"), V_(f"gt{g}")))
        ob = K.add(ob, K.mul(V_(f"b{g}"), V_(f"os{g}")))
        rest = K.Bin("/", rest, V_(f"gs{g}"))
    blk += [K.Let("ib", "nidx_t", ib), K.Let("ob", "nidx_t", ob)]

    def rows(ii, oo, stmt):
        inside = K.Bin("&&", K.Bin("<", V_("ii"), V_(f"gs{i}")), K.Bin("<", V_("oo"), V_(f"gs{o}")))
        return K.Loop("j", ty, C(t), C(ROWS), "serial",
                      [K.Let("ii", "nidx_t", ii), K.Let("oo", "nidx_t", oo), K.If(inside, [stmt])])

    src = K.add(V_("ib"), K.add(K.mul(V_("ii"), V_(f"gt{i}")), K.mul(V_("oo"), V_(f"gt{o}"))))
    dst = K.add(V_("ob"), K.add(K.mul(V_("ii"), V_(f"os{i}")), V_("oo")))
    blk += [rows(K.add(V_("i0"), tx), K.add(V_("o0"), V_("j")),
                 K.Load("tile", (V_("j"), tx), "in", src, 1, None, p.load_cache)),
            K.Sync(),
            rows(K.add(V_("i0"), V_("j")), K.add(V_("o0"), tx),
                 K.Store("out", dst, "tile", (tx, V_("j")), 1, None, p.store_cache)),
            K.Sync()]
    body.append(K.Loop("blk", K.Special("blockIdx.x"), V_("nblk"), K.Special("gridDim.x"), "grid",
                       blk, "tiles"))
    return body


def build(p: TransposeParams, fusion, name: str) -> K.Kernel:
    """The kernel IR of a transpose plan for `fusion` (one set of an input)."""
    inp, out = fusion.tensor_inputs()[p.in_seg], fusion.outputs[0]
    assert inp is fusion.used_exprs()[0].inputs[0], "the plan is another fusion's"
    it, i = p.index_type, p.in_seg
    axes = [a for g in p.groups for a in g]
    params = [Param("in", "void*", ("ptr", i)), Param("out", "void*", ("ptr", p.out_seg))]
    params += [Param(f"s{a}", it, ("size", i, a)) for a in axes]
    params += [Param(f"t{a}", it, ("stride", i, a)) for a in axes]
    tensors = {"in": K.TensorParam("in", inp.dtype, i, False),
               "out": K.TensorParam("out", out.dtype, p.out_seg, True)}
    if p.kind == "empty":
        body, block = [], (p.block, 1, 1)
    elif p.kind == "rows":
        body, block = _prologue(p) + _rows_body(p, inp.dtype), (p.block, 1, 1)
    else:
        body, block = _prologue(p) + _tile_body(p, inp.dtype), (p.tile, ROWS, 1)
    return K.Kernel(name, params, tensors, it, block, body)


MAX_BLOCKS = 4096           # tile kernel grid cap (x16): blocks * threads stays < 2^27
MAX_ROW_BLOCKS = 2 ** 31 - 1   # rows kernel: one pass; blk < nblk, so blk + gridDim.x fits


def launch_fn(p: TransposeParams):
    """(bindings, tensors) -> LaunchConfig of a transpose kernel (tensors[p.in_seg] is the
    input)."""
    from ..schedule import layout as L
    from ..schedule.transpose import group_extents
    from .kernel import LaunchConfig

    def launch_config(bindings, tensors) -> LaunchConfig:
        x = tensors[p.in_seg]
        if p.kind == "empty" or x.numel() == 0:
            return LaunchConfig((0, 1, 1), (p.block, 1, 1))
        sizes, _ = group_extents(p.groups, x)
        if p.kind == "rows":   # one pass (grid-strides only past MAX_ROW_BLOCKS)
            vectors = x.numel() // p.vec
            return LaunchConfig((max(1, min(-(-vectors // (p.block * p.unroll)), MAX_ROW_BLOCKS)), 1, 1),
                                (p.block, 1, 1))
        t = p.tile
        nblk = -(-sizes[p.o] // t) * -(-sizes[p.i] // t) * L.numel(sizes[g] for g in p.batch)
        return LaunchConfig((max(1, min(nblk, MAX_BLOCKS * 16)), 1, 1), (t, ROWS, 1))
    return launch_config
