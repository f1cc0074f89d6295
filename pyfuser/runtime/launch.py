"""Loading CUBINs into PyTorch's CUDA context and launching them on PyTorch's current stream.

`KernelLauncher(binary, packer)` wraps one compiled kernel. `launch(cfg, tensors, bindings,
device_index)` loads the module on that device the first time (cuModuleLoadData in the device's
primary context, which is the one PyTorch uses), raises the dynamic shared-memory limit when the
launch needs more than 48 KiB, packs the arguments and calls cuLaunchKernel on
`torch.cuda.current_stream(device)`. Driver plumbing (result checks, primary contexts, libcuda
through ctypes, the layout check) is driver.py's, reached as `D.<name>` (one patch point each).

Argument passing (`$PYFUSER_LAUNCH_MODE`, read when a launcher is made; `launcher.mode = ...`
switches an existing launcher, its prepared launches included):
- "ctypes" (default): libcuda's own entry points through ctypes (`D.raw_driver()`), no cuda-bindings
  wrapper per call. kernelParams is a prebuilt `void*[]` pointing into one C buffer. A prepared
  launch (below) keeps a CUlaunchConfig (grid, block, shared memory, stream) right before its
  parameters in that buffer, so a call is one `struct.pack_into` (stream + tensor pointers) and
  one `cuLaunchKernelEx(&config, f, params, NULL)` whose arguments are all bound beforehand
  (drivers without cuLaunchKernelEx: cuLaunchKernel with argtypes). Where libcuda cannot be
  loaded, the launcher uses "ptrs".
- "ptrs": the same buffer through cuda-bindings' `cuLaunchKernel`; kernelParams is the address of
  a prebuilt `void*[]` pointing at each parameter's slot, so cuda-python converts nothing per call.
- "extra": the same buffer passed through `extra` = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf,
  CU_LAUNCH_PARAM_BUFFER_SIZE, &size, CU_LAUNCH_PARAM_END}; `size` is the kernel's parameter
  block (the end of the last parameter, `ParamPacker.args_size`), never the 8-padded buffer: a
  larger size fails with CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES ("too many arguments").
- "tuple": cuda-python's (values, ctypes types) form; slowest, simplest, kept for comparison.
Modules are loaded, attributes set and layouts checked through cuda-bindings in every mode.

Fast path: `prepare(cfg, device_index, tensors, bindings)` packs every value once into a buffer
of its own (a `Prepared`) and returns it; `prep.go(ptrs)` (= `launch_prepared(prep, ptrs)`) then
only writes the tensor pointers (all other parameters are fixed by the executor's fast key) and
the current stream, and launches; a kernel drawing random numbers also gets a new seed and
offset from runtime/rng.py per launch, under the call's lock (`Prepared.rng`). In "ctypes"
mode `go` is generated per Prepared and skips the
context query: it launches first and only when the driver refuses (a non-zero CUresult) looks at
the thread's current context; if that is not the device's primary context (another device's, or
none) it pushes the primary context, launches again and pops it; any other failure raises.

Invariants:
- A kernel is launched only after its layout passed `D.verify_layout` when it was loaded.
- The launch runs with the device's primary context current; if the thread had another current
  context (another device, or none yet), it is pushed for the launch and popped after (prepared
  "ctypes" launches find out from the launch's own error, see above: a kernel of a module loaded
  in one context is not launched in another; the driver answers CUDA_ERROR_INVALID_HANDLE or
  CUDA_ERROR_INVALID_CONTEXT).
- One launcher may be used from several threads: each shared argument buffer is guarded by a lock
  (cuLaunchKernel copies the arguments before it returns).
- Every driver call's result and every launch's CUresult is checked, in every mode: a non-zero
  one raises CudaDriverError naming the call (a launch: the kernel, grid, block and shared memory).
"""
from __future__ import annotations

import ctypes
import functools
import logging
import os
import struct
import threading
import weakref

import torch

from ..errors import PyfuserError
from .rng import drawer
from . import driver as D
from .nvrtc import CompiledBinary
from .params import ParamPacker

LAUNCH_MODES = ("ctypes", "ptrs", "extra", "tuple")
log = logging.getLogger("pyfuser")
_DEFAULT_SMEM = 48 * 1024

