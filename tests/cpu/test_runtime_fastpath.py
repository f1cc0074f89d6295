"""The cached-call fast path of execute_fusion / FusionExecutor.run, on the CPU against a fake CUDA
driver (CPU tensors posing as CUDA ones): what reaches cuLaunchKernel on a fast call (pointers of
this call's tensors, constants of the key), when the fast path steps aside (new sizes, poison,
dumps, clear_caches), segmented programs (host views around a kernel), the `extra` buffer size,
and the check of the packed layout against the kernel's own parameter list. The default launch
mode ("ctypes": libcuda through ctypes) runs against `FakeRaw`, the others against FakeDriver
(cuda-bindings)."""
import ctypes
import itertools
import os
import struct
import sys

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (NVRTC) is not installed")

from pyfuser.codegen.kernel import Param  # noqa: E402
from pyfuser.runtime import dispatch, driver as D, executor as X, launch as L  # noqa: E402
from pyfuser.runtime.params import ParamPacker  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

C = load_module_from_path("segment_cases", os.path.join(
    os.path.dirname(__file__), "segment_cases.py"), fresh=True, register=False)

_CH = {"void*": "Q", "int": "i", "int64_t": "q", "double": "d", "float": "f", "bool": "?",
       "uint32_t": "I"}


class FakeDriver:
    """Records every launch with its decoded parameters (needs the launcher's packer)."""
    CUfunction_attribute = None

    def __init__(self):
        self.launches, self.param_info = [], None
        self.packers = {}

    def cuCtxGetCurrent(self):
        return (0, 1234)

    def cuModuleLoadData(self, cubin):
        return (0, "module")

    def cuModuleGetFunction(self, mod, name):
        return (0, next(_HANDLES))                   # CUfunction: int() gives the handle

    def cuFuncGetParamInfo(self, fn, k):
        if self.param_info is None:
            return (801, 0, 0)                            # CUDA_ERROR_NOT_SUPPORTED: skip
        return (0, *self.param_info[k]) if k < len(self.param_info) else (1, 0, 0)

    def cuGetErrorName(self, err):
        return (0, b"CUDA_ERROR")

    def cuGetErrorString(self, err):
        return (0, b"error")

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        packer = self.packers[int(fn)]
        if isinstance(params, tuple):
            vals = tuple(params[0])
        elif params:
            ptrs = (ctypes.c_void_p * len(packer.params)).from_address(params)
            vals = tuple(struct.unpack("<" + _CH[p.ctype], ctypes.string_at(a, packer.sizes[k]))[0]
                         for k, (p, a) in enumerate(zip(packer.params, ptrs)))
        else:
            words = list((ctypes.c_void_p * 5).from_address(extra))
            size = ctypes.c_size_t.from_address(words[3]).value
            assert size == packer.args_size
            blob = ctypes.string_at(words[1], size) + b"\0" * (packer.size - size)
            vals = struct.unpack(packer.fmt, blob)
        self.launches.append((fn, (gx, gy, gz), (bx, by, bz), dict(zip(
            [p.name for p in packer.params], vals))))
        return (0,)


_HANDLES = itertools.count(0x5000)


