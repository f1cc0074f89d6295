"""Loading CUBINs into PyTorch's CUDA context and launching them on PyTorch's current stream.

`KernelLauncher(binary, packer)` wraps one compiled kernel. `launch(cfg, tensors, bindings,
device_index)` loads the module on that device the first time (cuModuleLoadData in the device's
primary context, which is the one PyTorch uses), raises the dynamic shared-memory limit when the
launch needs more than 48 KiB, packs the arguments and calls cuLaunchKernel on
`torch.cuda.current_stream(device)`.

Argument passing (`$PYFUSER_LAUNCH_MODE`, read when a launcher is made):
- "ptrs" (default): the packer writes all values into one preallocated C buffer with
  `struct.pack_into`; kernelParams is the address of a prebuilt `void*[]` pointing at each
  parameter's slot, so cuda-python converts nothing per call.
- "extra": the same buffer passed through `extra` = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf,
  CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END}; `size` is the kernel's parameter
  block (the end of the last parameter, `ParamPacker.args_size`), never the 8-padded buffer: a
  larger size fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ("too many arguments").
- "tuple": cuda-python's (values, ctypes types) form; slowest, simplest, kept for comparison.

Fast path: `prepare(cfg, device_index, tensors, bindings)` packs every value once into a buffer
of its own (a `Prepared`) and returns it; `launch_prepared(prep, ptrs)` then only writes the
tensor pointers (all other parameters are fixed by the executor's fast key) and launches.

Invariants:
- Every driver call's result is checked; a failure raises CudaDriverError naming the call.
- When a kernel is loaded, the packer's layout is checked against the kernel's own parameter
  list (cuFuncGetParamInfo, where the driver has it): same count, offsets and sizes, else a
  CudaDriverError says which parameter differs (no launch with a wrong layout).
- The launch runs with the device's primary context current; if the thread had another current
  context (another device, or none yet), it is pushed for the launch and popped after.
- One launcher may be used from several threads: the shared argument buffer is guarded by a lock
  (cuLaunchKernel copies the arguments before it returns).
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

from ..errors import PyfuserError
from .nvrtc import CompiledBinary
from .params import ParamPacker

LAUNCH_MODES = ("ptrs", "extra", "tuple")
_DEFAULT_SMEM = 48 * 1024


class CudaDriverError(PyfuserError):
    """A CUDA driver call failed; the message names the call and the driver's error."""


@functools.lru_cache(maxsize=None)
def driver():
    try:
        from cuda.bindings import driver as drv
    except ImportError:
        try:
            from cuda import cuda as drv  # cuda-python < 12.6
        except ImportError as e:
            raise CudaDriverError(f"cuda-bindings is not installed: {e}") from None
    return drv


def _fail(err, call: str):
    drv = driver()
    try:
        name = drv.cuGetErrorName(err)[1]
        text = drv.cuGetErrorString(err)[1]
        name = name.decode() if isinstance(name, bytes) else name
        text = text.decode() if isinstance(text, bytes) else text
    except Exception:  # noqa: BLE001 - best effort description
        name, text = repr(err), ""
    raise CudaDriverError(f"{call} failed: {name}: {text}")


def check(result, call: str):
    """Unpack a cuda-python result tuple (err, *values); raise on error; return the value(s)."""
    err = result[0]
    if int(err) != 0:
        _fail(err, call)
    if len(result) == 1:
        return None
    return result[1] if len(result) == 2 else result[1:]


# ---- contexts -----------------------------------------------------------------------------------
_contexts: dict[int, tuple[object, int]] = {}
_ctx_lock = threading.Lock()


def primary_context(device_index: int):
    """(CUcontext, its handle as int) of the device's primary context, which PyTorch uses."""
    hit = _contexts.get(device_index)
    if hit is not None:
        return hit
    with _ctx_lock:
        if device_index not in _contexts:
            import torch
            torch.cuda.init()
            # Make sure PyTorch has created (and owns) the primary context on this device.
            torch.empty(1, device=f"cuda:{device_index}")
            drv = driver()
            check(drv.cuInit(0), "cuInit")
            dev = check(drv.cuDeviceGet(device_index), "cuDeviceGet")
            ctx = check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _contexts[device_index] = (ctx, int(ctx))
    return _contexts[device_index]