# A Prepared's buffer: a CUlaunchConfig (7 x uint32 grid/block/smem, pad, hStream @32, attrs @40,
# numAttrs @48, pad) then the kernel parameters at _CFG.
_CFG = 56
_CONFIG = struct.Struct("<7I4xQQI4x")
_INT64 = struct.Struct("<q")


# `extra` is a void** address (an int, 0 for none) in cuda-bindings 13; older releases took a
# list of ints or None. Both are detected on the first TypeError and remembered.
_extra_as_list = [False]
_NO_EXTRA = [0]


PORTABLE_CLUSTER = 8     # blocks a cluster may hold on every GPU with clusters


def _allow_wide_clusters(fn, name: str) -> None:
    """A kernel compiled with __cluster_dims__ wider than the portable 8 blocks (sm_90 allows 16)
    launches only once its function allows non-portable cluster sizes."""
    drv = D.driver()
    attrs = drv.CUfunction_attribute
    width = getattr(attrs, "CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH", None)
    if width is None:
        return
    if D.check(drv.cuFuncGetAttribute(width, fn), f"cuFuncGetAttribute(cluster width) of {name}") \
            <= PORTABLE_CLUSTER:
        return
    D.check(drv.cuFuncSetAttribute(fn, attrs.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1),
            f"cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) for {name}")


