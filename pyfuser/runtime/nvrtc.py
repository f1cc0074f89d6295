"""NVRTC: CUDA C source -> CUBIN for one exact GPU architecture, with the on-disk cache in front.

`compile_cuda(source, name, arch=None, options=())` returns a `CompiledBinary` (the CUBIN, the
kernel's lowered name, the NVRTC log and the compile time). The cache key is sha256 of the source,
the arch, the complete option list and the NVRTC version, so a cached binary is only reused for the
exact same compilation (see disk_cache.py).

Invariants:
- Options always contain `-arch=sm_XY` (a CUBIN for that exact arch, no PTX), `--std=c++17` and
  `-default-device`, and `-minimal` where NVRTC has it (`lean_options`); never `-use_fast_math`
  (results must match eager's precise math).
- The kernel name is resolved through an NVRTC name expression, so `extern "C"` and C++-mangled
  kernels both work; `lowered_name` is what cuModuleGetFunction needs.
- A failed compile raises CompileError carrying the kernel's name and the full NVRTC log; with the
  `cuda_to_file` dump on, the source is written to the dump dir first.
- Works without a GPU (the arch then defaults to sm_90, or $PYFUSER_ARCH).
- Processes sharing a cache directory compile each kernel once: a miss takes the key's lock
  (disk_cache.key_lock), looks again, and only then compiles and stores; the others wait for the
  lock and load the entry (a waiter that times out compiles by itself).
- `stats` (per process): `nvrtc` kernels compiled here, `disk` kernels loaded from the disk
  cache, `waited_s` time spent waiting for other processes' compiles, `compile_time_s` NVRTC time
  (summed over threads).

Concurrent compiles: `compile_async(...)` returns a Future of `compile_cuda(...)` run on a pool
of `compile_threads()` threads (`$PYFUSER_COMPILE_THREADS`, default min(8, CPUs - 1), at least
1; 0: compiled at once in the caller, the Future already done). nvrtcCompileProgram releases
the GIL (checked by tests/cpu/test_compile_cache.py), so N threads compile N kernels at once
while the caller goes on planning. The same compilation asked for twice while in flight is one
Future. A process forked while the pool exists gets a new pool in the child (the parent's
threads are not in it). A compile error is raised by the Future's `result()`, where the kernel
is first needed. The threads are not daemons: a process exits after the compiles it started.
"""
from __future__ import annotations

import functools
import glob
import os
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from .. import dump as D
from ..errors import CompileError
from . import disk_cache

DEFAULT_ARCH = "sm_90"
stats = {"nvrtc": 0, "disk": 0, "waited_s": 0.0, "compile_time_s": 0.0}
_stats_lock = threading.Lock()
DEFAULT_MAX_THREADS = 8
BASE_OPTIONS = ("--std=c++17", "-default-device")
MINIMAL_SINCE = (12, 4)       # the first NVRTC with -minimal


@dataclass(frozen=True)
class CompiledBinary:
    name: str                 # the kernel's name in the source
    lowered_name: str         # the symbol to look up in the loaded module
    arch: str                 # e.g. "sm_90"
    cubin: bytes
    log: str                  # NVRTC's log (warnings), possibly empty
    compile_time_s: float     # NVRTC wall time; 0.0 when read from the disk cache
    key: str                  # the disk-cache key (sha256 hex)
    from_disk: bool = False


# ---- the NVRTC module ---------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _nvrtc():
    try:
        from cuda.bindings import nvrtc
    except ImportError:
        try:
            from cuda import nvrtc  # cuda-python < 12.6
        except ImportError as e:
            raise CompileError("NVRTC is unavailable: install cuda-bindings and nvidia-cuda-nvrtc "
                               f"(pip install 'pyfuser[cuda]'): {e}") from None
    return nvrtc


@functools.lru_cache(maxsize=None)
def nvrtc_version() -> tuple[int, int]:
    """NVRTC's (major, minor). Loading NVRTC to ask costs about 20 ms, which a process whose
    kernels all come from the disk cache need not pay: the answer is kept in the disk cache under
    the identity (path, size, mtime) of the NVRTC library of the pip wheel, where there is one."""
    ident = _library_identity() if disk_cache.enabled() else None
    key = disk_cache.make_key("nvrtc-version", ident) if ident is not None else None
    if key is not None:
        hit = disk_cache.load(key, "nvrtc-version")
        try:
            major, minor = (int(x) for x in hit.decode().split("."))
            return major, minor
        except (AttributeError, ValueError):
            pass
    nv = _nvrtc()
    err, major, minor = nv.nvrtcVersion()
    _check(err, "nvrtcVersion")
    if key is not None:
        disk_cache.store(key, f"{int(major)}.{int(minor)}".encode(), "nvrtc-version")
    return int(major), int(minor)