class _Current:
    """Context manager: make `ctx` current for the block if it is not already."""
    __slots__ = ("ctx", "ctx_int", "pushed")

    def __init__(self, ctx, ctx_int):
        self.ctx, self.ctx_int, self.pushed = ctx, ctx_int, False

    def __enter__(self):
        drv = driver()
        cur = check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if cur is None or int(cur) != self.ctx_int:
            check(drv.cuCtxPushCurrent(self.ctx), "cuCtxPushCurrent")
            self.pushed = True
        return self

    def __exit__(self, *exc):
        if self.pushed:
            check(driver().cuCtxPopCurrent(), "cuCtxPopCurrent")


def _raw_stream_fn():
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda idx: torch.cuda.current_stream(idx).cuda_stream


# `extra` is a void** address (an int, 0 for none) in cuda-bindings 13; older releases took a
# list of ints or None. Both are detected on the first TypeError and remembered.
_extra_as_list = [False]
_NO_EXTRA = [0]


class KernelLauncher:
    def __init__(self, binary: CompiledBinary, packer: ParamPacker, mode: str | None = None):
        self.binary, self.packer = binary, packer
        self.mode = mode or os.environ.get("PYFUSER_LAUNCH_MODE", "ptrs")
        if self.mode not in LAUNCH_MODES:
            raise PyfuserError(f"PYFUSER_LAUNCH_MODE={self.mode!r}; expected one of {LAUNCH_MODES}")
        self._functions: dict[int, object] = {}
        self._modules: dict[int, object] = {}
        self._smem_limit: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stream = _raw_stream_fn()
        self._drv = driver()
        # The argument buffer and the pointer tables into it live as long as the launcher.
        self._buf = ctypes.create_string_buffer(max(packer.size, 8))
        base = ctypes.addressof(self._buf)
        n = len(packer.params)
        self._ptrs = (ctypes.c_void_p * max(n, 1))(*[base + o for o in packer.offsets])
        self._ptrs_addr = ctypes.addressof(self._ptrs) if n else 0
        self._size = ctypes.c_size_t(packer.args_size)
        self._extra = (ctypes.c_void_p * 5)(1, base, 2, ctypes.addressof(self._size), 0)
        self._extra_addr = ctypes.addressof(self._extra)
        self._extra_list = [1, base, 2, ctypes.addressof(self._size), 0]

    # ---- loading --------------------------------------------------------------------------
    def function(self, device_index: int):
        fn = self._functions.get(device_index)
        if fn is not None:
            return fn
        with self._lock:
            if device_index not in self._functions:
                ctx, ctx_int = primary_context(device_index)
                drv = driver()
                with _Current(ctx, ctx_int):
                    mod = check(drv.cuModuleLoadData(self.binary.cubin),
                                f"cuModuleLoadData({self.binary.name})")
                    fn = check(drv.cuModuleGetFunction(mod, self.binary.lowered_name.encode()),
                               f"cuModuleGetFunction({self.binary.lowered_name})")
                self._modules[device_index] = mod
                verify_layout(fn, self.packer, self.binary.name)
                self._functions[device_index] = fn
        return self._functions[device_index]

    def _ensure_smem(self, fn, device_index: int, smem: int) -> None:
        if smem <= max(_DEFAULT_SMEM, self._smem_limit.get(device_index, 0)):
            return
        drv = driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        check(drv.cuFuncSetAttribute(fn, attr, int(smem)),
              f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={smem}) for {self.binary.name}")
        self._smem_limit[device_index] = int(smem)

    # ---- launching ------------------------------------------------------------------------
    def launch(self, cfg, tensors, bindings, device_index: int) -> None:
        fn = self._functions.get(device_index)
        if fn is None:
            fn = self.function(device_index)
        smem = int(cfg.shared_mem)
        if smem > _DEFAULT_SMEM:
            self._ensure_smem(fn, device_index, smem)
        ctx, ctx_int = _contexts[device_index]
        stream = self._stream(device_index)
        gx, gy, gz = cfg.grid
        bx, by, bz = cfg.block
        drv = self._drv
        cur = drv.cuCtxGetCurrent()
        pushed = int(cur[0]) != 0 or int(cur[1]) != ctx_int
        if pushed:
            check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            if self.mode == "tuple":
                vals = self.packer.values(tensors, bindings)
                res = _launch_no_extra(drv, fn, gx, gy, gz, bx, by, bz, smem, stream,
                                       (vals, self.packer.ctypes))
            else:
                with self._lock:
                    self.packer.pack_into(self._buf, tensors, bindings)
                    if self.mode == "ptrs":
                        res = _launch_no_extra(drv, fn, gx, gy, gz, bx, by, bz, smem, stream,
                                               self._ptrs_addr)
                    else:
                        res = self._launch_extra(drv, fn, gx, gy, gz, bx, by, bz, smem, stream)
        finally:
            if pushed:
                check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")
        if int(res[0]) != 0:
            _fail(res[0], f"cuLaunchKernel({self.binary.name}, grid={cfg.grid}, "
                          f"block={cfg.block}, smem={smem})")

    # ---- the executor's fast path ------------------------------------------------------------
    def prepare(self, cfg, device_index: int, tensors, bindings) -> "Prepared":
        """A launch of `cfg` whose parameters are those of `tensors`/`bindings` except the tensor
        pointers, which `launch_prepared` writes. Values are checked (ExecuteError) here."""
        fn = self.function(device_index)
        smem = int(cfg.shared_mem)
        if smem > _DEFAULT_SMEM:
            self._ensure_smem(fn, device_index, smem)
        return Prepared(self, fn, cfg, smem, device_index, tensors, bindings)

    def launch_prepared(self, prep: "Prepared", ptrs) -> None:
        """Launch `prep` with tensor pointers `ptrs` (tensor inputs, then outputs)."""
        drv = self._drv
        stream = self._stream(prep.device_index)
        cur = drv.cuCtxGetCurrent()
        pushed = int(cur[0]) != 0 or int(cur[1]) != prep.ctx_int
        if pushed:
            check(drv.cuCtxPushCurrent(prep.ctx), "cuCtxPushCurrent")
        try:
            mode = self.mode
            if mode == "ptrs":
                with self._lock:
                    prep.write(prep.buf, ptrs)
                    res = _launch_no_extra(drv, prep.fn, *prep.dims, stream, prep.ptrs_addr)
            elif mode == "extra":
                with self._lock:
                    prep.write(prep.buf, ptrs)
                    res = self._launch_extra_with(drv, prep, stream)
            else:
                vals = list(prep.values)
                for k, i in prep.ptr_slots:
                    vals[k] = ptrs[i]
                res = _launch_no_extra(drv, prep.fn, *prep.dims, stream,
                                       (tuple(vals), self.packer.ctypes))
        finally:
            if pushed:
                check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")
        if int(res[0]) != 0:
            _fail(res[0], f"cuLaunchKernel({self.binary.name}, grid={prep.dims[:3]}, "
                          f"block={prep.dims[3:6]}, smem={prep.dims[6]})")

    def _launch_extra_with(self, drv, prep, stream):
        if not _extra_as_list[0]:
            try:
                return drv.cuLaunchKernel(prep.fn, *prep.dims, stream, None, prep.extra_addr)
            except TypeError:
                _extra_as_list[0] = True
        return drv.cuLaunchKernel(prep.fn, *prep.dims, stream, None, prep.extra_list)

    def _launch_extra(self, drv, fn, gx, gy, gz, bx, by, bz, smem, stream):
        if not _extra_as_list[0]:
            try:
                return drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, None,
                                          self._extra_addr)
            except TypeError:
                _extra_as_list[0] = True
        return drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, None,
                                  self._extra_list)


