"""The native cached-call runner (csrc/fast_runner.cpp): building it, and programs for it.

dispatch.py records, per Fusion and input key, a program that replays a cached call (kernel
outputs allocated, host views taken, kernels launched). Where this module's extension is
available, each such program is also handed to a native `Runner` (C++), whose `run(inputs)` is
then what `fs.execute(inputs)` calls: key, lookup, allocation, pointer writes and
cuLaunchKernelEx with no Python frame; a miss falls through to the Python path.

- `$PYFUSER_NATIVE`: "0" / "off" / "false" turn the native runner off (the Python path is the
  same calls, slower); anything else, or unset, uses it where it is built.
- It is built once, at install time: `python -m pyfuser.runtime.native` (what `make setup`
  runs; torch.utils.cpp_extension with the system's C++ compiler and ninja, about 15-60 s per
  machine, torch version and source). It is an install artifact, not a cache entry, so its
  place does not follow `$PYFUSER_CACHE_DIR` (a fresh kernel cache must not silently turn the
  runner off): `$PYFUSER_NATIVE_DIR` when set, else `_native/` beside this module when that is
  writable, else `~/.cache/pyfuser/native/`; a build found in any of those (or, as before, under
  `$PYFUSER_CACHE_DIR/native/`) is used. `runner_module()` only loads a build that is there
  (about 0.05 s, the first time a program is recorded for CUDA tensors): nothing is compiled on
  a user's call. Without a build, one INFO line says how to make it and the Python path runs
  (the same calls, a few microseconds slower per call). `build()` builds (or loads) it
  explicitly; processes that ask at once (DDP ranks, test shards) take turns on a lock file
  beside the build directory, so one builds and the others load its build.
- The extension also serves the CUDA-graph calls (frontend/fx/cuda_graphs*.py): `graph_key`
  (a call's signature in one C++ pass over its arguments, as bytes), `hand_out` (a replay's
  saved tensors and gradients built on the graph's storages in one call) and `use_counts` (the
  held storages' use counts, the check before a replay); without a build they run in Python.
- `launch_step(launcher, prep, ptr_slots)` turns an executor's prepared launch (launch.Prepared)
  into the runner's plain data: the prepared buffer (CUlaunchConfig then the packed
  parameters), the parameter offsets and, per tensor pointer, its byte offset and slot
  (dispatch._native_program assembles the whole program).

Invariants: a program is handed to the runner only when every launch in it is a "ctypes"-mode
Prepared whose driver has cuLaunchKernelEx (the runner calls that entry point); switching a
launcher's mode clears the runners that replay it (launch.Prepared.listeners). The runner's key
fixes the same things as call_keys.key_function's key, so a native hit is a Python hit.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.machinery
import importlib.util
import logging
import os
import shutil
import sys

from . import driver as D

log = logging.getLogger("pyfuser")
_SOURCE = os.path.join(os.path.dirname(__file__), "csrc", "fast_runner.cpp")
_OFF = ("0", "off", "false", "no")


def enabled() -> bool:
    return os.environ.get("PYFUSER_NATIVE", "1").strip().lower() not in _OFF


def _name() -> str:
    import torch
    with open(_SOURCE, "rb") as f:
        src = f.read()
    tag = hashlib.sha256(src + torch.__version__.encode() + sys.version.encode()).hexdigest()[:16]
    return f"pyfuser_native_{tag}"


def _places() -> list:
    """The directories a build may live in, the one a new build goes to first."""
    from .disk_cache import cache_dir
    env = os.environ.get("PYFUSER_NATIVE_DIR")
    if env:
        return [os.path.expanduser(env)]
    beside = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_native")
    home = os.path.join(os.path.expanduser("~"), ".cache", "pyfuser", "native")
    places = [beside, home, os.path.join(cache_dir(), "native")]
    if not _writable(beside):
        places.remove(beside)
        places.append(beside)
    return list(dict.fromkeys(places))


def _writable(directory: str) -> bool:
    """Whether `directory` exists writable, or can be made in a writable parent."""
    d = directory
    while not os.path.exists(d):
        parent = os.path.dirname(d)
        if parent == d:
            return False
        d = parent
    return os.access(d, os.W_OK)


def _so(directory: str) -> str:
    return os.path.join(directory, os.path.basename(directory) + ".so")


def build_dir() -> str:
    """Where this source's build is (the first place holding one), else where one is built."""
    dirs = [os.path.join(p, _name()) for p in _places()]
    return next((d for d in dirs if os.path.exists(_so(d))), dirs[0])


@functools.lru_cache(maxsize=None)
def _load():
    """The extension module, built here if it is not yet (one per process: the first
    build_dir() asked for is the one used); None (logged) when it cannot be built or loaded."""
    return build_or_import(build_dir(), _SOURCE)


def build():
    """Build the native runner (or load the build that is there); the module, or None."""
    return _load()


