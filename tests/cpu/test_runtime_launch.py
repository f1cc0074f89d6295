"""The launcher's host side against a fake CUDA driver (no GPU needed): the bytes each launch mode
hands to cuLaunchKernel decode to the right parameter values, the context is pushed only when it
is not current, dynamic shared memory above 48 KiB is requested once, errors name the call.
"ctypes" mode calls libcuda through ctypes: `FakeRaw` stands in for it (D.raw_driver)."""
import ctypes
import itertools
import struct
import threading
import types

import pytest
import torch

from pyfuser.codegen.kernel import LaunchConfig, Param
from pyfuser.runtime import driver as D, launch as L
from pyfuser.runtime.nvrtc import CompiledBinary
from pyfuser.runtime.params import ParamPacker

CT = ["void*", "int", "double", "bool", "int64_t", "float", "uint32_t"]
VALS = {"s0": 0x7F0012345678, "s1": -7, "s2": 2.5, "s3": True, "s4": -(2 ** 40), "s5": 0.375,
        "s6": 4000000000}


class _Packer(ParamPacker):
    def _build_getter(self):
        names = [p.source[1] for p in self.params]
        return lambda t, b: tuple(b[n] for n in names)


class FakeDriver:
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES=8)

    def __init__(self, current=0, launch_error=0, extra_type=int):
        self.current, self.launch_error, self.extra_type = current, launch_error, extra_type
        self.calls, self.decoded, self.cts = [], None, CT

    def cuCtxGetCurrent(self):
        return (0, ctypes.c_void_p(self.current).value or 0)

    def cuCtxPushCurrent(self, ctx):
        self.calls.append("push")
        return (0,)

    def cuCtxPopCurrent(self):
        self.calls.append("pop")
        return (0, None)

    def cuModuleLoadData(self, cubin):
        self.calls.append("load")
        return (0, "module")

    def cuModuleGetFunction(self, mod, name):
        return (0, next(_HANDLES))                       # CUfunction: int() gives the handle

    def cuFuncSetAttribute(self, fn, attr, value):
        self.calls.append(("smem", value))
        return (0,)

    def cuGetErrorName(self, err):
        return (0, b"CUDA_ERROR_INVALID_VALUE")

    def cuGetErrorString(self, err):
        return (0, b"invalid argument")

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        if extra is not None and not isinstance(extra, self.extra_type):
            raise TypeError("an integer is required")
        self.calls.append(("launch", (gx, gy, gz), (bx, by, bz), smem, stream))
        if isinstance(params, tuple):
            self.decoded = params[0]
        elif params == 0:
            self.decoded = ()
        elif params is not None:
            self.decoded = _decode(params, self.cts)
        else:
            words = extra if isinstance(extra, list) else list((ctypes.c_void_p * 5).from_address(extra))
            assert words[0] == 1 and words[2] == 2 and not words[4]
            size = ctypes.c_size_t.from_address(words[3]).value
            fmt = ParamPacker([Param("x", c, ("numel", 0)) for c in self.cts]).fmt
            self.decoded = struct.unpack(fmt, ctypes.string_at(words[1], size))
        return (self.launch_error,)


_HANDLES = itertools.count(0x5000)
CTX = 1234


def _decode(params_addr, cts=None):
    cts = CT if cts is None else cts
    if not params_addr:
        return ()
    ptrs = (ctypes.c_void_p * len(cts)).from_address(params_addr)
    return tuple(struct.unpack("<" + _CH[c], ctypes.string_at(p, _SZ[c]))[0]
                 for c, p in zip(cts, ptrs))


def _int(v):
    return (v.value or 0) if isinstance(v, ctypes.c_void_p) else (v or 0)


