"""CUDA driver plumbing shared by the launcher: the cuda-bindings module, result checking, the
devices' primary contexts, libcuda's per-launch entry points through ctypes, and the check of a
loaded kernel's parameter layout.

`driver()` is cuda-bindings' driver module (CudaDriverError when it is not installed);
`raw_driver()` is libcuda itself through ctypes (`RawDriver`: cuLaunchKernelEx / cuLaunchKernel
and the context calls), what the launcher's "ctypes" mode calls per launch. `check(result, call)`
unpacks a cuda-bindings result tuple; `_fail(err, call)` raises for a CUresult (or its int from a
ctypes call). `primary_context(i)` retains (once, cached in `_contexts`) device i's primary
context, the one PyTorch uses; `_Current` / `_with_context` make it current around a block or a
launch. `verify_layout(fn, packer, name)` compares a ParamPacker's layout with the kernel's own.

Invariants:
- Every driver call's result is checked; a failure raises CudaDriverError naming the call.
- When a kernel is loaded, the packer's layout is checked against the kernel's own parameter
  list (cuFuncGetParamInfo, where the driver has it): same count, offsets and sizes, else a
  CudaDriverError says which parameter differs (no launch with a wrong layout).
- A context is pushed only when the thread's current one is not the device's primary context
  (another device's, or none), and popped after.
- Functions here call each other through this module's globals, and launch.py reaches them as
  `D.<name>` (`from . import driver as D`): each name has one patch point, here (tests replace
  `driver`, `raw_driver`, `primary_context`, `_raw_stream_fn` and `_contexts` on this module).
"""
from __future__ import annotations

import ctypes
import functools
import os
import threading

from ..errors import PyfuserError


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
    """Raise CudaDriverError for `err` (a CUresult, or its int from a ctypes call)."""
    drv = driver()
    try:
        if isinstance(err, int) and hasattr(drv, "CUresult"):
            err = drv.CUresult(err)
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


# ---- libcuda through ctypes ("ctypes" mode) ------------------------------------------------------
class RawDriver:
    """libcuda's per-launch entry points through ctypes (what `raw_driver()` returns).

    launch_ex(config, f, params, extra) -> CUresult: cuLaunchKernelEx with no argtypes, so it is
        called with prebuilt ctypes objects only (c_void_p); None where the driver lacks it.
    launch(f, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> CUresult: cuLaunchKernel
        (argtypes set: plain ints).
    get_current(address of a CUcontext cell), push(ctx), pop(address of a cell) -> CUresult.
    addresses() -> the C entry points the native runner calls, or None.
    Tests stand in for libcuda with any object that has these five attributes (and `addresses`
    for the native runner).
    """

    def __init__(self, lib):
        V, U, R = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int

        def sym(argtypes, *names):
            for n in names:
                f = getattr(lib, n, None)
                if f is not None:
                    f.restype = R
                    if argtypes is not None:
                        f.argtypes = argtypes
                    return f
            return None

        self.launch_ex = sym(None, "cuLaunchKernelEx")
        self.launch = sym([V, U, U, U, U, U, U, U, V, V, V], "cuLaunchKernel")
        self.get_current = sym([V], "cuCtxGetCurrent")
        self.push = sym([V], "cuCtxPushCurrent_v2", "cuCtxPushCurrent")
        self.pop = sym([V], "cuCtxPopCurrent_v2", "cuCtxPopCurrent")
        missing = [n for n in ("launch", "get_current", "push", "pop") if getattr(self, n) is None]
        if missing:
            raise CudaDriverError(f"libcuda lacks {missing}")

    def addresses(self):
        """(cuLaunchKernelEx, cuCtxGetCurrent, cuCtxPushCurrent, cuCtxPopCurrent) as ints, for
        the native runner; None when the driver has no cuLaunchKernelEx."""
        if self.launch_ex is None:
            return None
        return tuple(ctypes.cast(f, ctypes.c_void_p).value
                     for f in (self.launch_ex, self.get_current, self.push, self.pop))


@functools.lru_cache(maxsize=None)
def raw_driver() -> RawDriver:
    """libcuda loaded through ctypes (the library cuda-bindings uses); CudaDriverError if absent."""
    err = None
    for name in (("libcuda.so.1", "libcuda.so") if os.name == "posix" else ("nvcuda.dll",)):
        try:
            return RawDriver(ctypes.CDLL(name))
        except OSError as e:
            err = e
    raise CudaDriverError(f"libcuda cannot be loaded through ctypes: {err}")


def _check_raw(code: int, call: str) -> None:
    if code:
        _fail(code, call)


def _with_context(raw, ctx_int: int, launch):
    """launch() -> CUresult with the primary context `ctx_int` current: pushed and popped when
    the thread has another current context (or none)."""
    cell = ctypes.c_void_p()
    _check_raw(raw.get_current(ctypes.addressof(cell)), "cuCtxGetCurrent")
    if (cell.value or 0) == ctx_int:
        return launch()
    _check_raw(raw.push(ctx_int), "cuCtxPushCurrent")
    try:
        return launch()
    finally:
        _check_raw(raw.pop(ctypes.addressof(cell)), "cuCtxPopCurrent")


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