def _launch_no_extra(drv, fn, gx, gy, gz, bx, by, bz, smem, stream, params):
    try:
        return drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, _NO_EXTRA[0])
    except TypeError:
        if _NO_EXTRA[0] is None:
            raise
        _NO_EXTRA[0] = None
        return drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params, None)


class Prepared:
    """One launch configuration with its own argument buffer, constants packed in.

    `write(buf, ptrs)` (generated) packs the tensor pointers into their slots; runs of adjacent
    pointer parameters are one struct.pack_into each. `values` / `ptr_slots` serve "tuple" mode.
    """
    __slots__ = ("fn", "dims", "device_index", "ctx", "ctx_int", "buf", "ptrs_arr", "ptrs_addr",
                 "size", "extra", "extra_addr", "extra_list", "write", "values", "ptr_slots")

    def __init__(self, launcher, fn, cfg, smem, device_index, tensors, bindings):
        packer = launcher.packer
        self.fn, self.device_index = fn, device_index
        self.dims = (*(int(g) for g in cfg.grid), *(int(b) for b in cfg.block), smem)
        self.ctx, self.ctx_int = _contexts[device_index]
        self.buf = ctypes.create_string_buffer(max(packer.size, 8))
        packer.pack_into(self.buf, tensors, bindings)          # validates every value
        self.values = packer.values(tensors, bindings)
        base = ctypes.addressof(self.buf)
        n = len(packer.params)
        self.ptrs_arr = (ctypes.c_void_p * max(n, 1))(*[base + o for o in packer.offsets])
        self.ptrs_addr = ctypes.addressof(self.ptrs_arr) if n else 0
        self.size = ctypes.c_size_t(packer.args_size)
        self.extra = (ctypes.c_void_p * 5)(1, base, 2, ctypes.addressof(self.size), 0)
        self.extra_addr = ctypes.addressof(self.extra)
        self.extra_list = [1, base, 2, ctypes.addressof(self.size), 0]
        self.ptr_slots = [(k, int(p.source[1])) for k, p in enumerate(packer.params)
                          if p.source[0] == "ptr"]
        self.write = _pointer_writer(packer, self.ptr_slots)