class FakeRaw:
    """libcuda through ctypes, faked: the driver's context state, launches decoded into the
    FakeDriver's `calls` / `decoded`. A launch with another context current (or none) fails with
    CUDA_ERROR_INVALID_HANDLE / CUDA_ERROR_INVALID_CONTEXT, as the driver's does."""

    def __init__(self, drv, with_ex=True):
        self.drv, self.stack, self.cts = drv, [], None
        self.launch_ex = self._launch_ex if with_ex else None

    def get_current(self, addr):
        self.drv.calls.append("get_current")
        ctypes.c_void_p.from_address(addr).value = self.drv.current or None
        return 0

    def push(self, ctx):
        self.drv.calls.append("push")
        self.stack.append(self.drv.current)
        self.drv.current = _int(ctx)
        return 0

    def pop(self, addr):
        self.drv.calls.append("pop")
        self.drv.current = self.stack.pop()
        return 0

    def launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        assert extra is None and isinstance(fn, int)
        return self._record("launch", (gx, gy, gz), (bx, by, bz), smem, stream or 0, params)

    def _launch_ex(self, cfg, fn, params, extra):
        assert extra is None and all(isinstance(v, ctypes.c_void_p) for v in (cfg, fn, params))
        *dims, stream, attrs, nattrs = struct.unpack("<7I4xQQI4x", ctypes.string_at(cfg.value, 56))
        assert attrs == 0 and nattrs == 0
        return self._record("launch_ex", tuple(dims[:3]), tuple(dims[3:6]), dims[6], stream,
                            params.value)

    def _record(self, kind, grid, block, smem, stream, params):
        if self.drv.current != CTX:
            return 201 if not self.drv.current else 400
        self.drv.calls.append(("launch", grid, block, smem, stream))
        self.drv.calls.append(kind)
        self.drv.decoded = _decode(_int(params), self.cts)
        return self.drv.launch_error


_CH = {"void*": "Q", "int": "i", "double": "d", "bool": "?", "int64_t": "q", "float": "f",
       "uint32_t": "I"}
_SZ = {"void*": 8, "int": 4, "double": 8, "bool": 1, "int64_t": 8, "float": 4, "uint32_t": 4}


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver(current=CTX)
    drv.raw = FakeRaw(drv)
    monkeypatch.delenv("PYFUSER_LAUNCH_MODE", raising=False)
    monkeypatch.setattr(D, "driver", lambda: drv)
    monkeypatch.setattr(D, "raw_driver", lambda: drv.raw)
    monkeypatch.setitem(D._contexts, 0, ("ctx", 1234))
    monkeypatch.setattr(D, "_raw_stream_fn", lambda: (lambda idx: 777))
    monkeypatch.setattr(L, "_NO_EXTRA", [0])
    monkeypatch.setattr(L, "_extra_as_list", [False])
    return drv


def _launcher(mode):
    binary = CompiledBinary("pf_k", "pf_k", "sm_90", b"\x7fELF", "", 0.0, "key")
    return L.KernelLauncher(binary, _Packer([Param(f"p{i}", c, ("scalar", f"s{i}"))
                                             for i, c in enumerate(CT)]), mode=mode)


@pytest.mark.parametrize("mode", L.LAUNCH_MODES)
def test_each_mode_passes_the_right_values(fake, mode):
    _launcher(mode).launch(LaunchConfig((3, 2, 1), (128, 1, 1)), [], VALS, 0)
    assert fake.decoded == tuple(VALS.values())
    assert ("launch", (3, 2, 1), (128, 1, 1), 0, 777) in fake.calls
    assert "push" not in fake.calls and fake.calls.count("load") == 1


def test_older_bindings_extra_forms(fake):
    fake.extra_type = list                               # old cuda-python: extra is a list
    _launcher("extra").launch(LaunchConfig((1, 1, 1), (32, 1, 1)), [], VALS, 0)
    assert fake.decoded == tuple(VALS.values()) and L._extra_as_list[0]
    fake.extra_type = type(None)                         # and no-extra is None
    _launcher("ptrs").launch(LaunchConfig((1, 1, 1), (32, 1, 1)), [], VALS, 0)
    assert fake.decoded == tuple(VALS.values()) and L._NO_EXTRA[0] is None


def test_context_pushed_when_not_current(fake):
    fake.current = 99
    k = _launcher("ptrs")
    k.launch(LaunchConfig((1, 1, 1), (32, 1, 1)), [], VALS, 0)
    assert fake.calls.count("push") == 2 and fake.calls.count("pop") == 2   # load + launch


def test_large_dynamic_shared_memory_set_once(fake):
    k = _launcher("ptrs")
    for _ in range(3):
        k.launch(LaunchConfig((1, 1, 1), (32, 1, 1), 100 * 1024), [], VALS, 0)
    k.launch(LaunchConfig((1, 1, 1), (32, 1, 1), 48 * 1024), [], VALS, 0)
    assert [c for c in fake.calls if isinstance(c, tuple) and c[0] == "smem"] == [("smem", 102400)]


def test_launch_error_names_the_call(fake):
    fake.launch_error = 1
    with pytest.raises(D.CudaDriverError, match=r"cuLaunchKernel\(pf_k.*CUDA_ERROR_INVALID_VALUE"):
        _launcher("ptrs").launch(LaunchConfig((1, 1, 1), (32, 1, 1)), [], VALS, 0)