class FakeRaw:
    """libcuda through ctypes ("ctypes" mode), decoding each launch through FakeDriver."""

    def __init__(self, drv):
        self.drv = drv

    def get_current(self, addr):
        ctypes.c_void_p.from_address(addr).value = 1234
        return 0

    def push(self, ctx):
        raise AssertionError("the fake's context is always current")

    pop = push

    def launch(self, fn, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        assert extra is None
        return self.drv.cuLaunchKernel(fn, gx, gy, gz, bx, by, bz, smem, stream, params or 0,
                                       None)[0]

    def launch_ex(self, cfg, fn, params, extra):
        *dims, stream, attrs, nattrs = struct.unpack("<7I4xQQI4x", ctypes.string_at(cfg.value, 56))
        assert attrs == 0 and nattrs == 0 and extra is None and stream == 777
        self.drv.ex_launches += 1
        return self.launch(fn.value, *dims, stream, params.value, None)

    def addresses(self):
        """C entry points for the native runner: ctypes callbacks into this fake, kept on the
        driver (alive as long as it is). An exception inside one is recorded and answered with
        an error code (ctypes would otherwise print it and return 0)."""
        V = ctypes.c_void_p
        if not hasattr(self.drv, "callbacks"):
            errors = self.drv.callback_errors = []

            def guard(f):
                def call(*args):
                    try:
                        return f(*args)
                    except BaseException as e:  # noqa: BLE001 - reported by the fixture
                        errors.append(e)
                        return 999
                return call
            launch = ctypes.CFUNCTYPE(ctypes.c_int, V, V, V, V)(
                guard(lambda cfg, fn, params, extra: self.launch_ex(
                    V(cfg), V(fn), V(params), extra)))
            cell = ctypes.CFUNCTYPE(ctypes.c_int, V)
            self.drv.callbacks = (launch, cell(guard(self.get_current)), cell(guard(self.push)),
                                  cell(guard(self.pop)))
        return tuple(ctypes.cast(c, V).value for c in self.drv.callbacks)


@pytest.fixture(params=["native", "python"])
def fake(request, monkeypatch, tmp_path):
    """The fake driver, with cached calls through the native runner or the Python path."""
    drv = FakeDriver()
    drv.ex_launches = 0
    drv.native = request.param == "native"
    monkeypatch.setenv("PYFUSER_NATIVE", "1" if drv.native else "0")
    if drv.native:                       # built once (an install step), never on a call
        from pyfuser.runtime import native
        assert native.build() is not None
    monkeypatch.setattr(D, "raw_driver", lambda: FakeRaw(drv))
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("PYFUSER_DUMP", "PYFUSER_POISON_OUTPUTS", "PYFUSER_LAUNCH_MODE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setattr(D, "driver", lambda: drv)
    monkeypatch.setattr(D, "primary_context", lambda i: ("ctx", 1234))
    monkeypatch.setitem(D._contexts, None, ("ctx", 1234))
    monkeypatch.setattr(D, "_raw_stream_fn", lambda: (lambda idx: 777))
    monkeypatch.setattr(X.FusionExecutor, "_check_devices", lambda self, inputs: None)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    from pyfuser.runtime import rng                  # a random kernel's device words, on the CPU
    zeros = torch.zeros(2, dtype=torch.int64)
    monkeypatch.setattr(rng, "zero_state", lambda device: zeros)
    drv.rng_state = zeros
    orig = L.KernelLauncher.function

    def function(self, device_index):
        fn = orig(self, device_index)
        drv.packers[int(fn)] = self.packer
        return fn
    monkeypatch.setattr(L.KernelLauncher, "function", function)
    dispatch.clear_caches()
    yield drv
    dispatch.clear_caches()
    assert not getattr(drv, "callback_errors", [])


mul_add = C.mul_add


def _programs(fs):
    p = fs.ir_fusion.__dict__.get(dispatch._PROGS)
    return p.runs if p is not None else {}


def _check_runner(fs, fake, n):
    """With the native runner on, it answers fs.execute and holds n programs (it is made when a
    recorded program is first hit: none yet is none); else Python does."""
    p = fs.ir_fusion.__dict__[dispatch._PROGS]
    if fake.native and n == 0 and p.native is None:
        return
    if fake.native:
        assert p.run == p.native.run and len(p.native) == n
    else:
        assert p.run is p.py_run and p.native is None


def test_fast_call_passes_this_calls_pointers(fake):
    fs = mul_add()
    xs = [torch.randn(1000) for _ in range(3)]
    (out0,) = fs.execute(xs)
    assert len(_programs(fs)) == 1                       # recorded on the first call
    fresh = [torch.randn(1000) for _ in range(3)]        # same key, other tensors
    (out,) = fs.execute(fresh)
    _, grid, block, vals = fake.launches[-1]
    assert [vals["T0"], vals["T1"], vals["T2"], vals["T4"]] == \
        [t.data_ptr() for t in fresh] + [out.data_ptr()]
    assert vals["n0"] == 1000 and out.shape == (1000,) and out.dtype == torch.float32
    assert out.data_ptr() != out0.data_ptr()
    ex = dispatch.get_executor(fs.ir_fusion)
    assert ex.last_run["cache_hit"] and ex.last_run["kernels"] == 1
    assert fs.last_run.launched == 1 and fs.last_run.segments[0].backend == "cuda"
    st = ex.stats
    assert st["runs"] == 2 and st["cache_hits"] == 1 and st["kernels"] == 2 and st["compiled"] == 1
    (out2,) = ex.run(fresh)                              # the executor's own fast path
    assert fake.launches[-1][3]["T4"] == out2.data_ptr() and ex.stats["runs"] == 3
    _check_runner(fs, fake, 1)


def test_new_sizes_take_the_slow_path_once(fake):
    fs = mul_add()
    for n in (1024, 4096, 1024, 4096):             # same signature, other sizes
        fs.execute([torch.randn(n) for _ in range(3)])
        assert fake.launches[-1][3]["n0"] == n
    assert len(_programs(fs)) == 2 and dispatch.get_executor(fs.ir_fusion).stats["compiled"] == 1
    _check_runner(fs, fake, 2)


def test_poison_and_dumps_step_aside(fake, monkeypatch, capsys):
    fs = mul_add()
    xs = [torch.randn(64) for _ in range(3)]
    fs.execute(xs)
    fs.execute(xs)
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")
    (out,) = fs.execute(xs)
    assert torch.isnan(out).all()                        # the fake kernel wrote nothing
    monkeypatch.delenv("PYFUSER_POISON_OUTPUTS")
    monkeypatch.setenv("PYFUSER_DUMP", "launch_params")
    fs.execute(xs)
    assert "[launch_params] pf_mul_add_kernel" in capsys.readouterr().err


def test_clear_drops_programs(fake):
    fs = mul_add()
    xs = [torch.randn(64) for _ in range(3)]
    fs.execute(xs)
    assert _programs(fs)
    dispatch.get_executor(fs.ir_fusion).clear()
    assert not _programs(fs)
    _check_runner(fs, fake, 0)
    fs.execute(xs)
    fs.execute(xs)                       # the first hit hands the program to the runner
    _check_runner(fs, fake, 1)
    dispatch.clear_caches()
    assert not _programs(fs)
    _check_runner(fs, fake, 0)


def test_folded_run_misses_on_every_key_change(fake):
    """fs.execute's generated run (one frame: key, lookup, program) hits only the same dtype,
    shape, strides, alignment and device; anything else is a new program (or an error)."""
    fs = mul_add()
    xs = [torch.randn(64) for _ in range(3)]
    fs.execute(xs)
    assert fs._progs is dispatch.programs(fs.ir_fusion)
    (a,) = fs.execute(xs)
    (b,) = fs.execute(tuple(xs))
    assert len(_programs(fs)) == 1 and a.data_ptr() != b.data_ptr()        # fresh outputs
    from pyfuser.errors import ExecuteError
    with pytest.raises(ExecuteError, match="must be torch.float32"):         # dtype: checked
        fs.execute([torch.randn(64, dtype=torch.float64) for _ in range(3)])
    base = torch.randn(200)
    for other in ([torch.randn(65) for _ in range(3)],                        # shape
                  [torch.randn(128)[::2] for _ in range(3)],                  # strides
                  [base[1:65], base[:64], base[:64]]):                        # alignment
        n = len(_programs(fs))
        fs.execute(other)
        assert len(_programs(fs)) == n + 1
    key = next(iter(_programs(fs)))
    assert key[4] == xs[0].get_device()                                       # device
    dispatch.clear_caches()                         # the held run survives, its programs do not
    assert not _programs(fs)
    fs.execute(xs)
    assert dispatch.get_executor(fs.ir_fusion).stats["compiled"] == 1 and len(_programs(fs)) == 1
    assert "_progs" not in fs.__getstate__()


def test_bad_inputs_still_raise(fake):
    from pyfuser.errors import ExecuteError
    fs = mul_add()
    xs = [torch.randn(64) for _ in range(3)]
    fs.execute(xs)
    with pytest.raises(ExecuteError):
        fs.execute(xs[:2])
    with pytest.raises(ExecuteError):
        fs.execute([xs[0], 1.0, xs[2]])
    with pytest.raises(ExecuteError, match="must be a list"):
        fs.execute(iter(xs))


@pytest.mark.parametrize("mode", L.LAUNCH_MODES)
def test_modes_on_fast_calls(fake, mode):
    fs = mul_add()
    xs = [torch.randn(100) for _ in range(3)]
    fs.execute(xs)
    for entry in dispatch.get_executor(fs.ir_fusion)._plans.values():
        entry.launcher.mode = mode
    before = fake.ex_launches
    (out,) = fs.execute(xs)
    vals = fake.launches[-1][3]
    assert (vals["T0"], vals["T4"], vals["n0"]) == (xs[0].data_ptr(), out.data_ptr(), 100)
    assert fake.ex_launches - before == (mode == "ctypes")      # the switch reached the fast call
    # the program reaches the native runner at its first hit, after the switch: made from the
    # launcher as it is now, and only for "ctypes" launches
    _check_runner(fs, fake, 1 if mode == "ctypes" else 0)


def test_fast_call_outputs_for_parameters_and_plain_tensors(fake):
    """Outputs come from new_empty_strided of a plain tensor input, else torch.empty_strided
    (an nn.Parameter input): same dtype, shape, strides either way, never the input's class."""
    fs = mul_add()
    xs = [torch.randn(50) for _ in range(3)]
    fs.execute(xs)
    (a,) = fs.execute(xs)
    ps = [torch.nn.Parameter(torch.randn(50)) for _ in range(3)]
    (b,) = fs.execute(ps)
    for out in (a, b):
        assert type(out) is torch.Tensor and not out.requires_grad
        assert (out.shape, out.stride(), out.dtype) == ((50,), (1,), torch.float32)
    assert fake.launches[-1][3]["T4"] == b.data_ptr() and fake.ex_launches == 2


def test_segmented_program_transpose_with_views(fake):
    fs = C.transpose()
    x = torch.randn(*C.SMALL_TR[0])
    (ref,) = fs.execute([x])
    kinds = [(s.kind, s.scheduler) for s in fs.last_run.segments]
    assert kinds == [("host", None), ("kernel", "transpose"), ("host", None)]
    assert len(_programs(fs)) == 1
    y = torch.randn(*C.SMALL_TR[0])
    (out,) = fs.execute([y])
    assert fs.last_run.segments[1].scheduler == "transpose"
    _, grid, block, vals = fake.launches[-1]
    assert vals["in"] == y.data_ptr() and vals["out"] == out.data_ptr()
    assert out.shape == ref.shape and out.stride() == ref.stride() and out._base is not None
    _check_runner(fs, fake, 1)


def test_segmented_program_output_view_of_input(fake):
    fs = C.gelu(two_outputs=True)
    x = torch.randn(C.SMALL_GELU[0], C.SMALL_GELU[1])
    fs.execute([x])
    y = torch.randn(C.SMALL_GELU[0], C.SMALL_GELU[1])
    view, out = fs.execute([y])
    assert view._base is y and view.shape == y.view(*C.SMALL_GELU[2]).shape
    assert y.data_ptr() in fake.launches[-1][3].values()          # the kernel reads y itself
    assert fs.last_run.kernels == 1 and fs.last_run.host_segments >= 1
    _check_runner(fs, fake, 1)


def test_views_only_program_returns_the_input_itself(fake):
    f = C.views_only()
    x = torch.randn(64, 48)
    dispatch.execute_fusion(f, [x])
    outs = dispatch.execute_fusion(f, [x])
    assert outs[2] is x and not fake.launches


def test_extra_size_is_the_parameter_block():
    pk = ParamPacker([Param(f"p{i}", "void*", ("ptr", i)) for i in range(4)] +
                     [Param("n", "int", ("numel", 3))])
    assert (pk.size, pk.args_size) == (40, 36)


def test_layout_checked_against_the_kernel(fake):
    fs = mul_add()
    fake.param_info = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8)]     # kernel says: int64 n
    with pytest.raises(D.CudaDriverError, match=r"parameter 4 \(n0\).*offset 32, size 8"):
        fs.execute([torch.randn(8) for _ in range(3)])
    dispatch.clear_caches()
    fake.param_info = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 4)]
    fs = mul_add()
    fs.execute([torch.randn(8) for _ in range(3)])                    # matches: launches
    assert fake.launches[-1][3]["n0"] == 8