class KernelLauncher:
    def __init__(self, binary: CompiledBinary, packer: ParamPacker, mode: str | None = None):
        self.binary, self.packer = binary, packer
        self._functions: dict[int, object] = {}
        self._fn_ints: dict[int, int] = {}
        self._modules: dict[int, object] = {}
        self._smem_limit: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stream = D._raw_stream_fn()
        self._drv = D.driver()
        self._raw = None
        self._preps: "weakref.WeakSet[Prepared]" = weakref.WeakSet()
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
        self.mode = mode or os.environ.get("PYFUSER_LAUNCH_MODE") or "ctypes"

    @property
    def mode(self) -> str:
        return self._mode

    @mode.setter
    def mode(self, mode: str) -> None:
        """Switch the argument passing (LAUNCH_MODES); prepared launches follow."""
        if mode not in LAUNCH_MODES:
            raise PyfuserError(f"PYFUSER_LAUNCH_MODE={mode!r}; expected one of {LAUNCH_MODES}")
        if mode == "ctypes" and self._raw is None:
            try:
                self._raw = D.raw_driver()
            except D.CudaDriverError as e:
                log.debug("pyfuser: launch mode 'ptrs' instead of 'ctypes': %s", e)
                mode = "ptrs"
        self._mode = mode
        for prep in list(self._preps):
            self._bind(prep)
            for listener in prep.listeners:
                listener()

    # ---- loading --------------------------------------------------------------------------
    def function(self, device_index: int):
        fn = self._functions.get(device_index)
        if fn is not None:
            return fn
        with self._lock:
            if device_index not in self._functions:
                ctx, ctx_int = D.primary_context(device_index)
                drv = D.driver()
                with D._Current(ctx, ctx_int):
                    mod = D.check(drv.cuModuleLoadData(self.binary.cubin),
                                f"cuModuleLoadData({self.binary.name})")
                    fn = D.check(drv.cuModuleGetFunction(mod, self.binary.lowered_name.encode()),
                               f"cuModuleGetFunction({self.binary.lowered_name})")
                    _allow_wide_clusters(fn, self.binary.name)
                self._modules[device_index] = mod
                D.verify_layout(fn, self.packer, self.binary.name)
                self._fn_ints[device_index] = int(fn)
                self._functions[device_index] = fn
        return self._functions[device_index]

    def _ensure_smem(self, fn, device_index: int, smem: int) -> None:
        if smem <= max(_DEFAULT_SMEM, self._smem_limit.get(device_index, 0)):
            return
        drv = D.driver()
        attr = drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
        D.check(drv.cuFuncSetAttribute(fn, attr, int(smem)),
              f"cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES={smem}) for {self.binary.name}")
        self._smem_limit[device_index] = int(smem)

    def _what(self, dims) -> str:
        return (f"cuLaunchKernel({self.binary.name}, grid={tuple(dims[:3])}, "
                f"block={tuple(dims[3:6])}, smem={dims[6]})")

    # ---- launching ------------------------------------------------------------------------
    def launch(self, cfg, tensors, bindings, device_index: int) -> None:
        fn = self._functions.get(device_index)
        if fn is None:
            fn = self.function(device_index)
        smem = int(cfg.shared_mem)
        if smem > _DEFAULT_SMEM:
            self._ensure_smem(fn, device_index, smem)
        ctx, ctx_int = D._contexts[device_index]
        stream = self._stream(device_index)
        gx, gy, gz = cfg.grid
        bx, by, bz = cfg.block
        if self._mode == "ctypes":
            raw, fn_int = self._raw, self._fn_ints[device_index]
            with self._lock:
                self.packer.pack_into(self._buf, tensors, bindings)
                res = D._with_context(raw, ctx_int, lambda: raw.launch(
                    fn_int, int(gx), int(gy), int(gz), int(bx), int(by), int(bz), smem, stream,
                    self._ptrs_addr or None, None))
            if res:
                D._fail(res, self._what((gx, gy, gz, bx, by, bz, smem)))
            return
        drv = self._drv
        cur = drv.cuCtxGetCurrent()
        pushed = int(cur[0]) != 0 or int(cur[1]) != ctx_int
        if pushed:
            D.check(drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
        try:
            if self._mode == "tuple":
                vals = self.packer.values(tensors, bindings)
                res = _launch_no_extra(drv, fn, gx, gy, gz, bx, by, bz, smem, stream,
                                       (vals, self.packer.ctypes))
            else:
                with self._lock:
                    self.packer.pack_into(self._buf, tensors, bindings)
                    if self._mode == "ptrs":
                        res = _launch_no_extra(drv, fn, gx, gy, gz, bx, by, bz, smem, stream,
                                               self._ptrs_addr)
                    else:
                        res = _launch_extra(drv, fn, (gx, gy, gz, bx, by, bz, smem), stream,
                                            self._extra_addr, self._extra_list)
        finally:
            if pushed:
                D.check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")
        if int(res[0]) != 0:
            D._fail(res[0], self._what((gx, gy, gz, bx, by, bz, smem)))

    # ---- the executor's fast path ------------------------------------------------------------
    def prepare(self, cfg, device_index: int, tensors, bindings) -> "Prepared":
        """A launch of `cfg` whose parameters are those of `tensors`/`bindings` except the tensor
        pointers, which `prep.go(ptrs)` writes. Values are checked (ExecuteError) here."""
        fn = self.function(device_index)
        smem = int(cfg.shared_mem)
        if smem > _DEFAULT_SMEM:
            self._ensure_smem(fn, device_index, smem)
        prep = Prepared(self, fn, cfg, smem, device_index, tensors, bindings)
        self._bind(prep)
        self._preps.add(prep)
        return prep

    def _bind(self, prep: "Prepared") -> None:
        """Set prep.go for the current mode."""
        if self._mode == "ctypes":
            prep.go = _ctypes_go(self, prep)
        else:
            prep.go = functools.partial(self.launch_prepared, prep)

    def launch_prepared(self, prep: "Prepared", ptrs) -> None:
        """Launch `prep` with tensor pointers `ptrs` (tensor inputs, then outputs)."""
        mode = self._mode
        if mode == "ctypes":
            return prep.go(ptrs)
        drv = self._drv
        stream = self._stream(prep.device_index)
        cur = drv.cuCtxGetCurrent()
        pushed = int(cur[0]) != 0 or int(cur[1]) != prep.ctx_int
        if pushed:
            D.check(drv.cuCtxPushCurrent(prep.ctx), "cuCtxPushCurrent")
        try:
            if mode == "ptrs":
                with prep.lock:
                    if prep.rng is not None:
                        _draw_into(prep)
                    prep.write(prep.buf, ptrs)
                    res = _launch_no_extra(drv, prep.fn, *prep.dims, stream, prep.ptrs_addr)
            elif mode == "extra":
                with prep.lock:
                    if prep.rng is not None:
                        _draw_into(prep)
                    prep.write(prep.buf, ptrs)
                    res = _launch_extra(drv, prep.fn, prep.dims, stream, prep.extra_addr,
                                        prep.extra_list)
            else:
                with prep.lock:
                    if prep.rng is not None:
                        _draw_into(prep)
                    vals = list(prep.values)
                for k, i in prep.ptr_slots:
                    vals[k] = ptrs[i]
                res = _launch_no_extra(drv, prep.fn, *prep.dims, stream,
                                       (tuple(vals), self.packer.ctypes))
        finally:
            if pushed:
                D.check(drv.cuCtxPopCurrent(), "cuCtxPopCurrent")
        if int(res[0]) != 0:
            D._fail(res[0], self._what(prep.dims))


def _launch_extra(drv, fn, dims, stream, extra_addr, extra_list):
    """cuLaunchKernel with `extra` (its void** address, or the list older bindings take)."""
    if not _extra_as_list[0]:
        try:
            return drv.cuLaunchKernel(fn, *dims, stream, None, extra_addr)
        except TypeError:
            _extra_as_list[0] = True
    return drv.cuLaunchKernel(fn, *dims, stream, None, extra_list)


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

    `listeners` are called when the launcher's mode changes (after `go` is rebound): copies of
    this launch held elsewhere (the native runner's programs) are dropped then.

    The buffer holds a CUlaunchConfig (grid, block, smem; the stream is written per call) and at
    offset _CFG the kernel parameters. `go(ptrs)` (set by the launcher for its mode) writes the
    tensor pointers and launches; `write(buf, ptrs)` (generated) packs just the pointers, runs of
    adjacent pointer parameters as one struct.pack_into each. `values` / `ptr_slots` serve
    "tuple" mode.
    """
    __slots__ = ("fn", "fn_int", "dims", "device_index", "ctx", "ctx_int", "buf", "ptrs_arr",
                 "ptrs_addr", "size", "extra", "extra_addr", "extra_list", "write", "values",
                 "ptr_slots", "runs", "go", "lock", "listeners", "rng", "draw", "__weakref__")

    def __init__(self, launcher, fn, cfg, smem, device_index, tensors, bindings):
        packer = launcher.packer
        self.fn, self.device_index = fn, device_index
        self.fn_int = launcher._fn_ints.get(device_index, 0)
        self.dims = (*(int(g) for g in cfg.grid), *(int(b) for b in cfg.block), smem)
        self.ctx, self.ctx_int = D._contexts[device_index]
        self.lock = threading.Lock()
        self.buf = ctypes.create_string_buffer(_CFG + max(packer.size, 8))
        _CONFIG.pack_into(self.buf, 0, *self.dims, 0, 0, 0)
        # every value validated; a random-number kernel's seed and offset are drawn per launch
        self.values = packer.values_undrawn(tensors, bindings)
        packer.pack_values_into(self.buf, self.values, _CFG)
        base = ctypes.addressof(self.buf) + _CFG
        n = len(packer.params)
        self.ptrs_arr = (ctypes.c_void_p * max(n, 1))(*[base + o for o in packer.offsets])
        self.ptrs_addr = ctypes.addressof(self.ptrs_arr) if n else 0
        self.size = ctypes.c_size_t(packer.args_size)
        self.extra = (ctypes.c_void_p * 5)(1, base, 2, ctypes.addressof(self.size), 0)
        self.extra_addr = ctypes.addressof(self.extra)
        self.extra_list = [1, base, 2, ctypes.addressof(self.size), 0]
        self.ptr_slots = [(k, int(p.source[1])) for k, p in enumerate(packer.params)
                          if p.source[0] == "ptr"]
        self.runs = _pointer_runs(packer, self.ptr_slots)
        self.write = _pointer_writer(self.runs)
        self.rng = _rng_slots(packer, device_index)
        # (seed, offset, state pointer) per launch: rng.drawer, shared with the native runner
        self.draw = None if self.rng is None else drawer(*self.rng[:2])
        self.go = None
        self.listeners = []     # called after a mode switch rebinds `go` (the native runner's)


def _rng_slots(packer, device_index):
    """None, or for a kernel drawing random numbers (device, increment, [(param index, buffer
    offset, 0 for the seed / 1 for the offset / 2 for the state pointer)]): every launch of the
    prepared call draws its own seed and offset and reads the state pointer (runtime/rng.py),
    inside the call's lock, as the general path does."""
    if not packer.has_philox:
        return None
    slots, inc = [], 0
    which = {"seed": 0, "offset": 1, "state": 2}
    for k, p in enumerate(packer.params):
        if p.source[0] == "philox":
            slots.append((k, _CFG + packer.offsets[k], which[p.source[1]]))
            if p.source[1] == "offset":
                inc = int(p.source[2])
    return (torch.device("cuda", device_index), inc, slots)


def _draw_into(prep) -> None:
    """Write a fresh seed / offset into prep's buffer and tuple values (its lock held)."""
    state = prep.draw()
    vals = list(prep.values)
    for k, off, which in prep.rng[2]:
        _INT64.pack_into(prep.buf, off, state[which])
        vals[k] = state[which]
    prep.values = tuple(vals)


def _pointer_runs(packer, ptr_slots):
    """[(buffer offset, [pointer indices])] of adjacent pointer parameters."""
    runs = []
    for k, i in ptr_slots:
        off = _CFG + packer.offsets[k]
        if runs and runs[-1][0] + 8 * len(runs[-1][1]) == off:
            runs[-1][1].append(i)
        else:
            runs.append((off, [i]))
    return runs


def _pointer_writer(runs):
    """Generate `write(buf, ptrs)`: struct.pack_into of each run of adjacent pointer params."""
    env, lines = {}, ["def write(buf, p):"]
    for r, (off, idx) in enumerate(runs):
        env[f"S{r}"] = struct.Struct("<" + "Q" * len(idx)).pack_into
        lines.append(f"    S{r}(buf, {off}, " + ", ".join(f"p[{i}]" for i in idx) + ")")
    if not runs:
        lines.append("    pass")
    exec(compile("\n".join(lines) + "\n", "<pyfuser pointer writer>", "exec"), env)  # noqa: S102
    return env["write"]


def _ctypes_go(launcher, prep):
    """Generate prep's `go(ptrs)` for "ctypes" mode (see the module docstring).

    With cuLaunchKernelEx: one pack_into writes the config's stream (and zero attributes) and the
    run of pointers that starts the parameter block, others one each; the launch call has every
    argument bound (functools.partial of the ctypes function over prebuilt c_void_p objects)."""
    raw = launcher._raw
    V = ctypes.c_void_p
    base = ctypes.addressof(prep.buf)
    params = V(prep.ptrs_addr or None)
    env = {"acquire": prep.lock.acquire, "release": prep.lock.release, "stream": launcher._stream,
           "dev": prep.device_index, "buf": prep.buf, "draw": _draw_into, "prep": prep}
    runs = list(prep.runs)
    body = []
    if raw.launch_ex is not None:
        env["L"] = launch = functools.partial(raw.launch_ex, V(base), V(prep.fn_int), params, None)
        call = "L()"

        def relaunch(s):
            return launch()
        if runs and runs[0][0] == _CFG:
            off, idx = runs.pop(0)
            env["W"] = struct.Struct("<Q16x" + "Q" * len(idx)).pack_into
            body.append("W(buf, 32, s, " + ", ".join(f"p[{i}]" for i in idx) + ")")
        else:
            env["W"] = struct.Struct("<Q").pack_into
            body.append("W(buf, 32, s)")
    else:
        env["L"] = launch = functools.partial(raw.launch, prep.fn_int, *prep.dims)
        env["PA"] = pa = prep.ptrs_addr or None
        call = "L(s, PA, None)"

        def relaunch(s):
            return launch(s, pa, None)
    for r, (off, idx) in enumerate(runs):
        env[f"S{r}"] = struct.Struct("<" + "Q" * len(idx)).pack_into
        body.append(f"S{r}(buf, {off}, " + ", ".join(f"p[{i}]" for i in idx) + ")")
    what = launcher._what(prep.dims)
    ctx_int = prep.ctx_int

    def retry(code, s):
        """The launch was refused: with another (or no) context current, push ours and launch
        again; otherwise, or if that fails too, raise naming the launch."""
        cell = V()
        if raw.get_current(ctypes.addressof(cell)) == 0 and (cell.value or 0) != ctx_int:
            D._check_raw(raw.push(ctx_int), "cuCtxPushCurrent")
            try:
                code = relaunch(s)
            finally:
                D._check_raw(raw.pop(ctypes.addressof(cell)), "cuCtxPopCurrent")
        if code:
            D._fail(code, what)

    env["retry"] = retry
    lines = ["def go(p):", "    acquire()", "    try:", "        s = stream(dev)"]
    if prep.rng is not None:
        body.insert(0, "draw(prep)")
    lines += [f"        {b}" for b in body]
    lines += [f"        r = {call}", "        if r:", "            retry(r, s)",
              "    finally:", "        release()"]
    exec(compile("\n".join(lines) + "\n", "<pyfuser ctypes launch>", "exec"), env)  # noqa: S102
    return env["go"]