def test_check_unpacks_results():
    assert D.check((0,), "x") is None
    assert D.check((0, 5), "x") == 5
    assert D.check((0, 5, 6), "x") == (5, 6)


def test_bad_mode():
    with pytest.raises(L.PyfuserError, match="PYFUSER_LAUNCH_MODE"):
        L.KernelLauncher(CompiledBinary("k", "k", "sm_90", b"", "", 0, "k"), ParamPacker([]),
                         mode="nope")


def test_no_params_kernel(fake):
    binary = CompiledBinary("pf_k", "pf_k", "sm_90", b"\x7fELF", "", 0.0, "key")
    k = L.KernelLauncher(binary, ParamPacker([]))
    k.launch(LaunchConfig((1, 1, 1), (1, 1, 1)), [torch.empty(0)], {}, 0)
    assert fake.decoded == () and ("launch", (1, 1, 1), (1, 1, 1), 0, 777) in fake.calls


# ---- prepared launches ("ctypes" mode: libcuda through ctypes) ---------------------------------
PCT = ["void*", "void*", "int", "void*", "double"]          # pointers 0, 1 adjacent; 3 alone


def _prepared(fake, mode, cfg=LaunchConfig((5, 1, 1), (64, 2, 1))):
    params = [Param("a", "void*", ("ptr", 0)), Param("b", "void*", ("ptr", 1)),
              Param("n", "int", ("scalar", "n")), Param("c", "void*", ("ptr", 2)),
              Param("x", "double", ("scalar", "x"))]
    fake.raw.cts = fake.cts = PCT
    binary = CompiledBinary("pf_k", "pf_k", "sm_90", b"\x7fELF", "", 0.0, "key")
    packer = ParamPacker(params)
    k = L.KernelLauncher(binary, packer, mode=mode)
    ts = [torch.empty(4) for _ in range(3)]
    prep = k.prepare(cfg, 0, ts, {params[2].source[1]: 7, params[4].source[1]: -1.5})
    return k, prep


@pytest.mark.parametrize("mode", L.LAUNCH_MODES)
def test_prepared_launch_writes_this_calls_pointers(fake, mode):
    k, prep = _prepared(fake, mode)
    fake.calls.clear()
    prep.go([0x1000, 0x2000, 0x3000])
    if mode == "ctypes":
        assert fake.calls == [("launch", (5, 1, 1), (64, 2, 1), 0, 777), "launch_ex"]
        assert fake.decoded == (0x1000, 0x2000, 7, 0x3000, -1.5)
    elif mode == "tuple":
        assert tuple(fake.decoded) == (0x1000, 0x2000, 7, 0x3000, -1.5)
    else:
        assert ("launch", (5, 1, 1), (64, 2, 1), 0, 777) in fake.calls
        assert tuple(fake.decoded) == (0x1000, 0x2000, 7, 0x3000, -1.5)
    k.launch_prepared(prep, [0x1008, 0x2008, 0x3008])           # the same through the launcher
    assert tuple(fake.decoded) == (0x1008, 0x2008, 7, 0x3008, -1.5)


def test_ctypes_prepared_launch_skips_the_context_query(fake):
    _, prep = _prepared(fake, "ctypes")
    fake.calls.clear()
    for i in range(3):
        prep.go([i, i + 1, i + 2])
    assert "get_current" not in fake.calls and "push" not in fake.calls
    assert fake.calls.count("launch_ex") == 3 and fake.decoded == (2, 3, 7, 4, -1.5)


@pytest.mark.parametrize("current", [0, 99])
def test_ctypes_prepared_launch_pushes_when_another_context_is_current(fake, current):
    _, prep = _prepared(fake, "ctypes")
    fake.calls.clear()
    fake.current = current                      # none, or another device's context
    prep.go([0x10, 0x20, 0x30])
    assert fake.calls == ["get_current", "push", ("launch", (5, 1, 1), (64, 2, 1), 0, 777),
                          "launch_ex", "pop"]
    assert fake.current == current and fake.decoded == (0x10, 0x20, 7, 0x30, -1.5)


def test_ctypes_without_launch_kernel_ex(fake):
    fake.raw = FakeRaw(fake, with_ex=False)
    _, prep = _prepared(fake, "ctypes", LaunchConfig((2, 3, 4), (32, 1, 1), 1024))
    fake.calls.clear()
    prep.go([1, 2, 3])
    assert fake.calls == [("launch", (2, 3, 4), (32, 1, 1), 1024, 777), "launch"]
    assert fake.decoded == (1, 2, 7, 3, -1.5)
    fake.current = 5
    prep.go([4, 5, 6])
    assert fake.calls[-1] == "pop" and fake.decoded == (4, 5, 7, 6, -1.5)