def test_python_path_when_the_runner_is_unavailable(fake, monkeypatch):
    """No extension (no compiler, say): cached calls take the Python replay, same results."""
    from pyfuser.runtime import native
    monkeypatch.setattr(native, "runner_module", lambda: None)
    fs = mul_add()
    xs = [torch.randn(300) for _ in range(3)]
    fs.execute(xs)
    (out,) = fs.execute(xs)
    p = fs.ir_fusion.__dict__[dispatch._PROGS]
    assert p.run is p.py_run and not p.native and len(p.runs) == 1
    assert fake.launches[-1][3]["T4"] == out.data_ptr()


def test_a_mode_switch_drops_handed_native_programs(fake):
    """Programs already handed to the native runner go when a launcher's mode changes (the
    Python programs answer, with the new mode)."""
    fs = mul_add()
    xs = [torch.randn(100) for _ in range(3)]
    fs.execute(xs)
    fs.execute(xs)
    _check_runner(fs, fake, 1)
    for entry in dispatch.get_executor(fs.ir_fusion)._plans.values():
        entry.launcher.mode = "ptrs"
    _check_runner(fs, fake, 0)
    (out,) = fs.execute(xs)
    assert fake.launches[-1][3]["T4"] == out.data_ptr()
    _check_runner(fs, fake, 0)


