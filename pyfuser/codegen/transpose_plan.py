"""Code generation for the transpose scheduler: TransposeParams -> CUDA C, Params, launch config.

`TransposePlan(fusion, params)` is what `schedule.transpose.plan_kernel` returns; it has the
KernelPlan interface the runtime's FusionExecutor uses (`kernel`, `allocate_outputs`) plus its
own `interpret(inputs, outputs, bindings)` (transpose_interp.py simulates the same algorithm).

Kernel parameters: the input and output pointers, then per kept input axis its size and stride
(Param sources ("size", 0, a) / ("stride", 0, a)); group sizes, group strides and the row-major
output strides are computed in the kernel's prologue. Elements are copied as raw bits (a `set`
never converts), so one kernel shape serves every dtype of the same size.

Invariants: the source compiles with NVRTC alone (no headers); int index types are only chosen
when `layout.needs_int64` says every offset fits, and grid-stride loops are capped so the
increment cannot overflow.
"""
from __future__ import annotations

import torch

from ..ir.tensor import TensorView
from ..schedule import layout as L
from ..schedule.transpose import ROWS, TransposeParams, group_extents
from .kernel import GeneratedKernel, LaunchConfig, Param
from .cuda import cached_load, cached_store
from .prelude import PRELUDE

BITS_CTYPE = {1: "unsigned char", 2: "unsigned short", 4: "unsigned int", 8: "unsigned long long"}
MAX_BLOCKS = 4096           # grid-stride cap: blocks * threads stays < 2^21
MAX_ROW_BLOCKS = 2 ** 31 - 1   # rows kernel: one pass; blk < nblk, so blk + gridDim.x fits


def _prologue(p: TransposeParams, it: str) -> list[str]:
    lines = []
    for g, axes in enumerate(p.groups):
        lines.append(f"  const {it} gs{g} = {' * '.join(f's{a}' for a in axes)};")
        lines.append(f"  const {it} gt{g} = t{axes[-1]};")
    k = len(p.groups)
    lines.append(f"  const {it} os{k - 1} = 1;")
    for g in range(k - 2, -1, -1):
        lines.append(f"  const {it} os{g} = os{g + 1} * gs{g + 1};")
    return lines


def _decompose(var: str, groups, it: str, in_acc: str, out_acc: str | None) -> list[str]:
    """`var` (a linear index over `groups`, outer -> inner) -> offsets added to the accumulators."""
    lines = []
    for g in reversed(groups):
        lines.append(f"    {{ const {it} q = {var} % gs{g}; {var} = {var} / gs{g}; "
                     f"{in_acc} += q * gt{g};" + (f" {out_acc} += q * os{g};" if out_acc else "")
                     + " }")
    return lines


def _row_offset(var: str, groups, it: str, acc: str) -> list[str]:
    """Input offset of row `var` (linear over `groups`, outer -> inner) added to `acc`; the
    outermost group takes what is left (no div/mod: the row index is in range)."""
    lines = []
    for k, g in enumerate(reversed(groups)):
        if k == len(groups) - 1:
            lines.append(f"        {acc} += {var} * gt{g};")
        else:
            lines.append(f"        {{ const {it} q = {var} / gs{g}; {acc} += ({var} - q * gs{g}) * gt{g}; "
                         f"{var} = q; }}")
    return lines


def _load(policy: str, n: int, dst: str, src: str, plain: str) -> str:
    """The statement loading n elements at `src` into `dst` with a cache policy ("" = `plain`)."""
    return cached_load(policy, n, dst, src) if policy else plain


def _store(policy: str, n: int, dst: str, src: str, plain: str) -> str:
    return cached_store(policy, n, dst, src) if policy else plain


def _rows_body(p: TransposeParams, it: str, T: str) -> list[str]:
    """Rows copy: vector l of the output (row-major, `vec` elements) reads input row l / nv at
    column l % nv. A block moves `unroll` x `block` vectors: step u's vectors are consecutive
    across the block (coalesced), every load is issued before the first store."""
    V, o, U, B = p.vec, p.o, p.unroll, p.block
    outer = list(range(len(p.groups) - 1))
    E = "V_t" if V > 1 else T
    lines = [f"  const {it} nv = gs{o} / {V};",
             f"  const {it} total = {' * '.join([f'gs{g}' for g in outer] + ['nv'])};",
             f"  const {it} nblk = (total + {U * B - 1}) / {U * B};"]
    if V > 1:
        lines.append(f"  struct __align__({V * p.itemsize}) V_t {{ {T} v[{V}]; }};")
    lines += [f"  for ({it} blk = blockIdx.x; blk < nblk; blk += gridDim.x) {{",
              f"    {E} buf[{U}];",
              "    #pragma unroll",
              f"    for (int u = 0; u < {U}; ++u) {{",
              f"      const {it} l = (blk * {U} + u) * {B} + ({it})threadIdx.x;",
              "      if (l < total) {",
              f"        {it} r = l / nv;",
              f"        {it} off = (l - r * nv) * {V} * gt{o};"]
    lines += _row_offset("r", outer, it, "off")
    lines += ["        " + _load(p.load_cache, V, "buf[u].v" if V > 1 else "&buf[u]", "in + off",
                                 f"buf[u] = *reinterpret_cast<const {E}*>(in + off);"),
              "      }",
              "    }",
              "    #pragma unroll",
              f"    for (int u = 0; u < {U}; ++u) {{",
              f"      const {it} l = (blk * {U} + u) * {B} + ({it})threadIdx.x;",
              "      if (l < total) " + _store(p.store_cache, V, f"out + l * {V}",
                                             "buf[u].v" if V > 1 else "&buf[u]",
                                             f"*reinterpret_cast<{E}*>(out + l * {V}) = buf[u];"),
              "    }",
              "  }"]
    return lines


