"""A fake CUDA for CPU tests of the launch paths: CPU tensors pose as CUDA tensors, and the
driver's launch entry points (libcuda through ctypes, as launch.py's "ctypes" mode calls them)
are stand-ins that *run* the launched kernel: the CPU interpreter of its kernel IR on the
memory the launch's pointer parameters point at. So a test sees both what reached the driver
(every launch, decoded) and the values a GPU would have computed, through every call path
(the checked launch, prepared launches, dispatch programs, call plans, captured graphs).

`install(monkeypatch, tmp_path)` sets it up and returns the `FakeCuda` recorder:
- `launches`: one (kernel name, grid, block, {param name: value}) per launch;
- `host(t)` marks a tensor as a CPU tensor (its is_cuda is False): a 0-dim CPU tensor beside
  CUDA ones, as eager allows;
- `h2d`: host-to-device copies seen (`Tensor.to` / `copy_` from a host-marked tensor to a
  posing one), which a fused call must not make.
The native runner is off (PYFUSER_NATIVE=0) unless `native=True`; raw streams are 777.
"""
from __future__ import annotations

import ctypes
import itertools
import struct

import torch

from pyfuser.runtime import driver as D
from pyfuser.runtime import executor as X
from pyfuser.runtime import launch as L

_CH = {"void*": "Q", "int": "i", "int64_t": "q", "double": "d", "float": "f", "bool": "?",
       "uint32_t": "I"}
_HANDLES = itertools.count(0x7000)
STREAM = 777


def _alias(ptr: int, size, stride, dtype) -> torch.Tensor:
    """A CPU tensor over the memory at `ptr` (no copy)."""
    if any(s == 0 for s in size):
        return torch.empty_strided(size, stride, dtype=dtype)
    span = 1 + sum((n - 1) * s for n, s in zip(size, stride))
    nbytes = span * torch.empty((), dtype=dtype).element_size()
    raw = (ctypes.c_uint8 * nbytes).from_address(ptr)
    flat = torch.frombuffer(raw, dtype=torch.uint8).view(dtype)
    return flat.as_strided(size, stride)


class FakeCuda:
    def __init__(self):
        self.launches: list = []
        self.h2d: list = []
        self.callback_errors: list = []
        self._plans: dict = {}        # id(launcher) -> (KernelPlan, fusion)
        self._preps: dict = {}        # address of a Prepared's buffer -> what it launches

    @staticmethod
    def host(t: torch.Tensor) -> torch.Tensor:
        t._pf_host = True
        return t

    # -- running a kernel on the CPU
    def _interpret(self, launcher, tensors, bindings):
        plan, fusion = self._plans[id(launcher)]
        from pyfuser.codegen.api import interpret
        from pyfuser.ir.tensor import TensorView
        n_in = sum(isinstance(v, TensorView) for v in fusion.inputs)
        it = iter(tensors[:n_in])
        inputs = [next(it) if isinstance(v, TensorView) else None for v in fusion.inputs]
        outputs = list(tensors[n_in:n_in + len(fusion.outputs)])
        interpret(plan, inputs, outputs, bindings)

    def launched(self, launcher, grid, block, values):
        names = [p.name for p in launcher.packer.params]
        self.launches.append((launcher.binary.name, tuple(grid), tuple(block),
                              dict(zip(names, values))))

    def _find(self, buf_addr, fn):
        """The Prepared a launch buffer is (or is a copy of: the native runner's): same kernel,
        same launch configuration and non-pointer parameters."""
        if buf_addr in self._preps:
            return self._preps[buf_addr]
        for entry in self._preps.values():
            prep, launcher = entry[0], entry[1]
            if prep.fn_int != fn:
                continue
            size = len(prep.buf)
            launched = ctypes.string_at(buf_addr, size)
            mine = bytes(prep.buf)
            pointers = set()
            for k, _ in prep.ptr_slots:
                off = L._CFG + launcher.packer.offsets[k]
                pointers.update(range(off, off + 8))
            same = all(a == b for i, (a, b) in enumerate(zip(launched, mine))
                       if i not in pointers and not 32 <= i < 40)      # nor the stream
            if same:
                return entry
        raise AssertionError("a launch of no known prepared launch")

    def run_prepared(self, buf_addr, params_addr, fn=None):
        prep, launcher, metas, bindings = self._find(buf_addr, fn)
        packer = launcher.packer
        base = buf_addr + L._CFG
        values = [struct.unpack("<" + _CH[p.ctype], ctypes.string_at(base + off, size))[0]
                  for p, off, size in zip(packer.params, packer.offsets, packer.sizes)]
        self.launched(launcher, prep.dims[:3], prep.dims[3:6], values)
        ptrs = {}
        for k, i in prep.ptr_slots:
            ptrs[i] = values[k]
        tensors = [_alias(ptrs[i], *metas[i]) for i in range(len(metas)) if i in ptrs]
        self._interpret(launcher, tensors, bindings)