def _dropout_fusion():
    from pyfuser.ir import DataType, Fusion
    from pyfuser.ir import builder as B
    f = Fusion()
    with f:
        x = B.define_tensor([-1], DataType.Float)
        keep = B.elementwise("lt", B.rand([x.logical[0].extent]), 0.9)
        f.add_output(B.elementwise("where", keep, B.elementwise("mul", x, 1 / 0.9), 0.0))
    return f


def test_random_kernels_replay_with_a_new_seed_and_offset_per_call(fake):
    """A kernel drawing random numbers takes the cached-call replay too, the native runner's
    included (it calls runtime/rng.py's launch_state per launch): every launch gets the
    generator's seed and the next offset, as the general path gives it, and the calls are
    fast-path hits."""
    from pyfuser.runtime import rng
    f = _dropout_fusion()
    x = torch.randn(1000)
    with rng.fixed(1234, 100):
        for _ in range(4):
            dispatch.execute_fusion(f, [x])
    launches = fake.launches[-4:]
    assert [v["pf_seed"] for _, _, _, v in launches] == [1234] * 4
    assert [v["pf_offset"] for _, _, _, v in launches] == [100, 104, 108, 112]
    ex = dispatch.get_executor(f)
    assert ex.last_run["cache_hit"] and ex.stats["compiled"] == 1
    progs = f.__dict__[dispatch._PROGS]
    assert len(progs.runs) == 1                         # the call was recorded and replayed
    assert (progs.native is not None and len(progs.native) == 1) == fake.native
    assert fake.ex_launches >= 3                         # the prepared launch, not the general one


