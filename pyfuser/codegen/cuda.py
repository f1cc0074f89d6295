"""CUDA C printer: kernel IR -> the text of one `extern "C" __global__` function.

The output is meant to be read: locals are named after TensorViews (`t3` is T3's value in a
register, `T0_r` the elements loaded from input T0, `T7_w` those stored to output T7), one `const`
statement per Fusion op, in Fusion order. Index variables: `bx`/`by` block indices of the
grid-stride loops, `u` the unrolled step, `v` the vector lane, `g<i>` the index into collapsed axis
group i, `e<i>` that group's extent, `r<k>` reference axis k (only with views).

Invariant: the printer adds no arithmetic of its own: every operation printed is a kernel IR node.
"""
from __future__ import annotations

import math
import struct

from ..ir.dtypes import DataType
from ..ir.ops import kernel_op
from . import kernel_ir as K
from .kernel_shared import ALIGN, shared_layout
from .prelude import PRELUDE


def packed_bits(value: float, dtype: DataType) -> int:
    """The 16 bits of `value` in half / bfloat16, which must hold it exactly."""
    if dtype is DataType.Half:
        bits = struct.unpack("<H", struct.pack("<e", value))[0]
        back = struct.unpack("<e", struct.pack("<H", bits))[0]
    else:
        full = struct.unpack("<I", struct.pack("<f", value))[0]
        bits = full >> 16
        back = struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    assert back == value or (math.isnan(back) and math.isnan(value)), (value, dtype)
    return bits


def c_const(value, ctype: str, dtype: DataType | None) -> str:
    if ctype == "bool" or dtype is DataType.Bool:
        return "true" if value else "false"
    if ctype in ("float", "double") or (dtype is not None and dtype.is_floating):
        v = float(value)
        if math.isnan(v):
            lit = "__longlong_as_double(0x7ff8000000000000LL)"
        elif math.isinf(v):
            lit = ("" if v > 0 else "-") + "__longlong_as_double(0x7ff0000000000000LL)"
        else:
            lit = repr(v)
            if "e" not in lit and "." not in lit and "inf" not in lit:
                lit += ".0"
        return lit if ctype == "double" else f"(({ctype}){lit})"
    v = int(value)
    if ctype == "int64_t":
        if v == -2 ** 63:
            return "(-9223372036854775807LL - 1)"
        return f"{v}LL"
    if ctype == "int" and v == -2 ** 31:
        return "(-2147483647 - 1)"
    return str(v) if ctype in ("int", "nidx_t") else f"(({ctype}){v})"



def cached_load(policy: str, n: int, dst: str, src: str) -> str:
    """The statement loading n elements at `src` into `dst` with cache policy `policy` (not "")."""
    return f"pf_ldc<{K.CACHE_POLICIES[policy]}, {n}>({dst}, {src});"


def cached_store(policy: str, n: int, dst: str, src: str) -> str:
    """The statement storing n elements of `src` at `dst` with cache policy `policy` (not "")."""
    return f"pf_stc<{K.CACHE_POLICIES[policy]}, {n}>({dst}, {src});"

SHFL_NATIVE = {"int", "int64_t", "float", "double"}     # types __shfl_xor_sync takes as they are


def _c_string(text: str) -> str:
    """`text` inside a C string literal."""
    return text.replace("\\", "\\\\").replace('"', '\\"')