def _tile_body(p: TransposeParams, it: str, T: str) -> list[str]:
    t, i, o = p.tile, p.i, p.o
    batch = " * ".join([f"gs{g}" for g in p.batch] or ["1"])
    lines = [f"  __shared__ {T} tile[{t}][{t + 1}];",
             f"  const {it} tiles_o = (gs{o} + {t - 1}) / {t}, tiles_i = (gs{i} + {t - 1}) / {t};",
             f"  const {it} nblk = tiles_o * tiles_i * {batch};",
             f"  for ({it} blk = blockIdx.x; blk < nblk; blk += gridDim.x) {{",
             f"    {it} r = blk / tiles_o;",
             f"    const {it} o0 = (blk % tiles_o) * {t}, i0 = (r % tiles_i) * {t};",
             "    r = r / tiles_i;",
             f"    {it} ib = 0, ob = 0;"]
    lines += _decompose("r", p.batch, it, "ib", "ob")
    lines += [f"    for (int j = threadIdx.y; j < {t}; j += {ROWS}) {{",
              f"      const {it} ii = i0 + threadIdx.x, oo = o0 + j;",
              f"      if (ii < gs{i} && oo < gs{o}) " + _load(
                  p.load_cache, 1, "&tile[j][threadIdx.x]", f"in + (ib + ii * gt{i} + oo * gt{o})",
                  f"tile[j][threadIdx.x] = in[ib + ii * gt{i} + oo * gt{o}];"),
              "    }",
              "    __syncthreads();",
              f"    for (int j = threadIdx.y; j < {t}; j += {ROWS}) {{",
              f"      const {it} oo = o0 + threadIdx.x, ii = i0 + j;",
              f"      if (ii < gs{i} && oo < gs{o}) " + _store(
                  p.store_cache, 1, f"out + (ob + ii * os{i} + oo)", "&tile[threadIdx.x][j]",
                  f"out[ob + ii * os{i} + oo] = tile[threadIdx.x][j];"),
              "    }",
              "    __syncthreads();",
              "  }"]
    return lines


BODIES = {"rows": _rows_body, "tile": _tile_body, "empty": lambda p, it, T: []}


def generate(p: TransposeParams, name: str) -> tuple[str, list[Param]]:
    it, T = p.index_type, BITS_CTYPE[p.itemsize]
    axes = [a for g in p.groups for a in g]
    params = [Param("in", "void*", ("ptr", 0)), Param("out", "void*", ("ptr", 1))]
    params += [Param(f"s{a}", it, ("size", 0, a)) for a in axes]
    params += [Param(f"t{a}", it, ("stride", 0, a)) for a in axes]
    sig = ", ".join([f"const {T}* __restrict__ in", f"{T}* __restrict__ out"] +
                    [f"{it} {q.name}" for q in params[2:]])
    body = (_prologue(p, it) if p.groups else []) + BODIES[p.kind](p, it, T)
    # the prelude (with int64_t) only where a cache policy needs its pf_ldc / pf_stc
    head = [PRELUDE] if (p.load_cache or p.store_cache) else ["typedef long long int64_t;"]
    src = "\n".join([f"// pyfuser transpose kernel: {p.as_dict()}"] + head + [
                     f'extern "C" __global__ void {name}({sig}) {{'] + body + ["}", ""])
    return src, params


def _launch_fn(p: TransposeParams):
    def launch_config(bindings, tensors) -> LaunchConfig:
        x = tensors[0]
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


class TransposePlan:
    def __init__(self, fusion, params: TransposeParams):
        self.params = params
        self.index_type = params.index_type
        self.kernel_ir = None
        self._output: TensorView = fusion.outputs[0]
        name = f"pf_transpose_{params.kind}_kernel"
        source, kparams = generate(params, name)
        self.kernel = GeneratedKernel(name, source, kparams, _launch_fn(params), params.as_dict())

    def allocate_outputs(self, bindings, inputs, device) -> list:
        o = self._output
        return [torch.empty(bindings.shape(o), dtype=o.dtype.torch, device=device)]

    def interpret(self, inputs, outputs, bindings) -> None:
        from .transpose_interp import run
        x = next(t for t in inputs if isinstance(t, torch.Tensor))
        run(self.params, x, outputs[0])

    def __repr__(self) -> str:
        return f"TransposePlan({self.kernel.name}, {self.params.as_dict()})"