def kernel_entries(directory: str | None = None) -> int:
    """How many compiled kernels a disk-cache directory (default: the current one) holds: its
    entries but the NVRTC-version one (for tests and benchmarks of cache sharing)."""
    directory = directory or disk_cache.cache_dir()
    try:
        names = os.listdir(directory)
    except OSError:
        return 0
    ident = _library_identity()
    version = disk_cache.make_key("nvrtc-version", ident) + disk_cache.SUFFIX if ident else None
    return sum(1 for n in names if n.endswith(disk_cache.SUFFIX) and n != version)


def _library_identity():
    """(real path, size, mtime) of the libnvrtc of the nvidia pip wheel on sys.path (what
    cuda-bindings loads first), or None."""
    for p in sys.path:
        base = os.path.join(p, "nvidia")
        if not os.path.isdir(base):
            continue
        for pattern in ("cu*/lib/libnvrtc.so*", "cuda_nvrtc/lib/libnvrtc.so*"):
            for f in sorted(glob.glob(os.path.join(base, pattern))):
                if "builtins" in os.path.basename(f):
                    continue
                try:
                    st = os.stat(f)
                except OSError:
                    continue
                return os.path.realpath(f), st.st_size, st.st_mtime_ns
    return None


@functools.lru_cache(maxsize=None)
def _ok(err) -> bool:
    return int(err) == 0


def _check(err, call: str) -> None:
    if not _ok(err):
        raise CompileError(f"{call} failed: {err!r}")


# ---- arch and headers ---------------------------------------------------------------------------
def default_arch() -> str:
    """`$PYFUSER_ARCH`, else the current GPU's compute capability, else sm_90."""
    env = os.environ.get("PYFUSER_ARCH")
    if env:
        return env if env.startswith("sm_") else f"sm_{env}"
    return _device_arch()


@functools.lru_cache(maxsize=None)
def _device_arch() -> str:
    try:
        import torch
        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"sm_{major}{minor}"
    except Exception:  # noqa: BLE001 - any failure to query a GPU means "no GPU"
        pass
    return DEFAULT_ARCH


def _has_fp16(d: str) -> bool:
    return bool(d) and os.path.isfile(os.path.join(d, "cuda_fp16.h"))


def _candidate_include_dirs():
    """Directories that may hold the CUDA headers, most specific first, produced lazily: the
    first one that has them ends the search, so the slow probe (cuda-pathfinder runs a
    subprocess, about 0.1 s) only runs when no plain directory has them."""
    major = nvrtc_version()[0]
    yield os.environ.get("PYFUSER_CUDA_INCLUDE", "")
    # pip wheels: nvidia/cu13/include (CUDA 13 layout), nvidia/cuda_runtime/include (CUDA 12)
    for p in sys.path:
        base = os.path.join(p, "nvidia")
        if os.path.isdir(base):
            yield os.path.join(base, f"cu{major}", "include")
            yield os.path.join(base, "cuda_runtime", "include")
            yield os.path.join(base, "cuda_nvrtc", "include")
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"):
        if os.environ.get(var):
            yield os.path.join(os.environ[var], "include")
    yield f"/usr/local/cuda-{major}/include"
    yield from sorted(glob.glob(f"/usr/local/cuda-{major}.*/include"), reverse=True)
    try:  # cuda-pathfinder knows other wheels' layouts and toolkits
        from cuda import pathfinder
        yield pathfinder.find_nvidia_header_directory("cudart") or ""
    except Exception:  # noqa: BLE001 - optional helper, absent or failing on old installs
        pass
    yield "/usr/local/cuda/include"
    yield from sorted(glob.glob("/usr/local/cuda-*/include"), reverse=True)
    yield "/usr/include"


@functools.lru_cache(maxsize=None)
def include_options() -> tuple[str, ...]:
    """`-I` options for the CUDA headers (cuda_fp16.h, cuda_bf16.h) NVRTC does not bundle.

    The first directory holding cuda_fp16.h wins; one that matches NVRTC's major version is
    preferred (the pip wheel for this NVRTC, then the toolkit of that version). Empty if none is
    found: kernels that include no CUDA headers still compile.
    """
    for d in _candidate_include_dirs():
        if _has_fp16(d):
            opts = [f"-I{d}"]
            cccl = os.path.join(d, "cccl")
            if os.path.isdir(cccl):
                opts.append(f"-I{cccl}")
            return tuple(opts)
    return ()


