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
  CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END}.
- "tuple": cuda-python's (values, ctypes types) form; slowest, simplest, kept for comparison.

Invariants:
- Every driver call's result is checked; a failure raises CudaDriverError naming the call.
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
        self._size = ctypes.c_size_t(packer.size)
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