def test_ctypes_launch_errors_name_the_call_and_kernel(fake):
    _, prep = _prepared(fake, "ctypes")
    fake.launch_error = 1
    fake.calls.clear()
    with pytest.raises(D.CudaDriverError,
                       match=r"cuLaunchKernel\(pf_k, grid=\(5, 1, 1\), block=\(64, 2, 1\), "
                             r"smem=0\) failed: CUDA_ERROR_INVALID_VALUE"):
        prep.go([1, 2, 3])
    assert "push" not in fake.calls                      # our context was current: no retry
    prep.go.__globals__["acquire"]()                     # the lock was released
    prep.go.__globals__["release"]()
    fake.current = 99                                    # refused again after the push
    with pytest.raises(D.CudaDriverError, match="cuLaunchKernel"):
        prep.go([1, 2, 3])
    assert fake.calls[-1] == "pop" and fake.current == 99


def test_ctypes_push_failure_is_checked(fake):
    _, prep = _prepared(fake, "ctypes")
    fake.current = 99
    fake.raw.push = lambda ctx: 201
    with pytest.raises(D.CudaDriverError, match="cuCtxPushCurrent"):
        prep.go([1, 2, 3])


def test_mode_switch_rebinds_prepared_launches(fake):
    k, prep = _prepared(fake, "ctypes")
    k.mode = "tuple"
    fake.calls.clear()
    prep.go([7, 8, 9])
    assert "launch_ex" not in fake.calls and tuple(fake.decoded) == (7, 8, 7, 9, -1.5)
    k.mode = "ctypes"
    prep.go([1, 2, 3])
    assert fake.calls[-1] == "launch_ex"


def test_no_libcuda_falls_back_to_ptrs(fake, monkeypatch):
    def missing():
        raise D.CudaDriverError("libcuda cannot be loaded through ctypes")
    monkeypatch.setattr(D, "raw_driver", missing)
    k = L.KernelLauncher(CompiledBinary("k", "k", "sm_90", b"", "", 0, "k"), ParamPacker([]))
    assert k.mode == "ptrs"
    monkeypatch.setenv("PYFUSER_LAUNCH_MODE", "tuple")
    assert L.KernelLauncher(CompiledBinary("k", "k", "sm_90", b"", "", 0, "k"),
                            ParamPacker([])).mode == "tuple"


def test_ctypes_prepared_launch_from_threads(fake):
    """The shared buffer is written and launched under a lock: every launch sees the pointers of
    one call (the fake sleeps, releasing the GIL, before it reads the buffer)."""
    import time
    _, prep = _prepared(fake, "ctypes")
    seen, errors = [], []
    record = fake.raw._record

    def slow_record(*a):
        time.sleep(0.0002)
        r = record(*a)
        seen.append(fake.decoded)
        return r
    fake.raw._record = slow_record

    def work(t):
        try:
            for i in range(30):
                base = (t << 20) + (i << 4)
                prep.go([base, base + 1, base + 2])
        except Exception as e:  # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(seen) == 120
    assert all(d[1] == d[0] + 1 and d[3] == d[0] + 2 for d in seen)


class _ClusterDriver:
    """cuFuncGetAttribute answers a kernel's compiled cluster width; cuFuncSetAttribute records."""
    CUfunction_attribute = types.SimpleNamespace(CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH=12,
                                                 CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED=14)

    def __init__(self, width):
        self.width, self.set = width, []

    def cuFuncGetAttribute(self, attr, fn):
        assert attr == 12
        return (0, self.width)

    def cuFuncSetAttribute(self, fn, attr, value):
        self.set.append((attr, value))
        return (0,)


@pytest.mark.parametrize("width,allowed", [(0, False), (8, False), (16, True)])
def test_clusters_wider_than_eight_are_allowed_at_load(width, allowed, monkeypatch):
    """A kernel compiled with __cluster_dims__ wider than the portable 8 blocks launches only
    with non-portable cluster sizes allowed: the launcher sets that attribute when it loads such
    a function, and only then ($PYFUSER_RED_CLUSTER=16 ran on an H200 so)."""
    drv = _ClusterDriver(width)
    monkeypatch.setattr(D, "driver", lambda: drv)
    L._allow_wide_clusters("fn", "k")
    assert drv.set == ([(14, 1)] if allowed else [])