class FakeRaw:
    """libcuda through ctypes (launch.D.raw_driver()) for the fake."""
    launch_ex_addr = None

    def __init__(self, fake):
        self.fake = fake

    def get_current(self, addr):
        ctypes.c_void_p.from_address(addr).value = 1234
        return 0

    def push(self, ctx):
        raise AssertionError("the fake's context is always current")

    pop = push

    def launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        raise AssertionError("checked launches are intercepted before the driver")

    def launch_ex(self, cfg, fn, params, extra):
        addr = cfg.value
        *dims, stream, attrs, nattrs = struct.unpack("<7I4xQQI4x", ctypes.string_at(addr, 56))
        assert attrs == 0 and nattrs == 0 and extra is None and stream == STREAM
        self.fake.run_prepared(addr, params.value, fn.value)
        return 0

    def addresses(self):
        """C entry points for the native runner: ctypes callbacks into this fake (kept alive
        on the recorder). An exception inside one is kept and answered with an error code."""
        V = ctypes.c_void_p
        fake = self.fake
        if not hasattr(fake, "callbacks"):
            def guard(f):
                def call(*args):
                    try:
                        return f(*args)
                    except BaseException as e:  # noqa: BLE001 - reported by the test
                        fake.callback_errors.append(e)
                        return 999
                return call
            launch = ctypes.CFUNCTYPE(ctypes.c_int, V, V, V, V)(guard(
                lambda cfg, fn, params, extra: self.launch_ex(V(cfg), V(fn), V(params), extra)))
            cell = ctypes.CFUNCTYPE(ctypes.c_int, V)
            fake.callbacks = (launch, cell(guard(self.get_current)), cell(guard(self.push)),
                              cell(guard(self.pop)))
        return tuple(ctypes.cast(c, V).value for c in fake.callbacks)


class FakeDrv:
    """cuda-bindings' driver module, as far as loading a kernel needs it."""
    CUfunction_attribute = None

    def cuCtxGetCurrent(self):
        return (0, 1234)

    def cuModuleLoadData(self, cubin):
        return (0, "module")

    def cuModuleGetFunction(self, mod, name):
        return (0, next(_HANDLES))

    def cuFuncGetParamInfo(self, fn, k):
        return (801, 0, 0)                   # CUDA_ERROR_NOT_SUPPORTED: the check is skipped

    def cuGetErrorName(self, err):
        return (0, b"CUDA_ERROR")

    def cuGetErrorString(self, err):
        return (0, b"error")


def install(monkeypatch, tmp_path, native: bool = False) -> FakeCuda:
    """`native`: cached calls through the native runner (built here if it is not yet)."""
    from pyfuser.runtime import dispatch
    fake = FakeCuda()
    drv = FakeDrv()
    monkeypatch.setenv("PYFUSER_NATIVE", "1" if native else "0")
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    if native:
        from pyfuser.runtime import native as N
        assert N.build() is not None, "the native runner did not build"
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("PYFUSER_DUMP", "PYFUSER_POISON_OUTPUTS", "PYFUSER_LAUNCH_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(D, "raw_driver", lambda: FakeRaw(fake))
    monkeypatch.setattr(D, "driver", lambda: drv)
    monkeypatch.setattr(D, "primary_context", lambda i: ("ctx", 1234))
    monkeypatch.setitem(D._contexts, None, ("ctx", 1234))
    monkeypatch.setitem(D._contexts, -1, ("ctx", 1234))
    monkeypatch.setattr(D, "_raw_stream_fn", lambda: (lambda idx: STREAM))
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda idx: STREAM,
                        raising=False)
    monkeypatch.setattr(X.FusionExecutor, "_check_devices", lambda self, inputs: None)
    monkeypatch.setattr(torch.Tensor, "is_cuda",
                        property(lambda self: not getattr(self, "_pf_host", False)))
    monkeypatch.setattr(torch.Tensor, "is_cpu",
                        property(lambda self: getattr(self, "_pf_host", False)))

    build = X.FusionExecutor._build

    def _build(self, inputs, info):
        entry = build(self, inputs, info)
        if entry.launcher is not None:
            fake._plans[id(entry.launcher)] = (entry.plan, self.fusion)
        return entry
    monkeypatch.setattr(X.FusionExecutor, "_build", _build)

    def launch(self, cfg, tensors, bindings, device_index):
        self.function(device_index)
        fake.launched(self, cfg.grid, cfg.block, self.packer.values(tensors, bindings))
        fake._interpret(self, tensors, bindings)
    monkeypatch.setattr(L.KernelLauncher, "launch", launch)

    prepare = L.KernelLauncher.prepare

    def _prepare(self, cfg, device_index, tensors, bindings):
        prep = prepare(self, cfg, device_index, tensors, bindings)
        metas = [(tuple(t.shape), tuple(t.stride()), t.dtype) for t in tensors]
        fake._preps[ctypes.addressof(prep.buf)] = (prep, self, metas, bindings)
        return prep
    monkeypatch.setattr(L.KernelLauncher, "prepare", _prepare)

    to, copy_ = torch.Tensor.to, torch.Tensor.copy_

    def _to(self, *a, **k):
        if getattr(self, "_pf_host", False) and ("device" in k or any(
                isinstance(x, (torch.device, str)) or (isinstance(x, torch.Tensor) and
                                                       not getattr(x, "_pf_host", False))
                for x in a)):
            fake.h2d.append(tuple(self.shape))
        return to(self, *a, **k)

    def _copy(self, src, *a, **k):
        if getattr(src, "_pf_host", False) and not getattr(self, "_pf_host", False):
            fake.h2d.append(tuple(src.shape))
        return copy_(self, src, *a, **k)
    monkeypatch.setattr(torch.Tensor, "to", _to)
    monkeypatch.setattr(torch.Tensor, "copy_", _copy)
    dispatch.clear_caches()
    return fake
