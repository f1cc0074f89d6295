"""The launcher's host side against a fake CUDA driver (no GPU needed): the bytes each launch mode
hands to cuLaunchKernel decode to the right parameter values, the context is pushed only when it
is not current, dynamic shared memory above 48 KiB is requested once, errors name the call."""
import ctypes
import struct
import types

import pytest
import torch

from pyfuser.codegen.kernel import LaunchConfig, Param
from pyfuser.runtime import launch as L
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
        self.calls, self.decoded = [], None

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
        return (0, "fn:" + name.decode())

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
            ptrs = (ctypes.c_void_p * len(CT)).from_address(params)
            self.decoded = tuple(struct.unpack("<" + _CH[c], ctypes.string_at(p, _SZ[c]))[0]
                                 for c, p in zip(CT, ptrs))
        else:
            words = extra if isinstance(extra, list) else list((ctypes.c_void_p * 5).from_address(extra))
            assert words[0] == 1 and words[2] == 2 and not words[4]
            size = ctypes.c_size_t.from_address(words[3]).value
            fmt = ParamPacker([Param("x", c, ("numel", 0)) for c in CT]).fmt
            self.decoded = struct.unpack(fmt, ctypes.string_at(words[1], size))
        return (self.launch_error,)


_CH = {"void*": "Q", "int": "i", "double": "d", "bool": "?", "int64_t": "q", "float": "f",
       "uint32_t": "I"}
_SZ = {"void*": 8, "int": 4, "double": 8, "bool": 1, "int64_t": 8, "float": 4, "uint32_t": 4}


@pytest.fixture
def fake(monkeypatch):
    drv = FakeDriver(current=1234)
    monkeypatch.setattr(L, "driver", lambda: drv)
    monkeypatch.setitem(L._contexts, 0, ("ctx", 1234))
    monkeypatch.setattr(L, "_raw_stream_fn", lambda: (lambda idx: 777))
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
    with pytest.raises(L.CudaDriverError, match=r"cuLaunchKernel\(pf_k.*CUDA_ERROR_INVALID_VALUE"):
        _launcher("ptrs").launch(LaunchConfig((1, 1, 1), (32, 1, 1)), [], VALS, 0)


def test_check_unpacks_results():
    assert L.check((0,), "x") is None
    assert L.check((0, 5), "x") == 5
    assert L.check((0, 5, 6), "x") == (5, 6)


def test_bad_mode():
    with pytest.raises(L.PyfuserError, match="PYFUSER_LAUNCH_MODE"):
        L.KernelLauncher(CompiledBinary("k", "k", "sm_90", b"", "", 0, "k"), ParamPacker([]),
                         mode="nope")


def test_no_params_kernel(fake):
    binary = CompiledBinary("pf_k", "pf_k", "sm_90", b"\x7fELF", "", 0.0, "key")
    k = L.KernelLauncher(binary, ParamPacker([]))
    k.launch(LaunchConfig((1, 1, 1), (1, 1, 1)), [torch.empty(0)], {}, 0)
    assert fake.decoded == () and ("launch", (1, 1, 1), (1, 1, 1), 0, 777) in fake.calls