class Printer:
    def __init__(self, k: K.Kernel):
        self.k = k
        self.lines: list[str] = []
        self.dims: dict = {}             # array name -> its Alloc's dims (element vs row access)
        self.dtypes: dict = {}           # array name -> its Alloc's dtype
        self.async_dsts = {s.dst for s in k.walk() if isinstance(s, K.Load) and s.async_copy}
        self.packed: dict = {}           # packed array name -> its dtype
        self.rounded: dict = {}          # Let name -> (half/bf16, C expr before its rounding)
        self.shared = shared_layout(k)   # static arrays, or slices of dynamic shared memory

    # ---- expressions ----------------------------------------------------------------------
    def e(self, x) -> str:
        if isinstance(x, K.Var):
            return x.name
        if isinstance(x, K.Const):
            return c_const(x.value, x.ctype, x.dtype)
        if isinstance(x, K.Special):
            if x.name == "cluster_rank":
                return "((nidx_t)pf_cluster_rank())"
            return f"((nidx_t){x.name})"
        if isinstance(x, K.RemoteRef):
            elem = x.name + "".join(f"[{self.e(i)}]" for i in x.index)
            return f"pf_dsmem_load(&{elem}, (unsigned)({self.e(x.rank)}))"
        if isinstance(x, K.Bin):
            return f"({self.e(x.a)} {x.op} {self.e(x.b)})"
        if isinstance(x, K.ArrayRef):
            if x.name in self.packed:
                *outer, lane = x.index
                word = x.name + "".join(f"[{self.e(i)}]" for i in outer) + f"[({self.e(lane)}) >> 1]"
                kind = "half" if self.packed[x.name] is DataType.Half else "bf16"
                return f"pf_unpack_{kind}({word}, ({self.e(lane)}) & 1)"
            return x.name + "".join(f"[{self.e(i)}]" for i in x.index)
        if isinstance(x, K.Op):
            return kernel_op(x.name).cuda.format(*(self.e(a) for a in x.args))
        if isinstance(x, K.Convert):
            return self.convert(x)
        if isinstance(x, K.Elem):
            return f"{x.ptr}[{self.e(x.offset)}]"
        if isinstance(x, K.CheckedIndex):
            return (f"pf_checked_index({self.e(x.value)}, (long long)({self.e(x.size)}), "
                    f"\"{self.k.name}: {_c_string(x.text)}\")")
        if isinstance(x, K.Ballot):
            return f"((int64_t)__ballot_sync(0xffffffffu, {self.e(x.pred)}))"
        if isinstance(x, K.Shfl):
            ct = K.REGISTER_CTYPE[x.dtype]
            if ct in SHFL_NATIVE:
                return f"__shfl_xor_sync(0xffffffffu, {self.e(x.value)}, {x.lane_xor})"
            return f"(({ct})__shfl_xor_sync(0xffffffffu, (int)({self.e(x.value)}), {x.lane_xor}))"
        raise TypeError(f"cannot print {x!r}")

    def convert(self, x: K.Convert) -> str:
        a = self.e(x.arg)
        if x.kind == "load":
            return f"pf_to_reg({a})" if x.src.is_reduced_float else a
        if x.kind == "store":
            if not x.dst.is_reduced_float:
                return a
            if isinstance(x.arg, K.Var) and self.rounded.get(x.arg.name, (None,))[0] is x.dst:
                a = self.rounded[x.arg.name][1]  # storing a value just rounded to its type
            return f"pf_to_storage<{K.STORAGE_CTYPE[x.dst]}>({a})"
        if x.kind == "round":
            return _round(x.dst, a)
        # cast: eager conversion between register types, then rounding to half/bf16
        out = _cast(x, a)
        return _round(x.dst, out) if x.dst.is_reduced_float and x.src is not x.dst else out

    def _unrounded(self, x):
        """(half/bf16 type, the C expression before the rounding) of a Convert that rounds a
        float value to that type, else None."""
        if not isinstance(x, K.Convert) or not x.dst.is_reduced_float:
            return None
        if x.kind == "round":
            return x.dst, self.e(x.arg)
        if x.kind == "cast" and x.src is not x.dst:
            return x.dst, _cast(x, self.e(x.arg))
        return None

    # ---- statements -----------------------------------------------------------------------
    def emit(self, stmts, ind: int) -> None:
        """Print `stmts` at depth `ind`. A store of a Let's value rounded to half/bf16 in the
        same statement list converts the value before the rounding instead (one conversion, not
        round-then-convert: the same bits; the conversions are inline asm, which the compiler
        does not fold). Only within one list: there the Let's operands name the same values."""
        pad = "  " * ind
        outer, self.rounded = self.rounded, {}
        for s in stmts:
            if isinstance(s, K.Let):
                ct = s.ctype
                note = f"  // {s.comment}" if s.comment else ""
                un = self._unrounded(s.expr)
                if un is not None:
                    self.rounded[s.name] = un
                text = _round(*un) if un is not None else self.e(s.expr)
                self.lines.append(f"{pad}const {ct} {s.name} = {text};{note}")
            elif isinstance(s, K.Alloc):
                space = "__shared__ " if s.space == "shared" else ""
                if s.name in self.async_dsts:        # cp.async writes 16-byte-aligned vectors
                    space += "__align__(16) "
                self.dims[s.name] = tuple(s.dims)
                self.dtypes[s.name] = s.dtype
                ctype = K.STORAGE_CTYPE[s.dtype]
                dims = list(s.dims)
                if s.packed:
                    assert s.dtype.itemsize == 2 and dims and dims[-1] % 2 == 0, s
                    self.packed[s.name] = s.dtype
                    ctype, dims[-1] = "uint32_t", dims[-1] // 2
                extents = ''.join(f'[{d}]' for d in dims)
                if s.space == "shared" and self.shared.dynamic:
                    # a slice of the launch's dynamic shared memory, indexed as the array
                    off = self.shared.offsets[s.name]
                    self.lines.append(f"{pad}{ctype} (&{s.name}){extents} = *reinterpret_cast<"
                                      f"{ctype} (*){extents}>(pf_dyn_smem + {off});")
                else:
                    self.lines.append(f"{pad}{space}{ctype} {s.name}{extents};")
            elif isinstance(s, K.Loop):
                self.loop(s, ind)
            elif isinstance(s, K.If):
                self.lines.append(f"{pad}if ({self.e(s.cond)}) {{")
                self.emit(s.body, ind + 1)
                self.lines.append(f"{pad}}}")
            elif isinstance(s, K.Load):
                self.load(s, pad)
            elif isinstance(s, K.Store):
                self.store(s, pad)
            elif isinstance(s, K.Assign):
                assert s.name not in self.packed, f"packed array {s.name} is written by loads only"
                idx = "".join(f"[{self.e(i)}]" for i in s.index)
                self.lines.append(f"{pad}{s.name}{idx} = {self.e(s.expr)};")
            elif isinstance(s, K.VecCopy):
                assert s.src not in self.packed, s
                src = f"&{self._dst(s.src, s.src_index)}[0]"
                if s.dst in self.packed:             # 2-byte elements read as 32-bit words
                    assert s.width == self.dims[s.dst][-1] and s.width % 2 == 0, s
                    self.lines.append(f"{pad}pf_ld<{s.width // 2}>(&{self._dst(s.dst, s.dst_index)}"
                                      f"[0], reinterpret_cast<const uint32_t*>({src}));")
                else:
                    self.lines.append(f"{pad}pf_ld<{s.width}>(&{self._dst(s.dst, s.dst_index)}[0], "
                                      f"{src});")
            elif isinstance(s, K.PackedFill):
                self.packed_fill(s, pad)
            elif isinstance(s, K.PackedOp):
                self.packed_op(s, pad)
            elif isinstance(s, K.Sync):
                self.lines.append(f"{pad}__syncthreads();")
            elif isinstance(s, K.AtomicAdd):
                ct = K.STORAGE_CTYPE[self.k.tensors[s.ptr].dtype]
                self.lines.append(f"{pad}const {ct} {s.dst} = atomicAdd({s.ptr} + {self.e(s.offset)}, "
                                  f"({ct}){self.e(s.value)});")
            elif isinstance(s, K.Fence):
                self.lines.append(f"{pad}__threadfence();")
            elif isinstance(s, K.WaitCount):
                ct = K.STORAGE_CTYPE[self.k.tensors[s.ptr].dtype]
                self.lines.append(f"{pad}while (atomicAdd({s.ptr} + {self.e(s.offset)}, ({ct})0) < "
                                  f"({ct})({self.e(s.value)})) {{ __nanosleep(64); }}")
            elif isinstance(s, K.AsyncWait):
                self.lines.append(f"{pad}pf_cp_async_wait();")
            elif isinstance(s, K.ClusterSync):
                self.lines.append(f"{pad}pf_cluster_{s.phase}();")
            elif isinstance(s, K.MbarInit):
                self.lines.append(f"{pad}pf_mbar_init(&{s.name}, {s.count}u);")
            elif isinstance(s, K.MbarExpect):
                self.lines.append(f"{pad}pf_mbar_expect(&{s.name}, {s.nbytes}u);")
            elif isinstance(s, K.MbarWait):
                self.lines.append(f"{pad}pf_mbar_wait(&{s.name}, (unsigned)({self.e(s.parity)}));")
            elif isinstance(s, K.PushRemote):
                ct = K.STORAGE_CTYPE[s.dtype]
                self.lines.append(f"{pad}pf_push<{ct}>(&{self._dst(s.dst, s.index)}, ({ct})({self.e(s.value)}), "
                                  f"(unsigned)({self.e(s.rank)}), &{s.mbar});")
            elif isinstance(s, K.Comment):
                self.lines.append(f"{pad}// {s.text}")
        self.rounded = outer

    def _packed_kind(self, name) -> str:
        assert name in self.packed, f"{name} is not a packed array"
        return "half" if self.packed[name] is DataType.Half else "bf16"

    def packed_fill(self, s: K.PackedFill, pad: str) -> None:
        (n,) = self.dims[s.dst]
        half = packed_bits(s.value, self.packed[s.dst])
        word = f"0x{half << 16 | half:08x}u"
        for w in range(n // 2):
            self.lines.append(f"{pad}{s.dst}[{w}] = {word};")

    def packed_op(self, s: K.PackedOp, pad: str) -> None:
        assert s.op in K.PACKED_OPS, s
        kind = self._packed_kind(s.dst)
        assert self.packed[s.src] is self.packed[s.dst], s
        (n,) = self.dims[s.dst]
        assert self.dims[s.src][-1] == n and len(s.src_index) == len(self.dims[s.src]) - 1, s
        src = self._dst(s.src, s.src_index)
        for w in range(n // 2):
            self.lines.append(f"{pad}{s.dst}[{w}] = pf_{s.op}_x2_{kind}({s.dst}[{w}], {src}[{w}]);")

    def loop(self, s: K.Loop, ind: int) -> None:
        pad = "  " * ind
        note = f"  // {s.comment}" if s.comment else ""
        if s.kind in ("grid", "serial"):
            self.lines.append(f"{pad}for (nidx_t {s.var} = {self.e(s.start)}; {s.var} < {self.e(s.stop)}; "
                              f"{s.var} += {self.e(s.step)}) {{{note}")
        else:
            n = s.stop.value
            if n == 1:
                self.lines.append(f"{pad}{{ const int {s.var} = 0;{note}")
            else:
                self.lines.append(f"{pad}#pragma unroll")
                self.lines.append(f"{pad}for (int {s.var} = 0; {s.var} < {n}; ++{s.var}) {{{note}")
        self.emit(s.body, ind + 1)
        self.lines.append(f"{pad}}}")

    def _dst(self, name, index):
        return name + "".join(f"[{self.e(i)}]" for i in index)

    def _element(self, name, index) -> bool:
        """An access of one element named by the full index (not a row of `width` elements)."""
        return len(index) == len(self.dims.get(name, (None,)))

    def load(self, s: K.Load, pad: str) -> None:
        dst, off = self._dst(s.dst, s.index), self.e(s.offset)
        if s.async_copy:
            nbytes = s.width * self.dtypes[s.dst].itemsize
            assert s.stride is None and s.dst not in self.packed and nbytes in (4, 8, 16), s
            self.lines.append(f"{pad}pf_cp_async<{nbytes}>(&{dst}[0], {s.ptr} + {off});")
            return
        if s.dst in self.packed:
            assert s.stride is None and s.width == self.dims[s.dst][-1], s
            src = f"reinterpret_cast<const uint32_t*>({s.ptr} + {off})"
            self.lines.append(pad + (cached_load(s.cache, s.width // 2, dst, src) if s.cache
                                     else f"pf_ld<{s.width // 2}>({dst}, {src});"))
            return
        if self._element(s.dst, s.index):
            assert s.width == 1, "an element access has width 1"
            self.lines.append(pad + (cached_load(s.cache, 1, f"&{dst}", f"{s.ptr} + {off}")
                                     if s.cache else f"{dst} = {s.ptr}[{off}];"))
        elif s.stride is None and s.cache:
            self.lines.append(pad + cached_load(s.cache, s.width, dst, f"{s.ptr} + {off}"))
        elif s.stride is None and s.width > 1:
            self.lines.append(f"{pad}pf_ld<{s.width}>({dst}, {s.ptr} + {off});")
        elif s.stride is None:
            self.lines.append(f"{pad}{dst}[0] = {s.ptr}[{off}];")
        else:
            self.lines.append(f"{pad}#pragma unroll")
            self.lines.append(f"{pad}for (int l = 0; l < {s.width}; ++l) "
                              f"{dst}[l] = {s.ptr}[{off} + l * {self.e(s.stride)}];")

    def store(self, s: K.Store, pad: str) -> None:
        src, off = self._dst(s.src, s.index), self.e(s.offset)
        if self._element(s.src, s.index):
            assert s.width == 1, "an element access has width 1"
            self.lines.append(pad + (cached_store(s.cache, 1, f"{s.ptr} + {off}", f"&{src}")
                                     if s.cache else f"{s.ptr}[{off}] = {src};"))
        elif s.stride is None and s.cache:
            self.lines.append(pad + cached_store(s.cache, s.width, f"{s.ptr} + {off}", src))
        elif s.stride is None and s.width > 1:
            self.lines.append(f"{pad}pf_st<{s.width}>({s.ptr} + {off}, {src});")
        elif s.stride is None:
            self.lines.append(f"{pad}{s.ptr}[{off}] = {src}[0];")
        else:
            self.lines.append(f"{pad}#pragma unroll")
            self.lines.append(f"{pad}for (int l = 0; l < {s.width}; ++l) "
                              f"{s.ptr}[{off} + l * {self.e(s.stride)}] = {src}[l];")

    # ---- the function ---------------------------------------------------------------------
    def signature(self) -> str:
        parts = []
        for p in self.k.params:
            t = self.k.tensors.get(p.name)
            if t is not None:
                st = K.STORAGE_CTYPE[t.dtype]
                r = " __restrict__" if t.restrict else ""
                parts.append(f"{st}*{r} {p.name}" if t.is_output else f"const {st}*{r} {p.name}")
            else:
                parts.append(f"{'nidx_t' if p.ctype == self.k.index_type and p.source[0] in ('size', 'stride') else p.ctype} {p.name}")
        return ",\n    ".join(parts)

    def function(self) -> str:
        self.lines = []
        self.emit(self.k.body, 1)
        lb = f"{self.k.threads}, {self.k.min_blocks}" if self.k.min_blocks else f"{self.k.threads}"
        cluster = f" __cluster_dims__({self.k.cluster}, 1, 1)" if self.k.cluster > 1 else ""
        head = (f'extern "C" __global__ void __launch_bounds__({lb}){cluster} {self.k.name}(\n'
                f"    {self.signature()}) {{")
        dyn = ([f"  extern __shared__ __align__({ALIGN}) unsigned char pf_dyn_smem[];  "
                f"// {self.shared.total} bytes a block, passed at launch"]
               if self.shared.dynamic else [])
        return "\n".join([head, *dyn, *self.lines, "}"])


def _round(dst, a: str) -> str:
    """`a` (a float expression) rounded to half / bfloat16 `dst`, kept in a float register."""
    return f"pf_round_{'half' if dst is DataType.Half else 'bf16'}({a})"


def _cast(x: K.Convert, a: str) -> str:
    """`a` converted as eager converts between the register types of x.src and x.dst."""
    src_reg, dst_reg = K.REGISTER_CTYPE[x.src], K.REGISTER_CTYPE[x.dst]
    return a if src_reg == dst_reg else f"pf_cast<{dst_reg}>({a})"


def kernel_body(k: K.Kernel) -> str:
    """The kernel function alone (no prelude), with its index typedef in a namespace-free form."""
    return Printer(k).function()


def full_source(k: K.Kernel, header: str = "") -> str:
    from .prelude_random import PHILOX_CPP, needs_random
    body = kernel_body(k)
    typedef = f"typedef {k.index_type} nidx_t;\n"
    extra = PHILOX_CPP if needs_random(k) else ""
    return f"{header}{PRELUDE}{extra}\n{typedef}\n{body}\n"
