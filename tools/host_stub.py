"""Host time of pyfuser's call paths on a machine without a GPU: libcuda replaced by a C stub.

    PYTHONPATH=. python tools/host_stub.py [--repeat N]

A tiny C library with libcuda's launch and context entry points (each returns CUDA_SUCCESS and
does nothing) is compiled with the system's C compiler into a temporary directory and loaded as
the raw driver (runtime/driver.RawDriver), so every call path runs its production code down to
the driver call: `fs.execute` (Python, native runner), `pyfuser.jit` (call plans) and the
per-call parts alone. CPU tensors pose as CUDA ones (as tests/cpu/fake_cuda.py does); kernels
are compiled with NVRTC as usual but never run. The numbers are host time per call (median of
N calls in rounds), for comparing paths on one machine: a GPU host adds the driver's own launch
cost (about 4 us per kernel) and runs Python at its own speed.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch

_STUB = r"""
typedef int CUresult;
CUresult cuLaunchKernelEx(const void* cfg, void* f, void** params, void** extra) { return 0; }
CUresult cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                        unsigned by, unsigned bz, unsigned smem, void* s, void** p, void** e)
{ return 0; }
CUresult cuCtxGetCurrent(void** ctx) { *ctx = (void*)1234; return 0; }
CUresult cuCtxPushCurrent_v2(void* ctx) { return 0; }
CUresult cuCtxPopCurrent_v2(void** ctx) { return 0; }
"""


def stub_library() -> str:
    d = tempfile.mkdtemp(prefix="pyfuser_stub_")
    src, lib = os.path.join(d, "stub.c"), os.path.join(d, "libcuda_stub.so")
    with open(src, "w") as f:
        f.write(_STUB)
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", lib, src], check=True)
    return lib


def install(lib: str) -> None:
    """Patch pyfuser's driver access (not torch) so that CPU tensors run the CUDA paths."""
    from pyfuser.runtime import driver as D, executor as X

    class Drv:
        CUfunction_attribute = None

        def cuCtxGetCurrent(self):
            return (0, 1234)

        def cuModuleLoadData(self, cubin):
            return (0, "module")

        def cuModuleGetFunction(self, mod, name):
            return (0, 0x5000)

        def cuFuncGetParamInfo(self, fn, k):
            return (801, 0, 0)

    raw = D.RawDriver(ctypes.CDLL(lib))
    D.raw_driver = lambda: raw
    drv = Drv()
    D.driver = lambda: drv
    D.primary_context = lambda i: ("ctx", 1234)
    D._contexts[None] = D._contexts[-1] = ("ctx", 1234)
    D._raw_stream_fn = lambda: (lambda idx: 777)
    torch._C._cuda_getCurrentRawStream = lambda idx: 777
    X.FusionExecutor._check_devices = lambda self, inputs: None
    torch.Tensor.is_cuda = property(lambda self: True)


def per_call(fn, repeat: int, rounds: int = 7) -> float:
    """Median over rounds of the mean time of `repeat` calls, in microseconds."""
    for _ in range(max(100, repeat // 10)):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(repeat):
            fn()
        times.append((time.perf_counter() - t0) / repeat * 1e6)
    return statistics.median(times)


def _fd():
    from pyfuser import FusionDefinition, DataType
    with FusionDefinition() as fd:
        t = [fd.define_tensor(symbolic_sizes=[-1], contiguous=[True], dtype=DataType.Float)
             for _ in range(3)]
        fd.add_output(fd.ops.mul(fd.ops.add(t[0], t[1]), t[2]))
    return fd


def three_input(a, b, c):
    return (a + b) * c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=20000)
    args = ap.parse_args(argv)
    os.environ.setdefault("PYFUSER_CACHE_DIR", tempfile.mkdtemp(prefix="pyfuser_cache_"))
    install(stub_library())
    import pyfuser
    from pyfuser.runtime import dispatch, native
    if native.build() is None:
        print("the native runner could not be built: its rows measure the Python path")
    xs = [torch.randn(1000) for _ in range(3)]
    rows = []
    for native in ("0", "1"):
        os.environ["PYFUSER_NATIVE"] = native
        dispatch.clear_caches()
        fd = _fd()
        fd.execute(xs)
        fd.execute(xs)
        rows.append((f"fs.execute, native runner {'on' if native == '1' else 'off'}",
                     per_call(lambda: fd.execute(xs), args.repeat)))
    for native in ("0", "1"):
        os.environ["PYFUSER_NATIVE"] = native
        dispatch.clear_caches()
        f = pyfuser.jit(torch.jit.script(three_input))
        with torch.no_grad():
            f(*xs)
            f(*xs)
            rows.append((f"pyfuser.jit (a + b) * c, native runner {'on' if native == '1' else 'off'}",
                         per_call(lambda: f(*xs), args.repeat)))
    rows.append(("bare stub cuLaunchKernelEx via ctypes",
                 per_call(_bare_launch(), args.repeat)))
    rows.append(("torch.empty_strided((1000,), (1,))",
                 per_call(lambda: torch.empty_strided((1000,), (1,)), args.repeat)))
    width = max(len(r[0]) for r in rows)
    for name, us in rows:
        print(f"{name:<{width}}  {us:7.2f} us")
    return 0


def _bare_launch():
    import functools
    from pyfuser.runtime import driver as D
    raw = D.raw_driver()
    buf = ctypes.create_string_buffer(64)
    V = ctypes.c_void_p
    return functools.partial(raw.launch_ex, V(ctypes.addressof(buf)), V(1), V(0), None)


if __name__ == "__main__":
    sys.exit(main())