def test_grid_reductions_replay_with_their_workspaces(fake):
    """A reduction split across blocks takes workspaces (partials: fresh each call; semaphores:
    one zeroed buffer per stream that every launch leaves zero): its cached calls replay, through
    the native runner too, with the same semaphores and fresh partials each call."""
    from pyfuser.ir import DataType, Fusion
    from pyfuser.ir import builder as B
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        f.add_output(B.reduction("sum", x, [0]))
    x = torch.randn(8192, 64)
    for _ in range(4):
        dispatch.execute_fusion(f, [x])
    launches = [v for _, _, _, v in fake.launches[-4:]]
    assert all({"ws0", "ws1"} <= set(v) for v in launches)       # partials, semaphores
    ex = dispatch.get_executor(f)
    fast = next(iter(ex._fast.values()))
    kinds = [kind for _, _, kind in fast.workspaces]
    assert sorted(kinds) == ["partials", "semaphores"]
    sem = "ws%d" % kinds.index("semaphores")
    assert len({v[sem] for v in launches}) == 1                  # one buffer per stream
    assert next(iter(fast.semaphores.values())).data_ptr() == launches[0][sem]
    assert ex.last_run["cache_hit"] and ex.stats["compiled"] == 1
    progs = f.__dict__[dispatch._PROGS]
    assert (progs.native is not None and len(progs.native) == 1) == fake.native
    assert fake.ex_launches >= 3                         # the prepared launch, not the general one
