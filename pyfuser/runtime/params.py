"""Kernel argument packing: a GeneratedKernel's Params -> the bytes cuLaunchKernel passes.

`ParamPacker(params)` is built once per kernel. It precomputes
- the C layout of the parameters (each aligned to its size, as the CUDA ABI lays out kernel
  parameters) as one `struct.Struct` with explicit padding (`fmt`, `offsets`, `size`),
- a generated Python function `values(tensors, bindings) -> tuple` that reads every parameter's
  value in order with no per-call interpretation of Param sources (a kernel that draws random
  numbers takes its seed and offset from runtime/rng.py, once per call: `has_philox`),
- the ctypes types of the parameters (for cuda-python's (values, types) launch form).

`tensors` are the segment tensors: tensor inputs in fusion.inputs order, then outputs.

Invariants:
- No silent narrowing: a value that does not fit its C type (e.g. an int32 index parameter given
  a size >= 2^31) raises ExecuteError naming the parameter, never wraps.
- The packed buffer layout equals what nvcc/NVRTC expects for `__global__ void k(<params>)`:
  `offsets` and `sizes` are checked against the loaded kernel (cuFuncGetParamInfo) by the
  launcher, and `args_size` (no tail padding) is the parameter block's size.
"""
from __future__ import annotations

import ctypes
import struct

from ..codegen.kernel import CTYPES, Param
from ..errors import ExecuteError

CTYPES_CTYPES = {
    "void*": ctypes.c_void_p, "int64_t": ctypes.c_int64, "int": ctypes.c_int32,
    "uint32_t": ctypes.c_uint32, "float": ctypes.c_float, "double": ctypes.c_double,
    "bool": ctypes.c_bool,
}
_CONVERT = {"void*": "int", "int64_t": "int", "int": "int", "uint32_t": "int",
            "float": "float", "double": "float", "bool": "bool"}


def c_layout(ctypes_list) -> tuple[str, list[int], int]:
    """(struct format with padding, offset of each param, total size padded to 8).

    The padded size is the buffer to allocate; what the kernel's parameter block holds (and what
    CU_LAUNCH_PARAM_BUFFER_SIZE must say) ends at the last parameter: see `args_size`."""
    fmt, offsets, off = ["<"], [], 0
    for ct in ctypes_list:
        if ct not in CTYPES:
            raise ExecuteError(f"kernel parameter C type {ct!r} is not one of {sorted(CTYPES)}")
        ch, size = CTYPES[ct]
        pad = (-off) % size
        if pad:
            fmt.append(f"{pad}x")
            off += pad
        offsets.append(off)
        fmt.append(ch)
        off += size
    tail = (-off) % 8
    if tail:
        fmt.append(f"{tail}x")
        off += tail
    return "".join(fmt), offsets, off


class ParamPacker:
    def __init__(self, params: list[Param]):
        self.params = list(params)
        self.fmt, self.offsets, self.size = c_layout([p.ctype for p in self.params])
        # End of the last parameter: the size of the kernel's parameter block. The driver rejects
        # an `extra` buffer that claims more (CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: "too many
        # arguments"), e.g. 40 for (4 pointers, int), whose block is 36 bytes.
        self.args_size = (self.offsets[-1] + CTYPES[self.params[-1].ctype][1]) if self.params else 0
        self.sizes = [CTYPES[p.ctype][1] for p in self.params]
        self.struct = struct.Struct(self.fmt)
        self.ctypes = tuple(CTYPES_CTYPES[p.ctype] for p in self.params)
        self.has_philox = any(p.source[0] == "philox" for p in self.params)
        self.values = self._build_getter()
        # the values with seed and offset 0, drawing nothing: what a prepared launch packs once
        # (it draws its own per launch)
        self.values_undrawn = self._build_getter(draw=False) if self.has_philox else self.values

    def _build_getter(self, draw: bool = True):
        """Generate `def values(t, b): return (...)` over the Param sources."""
        env, items = {"int": int, "float": float, "bool": bool}, []
        drawing, draw = draw, ""
        for k, p in enumerate(self.params):
            src = p.source
            kind = src[0]
            if kind == "philox":
                # the launch's seed and offset, drawn once per call, and the device words the
                # kernel adds to them (runtime/rng.py; after the draw, which may make them)
                if not drawing:
                    draw = "    R = (0, 0)\n"
                elif not draw:
                    from . import rng
                    env.update(_draw=rng.launch_state, _dev=rng.device_of, _sp=rng.state_ptr)
                    inc = next(q.source[2] for q in self.params
                               if q.source[0] == "philox" and q.source[1] == "offset")
                    draw = f"    R = _draw(_dev(t), {int(inc)})\n"
                items.append({"seed": "R[0]", "offset": "R[1]"}.get(
                    src[1], "_sp(_dev(t))" if drawing else "0"))
                continue
            if kind == "ptr":
                expr = f"t[{int(src[1])}].data_ptr()"
            elif kind == "stride":
                expr = f"t[{int(src[1])}].stride({int(src[2])})"
            elif kind == "size":
                expr = f"t[{int(src[1])}].size({int(src[2])})"
            elif kind == "numel":
                expr = f"t[{int(src[1])}].numel()"
            elif kind == "scalar":
                s = src[1]
                if getattr(s, "is_const", False):
                    env[f"c{k}"] = s.value
                    expr = f"c{k}"
                else:
                    env[f"s{k}"] = s
                    expr = f"b[s{k}]"
            else:
                raise ExecuteError(f"kernel parameter {p.name!r} has an unknown source {src!r}")
            conv = _CONVERT[p.ctype]
            # data_ptr/stride/size/numel are ints already; only scalars need converting.
            items.append(expr if kind != "scalar" else f"{conv}({expr})")
        body = "def values(t, b):\n" + draw + "    return (" + "".join(f"{e}, " for e in items) + ")\n"
        exec(compile(body, "<pyfuser packer>", "exec"), env)  # noqa: S102 - generated from Params
        return env["values"]

    # ---- packing (the launch paths call these) --------------------------------------------
    def pack(self, tensors, bindings) -> bytes:
        vals = self.values(tensors, bindings)
        try:
            return self.struct.pack(*vals)
        except (struct.error, OverflowError):
            self._explain(vals)
            raise

    def checked_values(self, tensors, bindings) -> tuple:
        """The parameter values of one launch, each checked to fit its C type (ExecuteError)."""
        vals = self.values(tensors, bindings)
        try:
            self.struct.pack(*vals)
        except (struct.error, OverflowError):
            self._explain(vals)
            raise
        return vals

    def pack_into(self, buf, tensors, bindings, offset: int = 0) -> None:
        self.pack_values_into(buf, self.values(tensors, bindings), offset)

    def pack_values_into(self, buf, vals, offset: int = 0) -> None:
        try:
            self.struct.pack_into(buf, offset, *vals)
        except (struct.error, OverflowError):
            self._explain(vals)
            raise

    def _explain(self, vals) -> None:
        for p, v in zip(self.params, vals):
            ch = CTYPES[p.ctype][0]
            try:
                struct.pack("<" + ch, v)
            except (struct.error, OverflowError) as e:
                raise ExecuteError(f"kernel parameter {p.name!r} ({p.ctype}, from {p.source[:1]}) "
                                   f"cannot hold the value {v!r}: {e}") from None

    def describe(self) -> str:
        rows = [f"{p.name}: {p.ctype} @ {o}  <- {p.source}" for p, o in zip(self.params, self.offsets)]
        return f"struct '{self.fmt}' size {self.size}\n  " + "\n  ".join(rows)
