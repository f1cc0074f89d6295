"""Process bodies for tests/cpu/test_cache_sharing.py (spawned processes import them by name).

Each worker points `PYFUSER_CACHE_DIR` at the shared directory it is given before it touches
pyfuser, waits on a barrier so that all start compiling at once, and reports what it did as
plain data (counters, results) through a queue: the test process asserts on it.
"""
from __future__ import annotations

import os
import time
import traceback


def _setup(cache: str | None) -> None:
    if cache is None:
        os.environ["PYFUSER_DISABLE_DISK_CACHE"] = "1"
    else:
        os.environ["PYFUSER_CACHE_DIR"] = cache
        os.environ.pop("PYFUSER_DISABLE_DISK_CACHE", None)
    os.environ.pop("PYFUSER_ARCH", None)


def kernel_source(i: int) -> tuple[str, str]:
    """(source, name) of a small distinct kernel number i."""
    name = f"pf_share_{i}"
    src = (f'extern "C" __global__ void {name}(const float* a, float* out, long long n) {{\n'
           f'  long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;\n'
           f'  if (j < n) out[j] = a[j] * {i + 2}.0f + {i}.0f;\n}}\n')
    return src, name


def compile_sources(cache, count, barrier, queue, wid) -> None:
    """Compile kernels 0..count-1 through nvrtc.compile_cuda (the disk cache in front)."""
    try:
        _setup(cache)
        from pyfuser.runtime import disk_cache, nvrtc
        nvrtc.nvrtc_version()              # load NVRTC before the race, as a warm process would
        barrier.wait()
        cubins = {}
        for i in range(count):
            src, name = kernel_source(i)
            b = nvrtc.compile_cuda(src, name, arch="sm_90")
            cubins[name] = b.cubin
        queue.put((wid, {"nvrtc": nvrtc.stats["nvrtc"], "disk": nvrtc.stats["disk"],
                         "lock_waits": disk_cache.stats["lock_waits"],
                         "lock_timeouts": disk_cache.stats["lock_timeouts"],
                         "cubins": cubins}))
    except BaseException:  # noqa: BLE001 - reported to the test, which fails with it
        queue.put((wid, {"error": traceback.format_exc()}))


def fused_programs():
    """Scripted functions the fuser makes kernels of (pointwise, RMS norm, layer norm + GELU)."""
    import torch

    def pointwise(a, b):
        return torch.sigmoid(a * 2.0 + b) - b

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w

    def ln_gelu(x, r, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.layer_norm(x + r, (x.shape[-1],), w, b))

    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(16, 32, generator=g), torch.randn(16, 32, generator=g)
    w, b = torch.randn(32, generator=g), torch.randn(32, generator=g)
    return [(pointwise, (x, y)), (rms, (x, w)), (ln_gelu, (x, y, w, b))]


def run_fusions(cache, barrier, queue, wid, device="cpu") -> None:
    """pyfuser.jit of `fused_programs()` on `device` (on the CPU: the kernel interpreter; NVRTC
    compiles every kernel either way); reports whether each matches eager and the compile
    counters."""
    try:
        _setup(cache)
        import torch

        import pyfuser
        from pyfuser.runtime import disk_cache, nvrtc
        programs = [(pyfuser.jit(torch.jit.script(f)), f, [a.to(device) for a in args])
                    for f, args in fused_programs()]
        nvrtc.nvrtc_version()
        barrier.wait()
        t0 = time.perf_counter()
        kernels, errors = 0, []
        with torch.no_grad():
            for fused, f, args in programs:
                got, want = fused(*args), f(*args)
                kernels += fused.last_run.kernels
                if got.shape != want.shape or got.dtype != want.dtype or \
                        got.device != want.device or \
                        not torch.allclose(got, want, rtol=1e-5, atol=1e-5):
                    errors.append(f.__name__)
        queue.put((wid, {"nvrtc": nvrtc.stats["nvrtc"], "disk": nvrtc.stats["disk"],
                         "kernels": kernels, "errors": errors,
                         "lock_waits": disk_cache.stats["lock_waits"],
                         "lock_timeouts": disk_cache.stats["lock_timeouts"],
                         "seconds": time.perf_counter() - t0}))
    except BaseException:  # noqa: BLE001
        queue.put((wid, {"error": traceback.format_exc()}))


def hold_lock(cache, key, ready, release, queue) -> None:
    """Take `key`'s lock, say so, and hold it until `release` is set (or the process is killed)."""
    try:
        _setup(cache)
        from pyfuser.runtime import disk_cache
        with disk_cache.key_lock(key) as lock:
            queue.put(("held", lock.held))
            ready.set()
            release.wait(60)
        queue.put(("released", True))
    except BaseException:  # noqa: BLE001
        queue.put(("error", traceback.format_exc()))
        ready.set()


def count_under_lock(cache, key, counter_path, barrier, queue, wid) -> None:
    """Read-modify-write a counter file under `key`'s lock, slowly: overlapping holders would
    lose updates (and overlapping intervals show in the reported times)."""
    try:
        _setup(cache)
        from pyfuser.runtime import disk_cache
        barrier.wait()
        spans = []
        for _ in range(3):
            with disk_cache.key_lock(key, timeout=60) as lock:
                t0 = time.monotonic()
                assert lock.held, "lock not taken"
                with open(counter_path) as f:
                    n = int(f.read())
                time.sleep(0.01)
                with open(counter_path, "w") as f:
                    f.write(str(n + 1))
                spans.append((t0, time.monotonic()))
        queue.put((wid, {"spans": spans}))
    except BaseException:  # noqa: BLE001
        queue.put((wid, {"error": traceback.format_exc()}))