def built() -> bool:
    """Whether a build for this source, torch and Python is on disk (or loaded)."""
    if _load.cache_info().currsize:
        return _load() is not None
    return os.path.exists(_so(build_dir()))


_told = [False]


def build_or_import(directory: str, source: str):
    """Import the extension built from `source` in `directory` (named after the directory),
    building it there first if it is not (or is damaged); None, with a warning naming the first
    compiler error (else the exception's last line), when that fails."""
    name = os.path.basename(directory)
    path = _so(directory)
    try:
        os.makedirs(os.path.dirname(directory) or ".", exist_ok=True)
        with open(directory + ".lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)     # one process builds; the others wait, then load
            return _build_or_import_locked(name, directory, source, path)
    except Exception as e:  # noqa: BLE001 - any build failure means "use the Python path"
        lines = [x.strip() for x in str(e).splitlines() if x.strip()]
        detail = next((x for x in lines if "error:" in x), lines[-1] if lines else "")
        log.warning("pyfuser: the native runner is unavailable, cached calls run in Python: "
                    "%s: %s", type(e).__name__, detail)
        return None


def _build_or_import_locked(name: str, directory: str, source: str, path: str):
    """build_or_import's work, under the build directory's lock (so no process reads a .so
    another is still linking, or removes one another has just loaded)."""
    if os.path.exists(path):
        try:
            return _import(name, path)
        except ImportError as e:                 # a damaged or foreign build: build again
            log.info("pyfuser: rebuilding the native runner (%s)", e)
            os.remove(path)
    log.warning("pyfuser: building the native cached-call runner in %s (once per machine, "
                "about 15-60 s; PYFUSER_NATIVE=0 skips it)", directory)
    os.makedirs(directory, exist_ok=True)
    if shutil.which("ninja") is None:      # the venv's ninja package, when not activated
        os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + \
            os.environ.get("PATH", "")
    from torch.utils.cpp_extension import load
    return load(name, [source], build_directory=directory, extra_cflags=["-O2"],
                verbose=False)


def _import(name: str, path: str):
    import torch  # noqa: F401 - the extension links against libtorch, loaded by this import
    spec = importlib.util.spec_from_file_location(
        name, path, loader=importlib.machinery.ExtensionFileLoader(name, path))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def runner_module():
    """The native extension where it is built (loaded on first use), or None when it is off,
    not built or unavailable. Never builds."""
    if not enabled():
        return None
    if not built():
        if not _told[0]:
            _told[0] = True
            log.info("pyfuser: the native cached-call runner is not built (cached calls run in "
                     "Python); `python -m pyfuser.runtime.native` builds it once")
        return None
    return _load()


def configure(mod) -> bool:
    """Point the extension at the current raw driver; False when it lacks cuLaunchKernelEx (or
    libcuda cannot be loaded): then no launch is handed to the runner."""
    try:
        raw = D.raw_driver()
    except D.CudaDriverError:
        return False
    addresses = raw.addresses() if hasattr(raw, "addresses") else None
    if addresses is None:
        return False
    mod.configure(*addresses, D._raw_stream_fn())
    return True


def launch_step(launcher, prep, ptr_slots):
    """The runner's ("launch", ...) step for Prepared `prep`, whose i-th tensor pointer comes from
    slot ptr_slots[i]; None when it is not a "ctypes" launch through cuLaunchKernelEx. A kernel
    drawing random numbers gets the prepared call's `draw` (runtime/rng.py's `drawer`, which the
    Python path draws from too: the seed, offset and state pointer) and the byte offsets to
    write them at."""
    if launcher.mode != "ctypes" or launcher._raw is None or launcher._raw.launch_ex is None:
        return None
    from .launch import _CFG
    offsets = [_CFG + o for o in launcher.packer.offsets]
    writes = [(off + 8 * j, ptr_slots[i]) for off, idx in prep.runs for j, i in enumerate(idx)]
    what = launcher._what(prep.dims)

    def fail(code, call):
        D._fail(code, what if call == "launch" else call)

    step = ("launch", prep.fn_int, prep.ctx_int, bytes(prep.buf), offsets, writes, fail)
    if prep.rng is None:
        return step
    return step + (prep.draw, [(off, which) for _, off, which in prep.rng[2]])


def main(argv=None) -> int:
    """`python -m pyfuser.runtime.native`: build the native runner now (an install step)."""
    import argparse
    ap = argparse.ArgumentParser(prog="python -m pyfuser.runtime.native",
                                 description="Build pyfuser's native cached-call runner "
                                             "(once per machine, torch version and source).")
    ap.add_argument("--check", action="store_true", help="only say whether it is built")
    args = ap.parse_args(argv)
    if args.check:
        print(f"{'built' if built() else 'not built'}: {build_dir()}")
        return 0 if built() else 1
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    mod = build()
    print(f"{'built' if mod is not None else 'NOT built (see above)'}: {build_dir()}")
    return 0 if mod is not None else 1


if __name__ == "__main__":
    sys.exit(main())