@functools.lru_cache(maxsize=None)
def lean_options() -> tuple[str, ...]:
    """`-minimal` where NVRTC has it (12.4 and later): the front end then leaves out texture
    and surface functions, the device runtime and the runtime API's types, none of which a
    generated kernel uses. The same CUBINs, byte for byte (76 kernels of ResNet-18 and Llama
    compared), about 7% less NVRTC time (docs/compile_backend.md)."""
    try:
        return ("-minimal",) if nvrtc_version() >= MINIMAL_SINCE else ()
    except Exception:  # noqa: BLE001 - no NVRTC: compile_cuda reports it where it is needed
        return ()


def build_options(arch: str, options=()) -> tuple[str, ...]:
    opts = [f"-arch={arch}", *BASE_OPTIONS, *lean_options(), *include_options(), *options]
    bad = [o for o in opts if "fast-math" in o or "fast_math" in o]
    if bad:
        raise CompileError(f"fast-math options are not allowed: {bad}")
    return tuple(opts)


# ---- compilation --------------------------------------------------------------------------------
def compile_cuda(source: str, name: str, arch: str | None = None, options=(),
                 use_disk_cache: bool = True) -> CompiledBinary:
    """Compile `source` and return the CUBIN of kernel `name` (from the disk cache when there)."""
    arch = arch or default_arch()
    if D.is_enabled("ptxas_verbose"):
        options = tuple(options) + ("--ptxas-options=-v",)
    opts = build_options(arch, options)
    key = disk_cache.make_key(source, arch, opts, nvrtc_version(), name)
    if not use_disk_cache:
        return _compiled(_compile(source, name, arch, opts, key))
    hit = _from_disk(key, name, arch)
    if hit is not None:
        return hit
    with disk_cache.key_lock(key) as lock:
        _count("waited_s", lock.waited_s)
        # another process may have stored it since the miss (we waited for it, or it finished
        # just before we took the lock): look again before compiling
        hit = _from_disk(key, name, arch)
        if hit is not None:
            return hit
        binary = _compiled(_compile(source, name, arch, opts, key))
        disk_cache.store(key, binary.lowered_name.encode() + b"\0" + binary.cubin, name)
    return binary


def _from_disk(key: str, name: str, arch: str) -> CompiledBinary | None:
    hit = disk_cache.load(key, name)
    if hit is None:
        return None
    lowered, sep, cubin = hit.partition(b"\0")
    if not (sep and cubin):
        return None
    _count("disk", 1)
    return CompiledBinary(name, lowered.decode(), arch, cubin, "", 0.0, key, True)


def _compiled(binary: CompiledBinary) -> CompiledBinary:
    with _stats_lock:
        stats["nvrtc"] += 1
        stats["compile_time_s"] += binary.compile_time_s
    return binary


def _count(name: str, n) -> None:
    with _stats_lock:
        stats[name] += n


# ---- concurrent compiles ------------------------------------------------------------------------
_pool: dict = {}              # "pool" -> ThreadPoolExecutor, "pid" -> the process that made it
_pool_lock = threading.Lock()
_inflight: dict = {}          # (source, name, arch, options) -> Future, while compiling


def compile_threads() -> int:
    """Background threads compiling kernels: `$PYFUSER_COMPILE_THREADS` (0: none, each kernel
    compiled in the caller when asked for), default min(8, usable CPUs - 1), at least 1 (one
    CPU is left to the caller, which plans the next kernels meanwhile)."""
    raw = os.environ.get("PYFUSER_COMPILE_THREADS", "").strip()
    if raw:
        try:
            return max(0, int(raw))
        except ValueError:
            pass
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return max(1, min(DEFAULT_MAX_THREADS, cpus - 1))


def _executor(threads: int):
    with _pool_lock:
        pool = _pool.get("pool")
        if pool is None or _pool.get("pid") != os.getpid() or _pool.get("threads") != threads:
            old = pool if _pool.get("pid") == os.getpid() else None
            pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="pyfuser-nvrtc")
            _pool.update(pool=pool, pid=os.getpid(), threads=threads)
            _inflight.clear()
            if old is not None:
                old.shutdown(wait=False)
        return pool