def _pointer_writer(packer, ptr_slots):
    """Generate `write(buf, ptrs)`: struct.pack_into of each run of adjacent pointer params."""
    import struct
    runs, env = [], {}
    for k, i in ptr_slots:
        off = packer.offsets[k]
        if runs and runs[-1][0] + 8 * len(runs[-1][1]) == off:
            runs[-1][1].append(i)
        else:
            runs.append((off, [i]))
    lines = ["def write(buf, p):"]
    for r, (off, idx) in enumerate(runs):
        env[f"S{r}"] = struct.Struct("<" + "Q" * len(idx)).pack_into
        lines.append(f"    S{r}(buf, {off}, " + ", ".join(f"p[{i}]" for i in idx) + ")")
    if not runs:
        lines.append("    pass")
    exec(compile("\n".join(lines) + "\n", "<pyfuser pointer writer>", "exec"), env)  # noqa: S102
    return env["write"]


def verify_layout(fn, packer, name: str) -> None:
    """Check the packer's offsets/sizes against the loaded kernel's parameters (when the driver
    can tell: cuFuncGetParamInfo, CUDA 12.4+); raise CudaDriverError on any difference."""
    drv = driver()
    info = getattr(drv, "cuFuncGetParamInfo", None)
    if info is None:
        return
    got = []
    for k in range(len(packer.params) + 1):
        try:
            res = info(fn, k)
        except Exception:  # noqa: BLE001 - bindings without it or with another signature
            return
        if int(res[0]) != 0:
            if k == 0 and packer.params:
                return                      # the driver cannot tell (not supported): skip
            break
        got.append((int(res[1]), int(res[2])))
    want = list(zip(packer.offsets, packer.sizes))
    if got == want:
        return
    if len(got) != len(want):
        raise CudaDriverError(f"kernel {name} takes {len(got)} parameters {got} but pyfuser packs "
                              f"{len(want)} {want} (offset, size): {packer.describe()}")
    k = next(i for i, (g, w) in enumerate(zip(got, want)) if g != w)
    raise CudaDriverError(f"kernel {name}: parameter {k} ({packer.params[k].name}) is at offset "
                          f"{got[k][0]}, size {got[k][1]} in the kernel but pyfuser packs it at "
                          f"offset {want[k][0]}, size {want[k][1]}: {packer.describe()}")