def compile_async(source: str, name: str, arch: str | None = None, options=()) -> Future:
    """A Future of `compile_cuda(source, name, arch, options)` (see the module docstring)."""
    arch = arch or default_arch()
    threads = compile_threads()
    if threads < 1:
        return _done(lambda: compile_cuda(source, name, arch, options))
    nvrtc_version()                  # asked once, here, not by every thread at once
    include_options()
    key = (source, name, arch, tuple(options))
    with _pool_lock:
        fut = _inflight.get(key)
        if fut is not None and _pool.get("pid") == os.getpid():
            return fut
    try:
        fut = _executor(threads).submit(compile_cuda, source, name, arch, options)
    except RuntimeError:             # the interpreter is shutting down: compile here
        return _done(lambda: compile_cuda(source, name, arch, options))
    with _pool_lock:
        _inflight[key] = fut
    fut.add_done_callback(lambda f, key=key: _forget(key, f))
    return fut


def _forget(key, fut) -> None:
    with _pool_lock:
        if _inflight.get(key) is fut:
            del _inflight[key]


def _done(fn) -> Future:
    fut: Future = Future()
    try:
        fut.set_result(fn())
    except Exception as e:  # noqa: BLE001 - raised again by result(), where it is needed
        fut.set_exception(e)
    return fut


def _after_fork_in_child() -> None:
    """The parent's pool threads and lock holders do not exist in a forked child."""
    global _pool_lock, _stats_lock
    _pool_lock, _stats_lock = threading.Lock(), threading.Lock()
    _pool.clear()
    _inflight.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def wait_all() -> None:
    """Wait for every compile in flight (tests, benchmarks: nothing left running)."""
    with _pool_lock:
        futs = list(_inflight.values())
    for f in futs:
        try:
            f.result()
        except Exception:  # noqa: BLE001 - the kernel's user sees the error
            pass


def _compile(source: str, name: str, arch: str, opts: tuple[str, ...], key: str) -> CompiledBinary:
    nv = _nvrtc()
    path = write_source(source, name) if D.is_enabled("cuda_to_file") else ""
    t0 = time.perf_counter()
    err, prog = nv.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    _check(err, "nvrtcCreateProgram")
    try:
        (err,) = nv.nvrtcAddNameExpression(prog, name.encode())
        _check(err, "nvrtcAddNameExpression")
        bopts = [o.encode() for o in opts]
        (cerr,) = nv.nvrtcCompileProgram(prog, len(bopts), bopts)
        log = _log(nv, prog)
        if "--ptxas-options=-v" in opts:
            D.dump("ptxas_verbose", name, log)
        if not _ok(cerr):
            where = f"\nsource written to {path}" if path else ""
            raise CompileError(f"NVRTC failed to compile kernel {name!r} for {arch} "
                               f"({cerr!r}); options: {' '.join(opts)}\n{log}{where}")
        err, lowered = nv.nvrtcGetLoweredName(prog, name.encode())
        _check(err, "nvrtcGetLoweredName")
        err, size = nv.nvrtcGetCUBINSize(prog)
        _check(err, "nvrtcGetCUBINSize")
        if int(size) == 0:
            raise CompileError(f"NVRTC produced no CUBIN for kernel {name!r} (arch {arch}); "
                               f"the arch must be a real one (sm_XY), not compute_XY")
        buf = bytearray(int(size))
        (err,) = nv.nvrtcGetCUBIN(prog, buf)
        _check(err, "nvrtcGetCUBIN")
    finally:
        nv.nvrtcDestroyProgram(prog)
    elapsed = time.perf_counter() - t0
    lowered = lowered.decode() if isinstance(lowered, bytes) else str(lowered)
    return CompiledBinary(name, lowered, arch, bytes(buf), log, elapsed, key, False)


def _log(nv, prog) -> str:
    err, size = nv.nvrtcGetProgramLogSize(prog)
    if not _ok(err) or int(size) <= 1:
        return ""
    buf = bytearray(int(size))
    nv.nvrtcGetProgramLog(prog, buf)
    return bytes(buf).rstrip(b"\0").decode(errors="replace")


def write_source(source: str, name: str) -> str:
    """Write `source` to `<dump dir>/<name>.cu` (the `cuda_to_file` dump); returns the path."""
    d = D.dump_dir()
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, f"{name}.cu")
    with open(path, "w") as f:
        f.write(source)
    return path
