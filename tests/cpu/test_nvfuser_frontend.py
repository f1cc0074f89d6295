"""nvFuser's Python frontend on pyfuser: programs in the style of nvFuser's own frontend tests
(only the module name changed) give eager's results, print as Python that rebuilds the same
cached fusion, and every form of the API of that era works (docs/nvfuser_frontend.md)."""
import itertools
import re

import pytest
import torch

import pyfuser
from pyfuser import DataType, Fusion, FusionCache, FusionDefinition, compute_contiguity, version
from pyfuser.errors import ExecuteError, FusionDefinitionError
from pyfuser.pytorch_utils import nvfuser_dtype_to_torch_dtype, torch_dtype_to_nvfuser_dtype

from nvfuser_frontend_cases import CASES  # noqa: E402


def exec_nvfuser(fusion_func, inputs, new_fusion_expected=True):
    """What nvFuser's suites do: define, execute, print, run the printed source, compare."""
    inputs_cap = [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]
    fc = FusionCache.get()
    before = fc.num_fusions()
    with FusionDefinition() as fd:
        fusion_func(fd)
    text = repr(fd)
    torch.manual_seed(0)
    out = fd.execute(inputs)
    name = re.findall(r"(nvfuser_fusion_id\d+)", text.split("\n")[1])[0]
    namespace = {}
    exec(text, namespace)
    with FusionDefinition() as fd_cap:
        namespace[name](fd_cap)
    assert fd_cap.id() == fd.id() and repr(fd_cap) == text
    torch.manual_seed(0)
    out_cap = fd_cap.execute(inputs_cap)
    for a, b in zip(out, out_cap):
        assert torch.equal(a, b)
    assert fc.num_fusions() - before == int(new_fusion_expected)
    return out, fd


def assert_matches(out, want):
    """Equal to eager within float32 rounding (a float32 sum reduced in another order than
    eager's may differ in its last bit, also after a cast to float64)."""
    assert len(out) == len(want)
    for o, w in zip(out, want):
        assert o.dtype == w.dtype and o.shape == w.shape, (o.dtype, w.dtype, o.shape, w.shape)
        tol = {} if not o.dtype.is_floating_point else {"rtol": 1e-6, "atol": 1e-6}
        torch.testing.assert_close(o.cpu(), w.cpu(), equal_nan=True, **tol)


@pytest.mark.parametrize("name", sorted(CASES))
def test_case_matches_eager_and_its_printed_definition(name):
    fusion, make_inputs, eager = CASES[name]
    inputs = make_inputs("cpu")
    want = eager([x.clone() if isinstance(x, torch.Tensor) else x for x in inputs])
    out, fd = exec_nvfuser(lambda fd: fusion(fd, inputs), [x.clone() if isinstance(x, torch.Tensor)
                                                          else x for x in inputs])
    assert_matches(out, want)
    # the same definition again: a cache hit, same id, same results
    out2, fd2 = exec_nvfuser(lambda fd: fusion(fd, inputs), make_inputs("cpu"),
                             new_fusion_expected=False)
    assert fd2.id() == fd.id()
    assert_matches(out2, want)


# ---- FusionCache, Fusion and FusionDefinition forms ----------------------------------------------
def _relu(fd):
    fd.add_output(fd.ops.relu(fd.define_tensor(symbolic_sizes=[-1, -1], dtype=DataType.Float)))


def test_fusion_cache_ids_and_hits_in_every_form():
    fc = FusionCache.get()
    assert FusionCache.get() is fc and fc.num_fusions() == 0
    fs1 = Fusion()
    with FusionDefinition(fs1) as fd:
        _relu(fd)
    fs2 = Fusion()
    fd2 = FusionDefinition(fs2)
    with fd2:
        _relu(fd2)
    with FusionDefinition() as fd3:
        _relu(fd3)
        fd3.add_output(fd3.ops.relu(fd3.define_tensor(2)))     # a different definition
    assert fc.num_fusions() == 2
    assert fs1.id() == fs2.id() == fd2.id() == 0 and fd3.id() == 1
    assert fs1.ir_fusion is fs2.ir_fusion
    x = torch.randn(3, 4)
    fs3 = Fusion(fs2.id())
    fd4 = FusionDefinition(fd3.id())
    assert torch.equal(fs3.execute([x])[0], x.relu())
    assert torch.equal(fd4.execute([x, x])[1], x.relu())
    assert repr(fd4) == repr(fd3)
    with pytest.raises(FusionDefinitionError, match="no fusion with id 7"):
        Fusion(7)
    FusionCache.reset()
    assert FusionCache.get() is not fc and FusionCache.get().num_fusions() == 0


def test_printed_definition_is_nvfusers_shape_and_names_every_value():
    x = torch.randn(2, 3)
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(x)
        sizes = fd.ops.tensor_sizes(t0)
        t1 = fd.ops.where(t0 > 0.0, fd.define_constant(float("-inf")), t0 / sizes[1])
        fd.add_output(t1, stride_order=[1, 0])
        fd.add_output(fd.ops.full([2], fd.define_constant(1 + 2j), DataType.ComplexDouble))
    lines = repr(fd).split("\n")
    assert lines[0] == "from pyfuser import FusionDefinition, DataType"
    assert lines[1] == f"def nvfuser_fusion_id{fd.id()}(fd : FusionDefinition) -> None :"
    assert "    S1, S2 = fd.ops.tensor_sizes(T0)" in lines
    assert "float('-inf')" in repr(fd) and "(1+2j)" in repr(fd)
    assert "fd.add_output(T6, stride_order=[1, 0])" in repr(fd)
    assert str(fd) == repr(fd) == fd.fusion.fusion_definition()


# ---- define_tensor / from_pytorch ----------------------------------------------------------------
def _define(*args, **kwargs):
    with FusionDefinition() as fd:
        t = fd.define_tensor(*args, **kwargs)
        fd.add_output(fd.ops.set(t))
    return fd, repr(fd).split("\n")[2].strip()


@pytest.mark.parametrize("args,kwargs,line", [
    ((3,), {}, "symbolic_sizes=[-1, -1, -1], contiguous=[False, False, False], dtype=DataType.Float"),
    ((2, DataType.Half), {}, "symbolic_sizes=[-1, -1], contiguous=[False, False], dtype=DataType.Half"),
    (([3, 1], [1, 1]), {}, "symbolic_sizes=[-1, 1], contiguous=[True, None], dtype=DataType.Float"),
    ((), dict(sizes=[2, 3], strides=[3, 1], dtype=DataType.Int),
     "symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Int"),
    ((), dict(sizes=[2, 3], strides=[3, 1], static_sizes=True),
     "symbolic_sizes=[2, 3], contiguous=[True, True], dtype=DataType.Float"),
    ((), dict(sizes=[2, 3], strides=[1, 2]),
     "symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float, stride_order=[0, 1]"),
    ((), dict(symbolic_sizes=[-1, 1, 4], contiguous=[True, None, True]),
     "symbolic_sizes=[-1, 1, 4], contiguous=[True, None, True], dtype=DataType.Float"),
    (([-1, -1], [True, False], DataType.Double), {},
     "symbolic_sizes=[-1, -1], contiguous=[True, False], dtype=DataType.Double"),
    ((), dict(shape=[-1], contiguity=[True], dtype=DataType.Bool),
     "symbolic_sizes=[-1], contiguous=[True], dtype=DataType.Bool"),
    ((), dict(shape=[], dtype=DataType.Double, is_cpu=True),
     "symbolic_sizes=[], contiguous=[], dtype=DataType.Double, is_cpu=True"),
    ((), dict(shape=[-1, -1], stride_order=[0, 1]),
     "symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float, stride_order=[0, 1]"),
])
def test_define_tensor_forms_record_one_canonical_call(args, kwargs, line):
    _, recorded = _define(*args, **kwargs)
    assert recorded == f"T0 = fd.define_tensor({line})"


def test_from_pytorch_equals_sizes_and_strides_and_serves_other_sizes():
    x = torch.randn(4, 1, 6)
    ids = set()
    for make in (lambda fd: fd.from_pytorch(x),
                 lambda fd: fd.define_tensor(sizes=x.size(), strides=x.stride()),
                 lambda fd: fd.define_tensor(x.size(), x.stride(), DataType.Float)):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.exp(make(fd)))
        ids.add(fd.id())
    assert len(ids) == 1
    y = torch.randn(9, 1, 2)
    assert torch.equal(fd.execute([y])[0], y.exp())
    with pytest.raises(ExecuteError, match="axis 1 was defined as broadcast"):
        fd.execute([torch.randn(9, 2, 2)])


def test_layouts_from_strides():
    assert compute_contiguity([2, 1, 3, 1, 4, 5, 6], [80, 30, 30, 7, 0, 6, 1]) == \
        [False, None, True, None, None, True, True]
    assert compute_contiguity([2, 3], [1, 2]) == [False, False]
    _, line = _define(sizes=[5, 5, 5], strides=[5, 1, 0])   # an expanded axis
    assert "contiguous=[True, True, None]" in line
    with FusionDefinition() as fd:
        fd.add_output(fd.ops.neg(fd.from_pytorch(torch.randn(3, 4).t())))
    assert "stride_order=[0, 1]" in repr(fd)
    x = torch.randn(5, 7).t()
    assert torch.equal(fd.execute([x])[0], -x)


def test_concrete_symbolic_sizes_are_checked_at_execute():
    fd, _ = _define(symbolic_sizes=[-1, 4])
    assert fd.execute([torch.ones(2, 4)])[0].shape == (2, 4)
    with pytest.raises(ExecuteError, match="axis 1 must have size 4, got 5"):
        fd.execute([torch.ones(2, 5)])


@pytest.mark.parametrize("kwargs,message", [
    (dict(symbolic_sizes=[-1], sizes=[2], strides=[1]), "exactly one of"),
    (dict(sizes=[2, 3]), "sizes= needs strides="),
    (dict(sizes=[2], strides=[1, 1]), "1 sizes but 2 strides"),
    (dict(shape=[-1], contiguous=[True], contiguity=[True]), "not both"),
    (dict(shape=[-1, -1], is_cpu=True), "is_cpu=True is for 0-dim"),
    (dict(shape=[-1], stride_order=[1]), "not a permutation"),
    (dict(shape=[-1], dtype=torch.float32), "dtype must be a DataType"),
    (dict(shape=[-1], layout=1), "unknown argument 'layout'"),
])
def test_define_tensor_errors_name_the_argument(kwargs, message):
    with pytest.raises(FusionDefinitionError, match=message) as info:
        with FusionDefinition() as fd:
            fd.define_tensor(**kwargs)
    assert "FusionDefinition statement 1, fd.define_tensor" in str(info.value)


def test_from_pytorch_takes_cpu_tensors_and_marks_cpu_scalars():
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(torch.tensor(2.0))
        t1 = fd.from_pytorch(torch.randn(3))
        fd.add_output(t1 * t0)
    assert "is_cpu=True" in repr(fd).split("\n")[2] and "is_cpu" not in repr(fd).split("\n")[3]
    x = torch.randn(3)
    assert torch.equal(fd.execute([torch.tensor(2.0), x])[0], x * 2.0)
    with pytest.raises(FusionDefinitionError, match="from_pytorch: expects a torch.Tensor"):
        with FusionDefinition() as fd:
            fd.from_pytorch([1, 2])


# ---- scalars and nvFuser's typing rule -----------------------------------------------------------
SCALAR_DTYPES = [(3.0, None, torch.float64), (3.0, DataType.Float, torch.float32),
                 (3.0, DataType.Double, torch.float64), (3, DataType.Int32, torch.int32),
                 (3, None, torch.int64), (complex(3.0), None, torch.complex128),
                 (3.0 + 0j, DataType.ComplexFloat, torch.complex64),
                 (3.0 + 0j, DataType.ComplexDouble, torch.complex128),
                 (True, DataType.Bool, torch.bool), (2, DataType.Half, torch.float16),
                 (2, DataType.BFloat16, torch.bfloat16), (2, DataType.Int, torch.int64)]


@pytest.mark.parametrize("define", ["define_constant", "define_scalar"])
def test_where_of_constants_takes_their_dtype(define):
    cond = torch.tensor([True, False])
    with FusionDefinition() as fd:
        t0 = fd.from_pytorch(cond)
        for value, dtype, _ in SCALAR_DTYPES:
            make = getattr(fd, define)
            a = make(value) if dtype is None else make(value, dtype)
            b = make(value) if dtype is None else make(value, dtype=dtype)
            fd.add_output(fd.ops.where(t0, a, b))
    outs = fd.execute([cond])
    for out, (value, _, want) in zip(outs, SCALAR_DTYPES):
        assert out.dtype == want
        assert torch.equal(out, torch.full((2,), value, dtype=want))


def _times_half(v):
    return v * 0.5


def test_nvfuser_and_eager_typing_side_by_side():
    """Inside a FusionDefinition a Python float is a Double scalar; in a TorchScript graph it is
    a wrapped number (eager's rule). int tensor * 0.5: float64 here, float32 in eager."""
    x = torch.arange(4)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(t * 0.5)
        fd.add_output(t * fd.define_constant(0.5, DataType.Float))
    a, b = fd.execute([x])
    assert a.dtype == torch.float64 and torch.equal(a, x.double() * 0.5)
    assert b.dtype == torch.float32 and torch.equal(b, x * 0.5)
    fused = pyfuser.jit(torch.jit.script(_times_half))
    assert fused(x).dtype == torch.float32 and torch.equal(fused(x), x * 0.5)


def test_scalar_inputs_and_scalar_arithmetic():
    with FusionDefinition() as fd:
        s0, s1 = fd.define_scalar(), fd.define_scalar(dtype=DataType.Int)
        t = fd.define_tensor(1, DataType.Double)
        fd.add_output(t * (s0 + s1) - s0 ** 2)
    x = torch.randn(3, dtype=torch.float64)
    assert torch.equal(fd.execute([0.25, 3, x])[0], x * 3.25 - 0.0625)


# ---- ops with nvFuser's signatures ---------------------------------------------------------------
def test_reductions_positional_and_keyword():
    x = torch.randn(2, 4, 8)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(fd.ops.prod(t, DataType.Double))
        fd.add_output(fd.ops.prod(t, 1, False, DataType.Float))
        fd.add_output(fd.ops.sum(t, [-1], True))
        fd.add_output(fd.ops.max(t, axes=[0, 2], keepdim=False, dtype=DataType.Null))
        fd.add_output(fd.ops.min(t, [1]))
        fd.add_output(fd.ops.mean(t, [2], False))
        fd.add_output(fd.ops.var(t, [1], 1, True))
        var, mean = fd.ops.var_mean(t, [0, 1, 2], 0)
        fd.add_output(var)
        fd.add_output(mean)
    outs = fd.execute([x])
    want = [x.double().prod(), x.prod(1), x.sum(-1, keepdim=True), x.amax([0, 2]), x.amin(1),
            x.mean(2), x.var(1, keepdim=True), *torch.var_mean(x, [0, 1, 2], correction=0)]
    assert_matches(outs, want)


@pytest.mark.parametrize("kind", ["normal", "uniform"])
def test_random_ops_use_torchs_generator(kind):
    x = torch.empty(64, 128)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        a, b = fd.define_constant(3.5), fd.define_constant(5.0)
        fd.add_output(getattr(fd.ops, kind)(a, b, fd.ops.tensor_sizes(t), DataType.Double))
        fd.add_output(getattr(fd.ops, kind)(a, b, shape=[2, 3]))
    torch.manual_seed(11)
    r, small = fd.execute([x])
    torch.manual_seed(11)
    want = torch.empty(64, 128, dtype=torch.float64)
    want = want.normal_(3.5, 5.0) if kind == "normal" else want.uniform_(3.5, 5.0)
    assert torch.equal(r, want) and small.shape == (2, 3) and small.dtype == torch.float32


def test_output_stride_order_every_permutation():
    x = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4)
    for perm in itertools.permutations(range(3)):
        with FusionDefinition() as fd:
            fd.add_output(fd.ops.add(fd.from_pytorch(x), 3.0), perm)
        (out,) = fd.execute([x])
        assert torch.equal(out, x + 3.0)
        by_rank = [0] * 3
        for axis, rank in enumerate(perm):
            by_rank[rank] = out.stride()[axis]
        assert by_rank == sorted(by_rank, reverse=True) and by_rank[-1] == 1


def test_alias_input_writes_the_input_and_is_not_returned():
    x = torch.ones(3)
    with FusionDefinition() as fd:
        t = fd.from_pytorch(x)
        fd.add_output(t * 2, alias_input=t)
    assert fd.execute([x]) == [] and torch.equal(x, torch.full((3,), 2.0))
    with pytest.raises(FusionDefinitionError, match="alias_input must be a tensor input"):
        with FusionDefinition() as fd:
            t = fd.from_pytorch(x)
            fd.add_output(t * 2, alias_input=t * 3)


def test_alias_input_runs_as_a_kernel():
    """An in-place output is computed by a kernel (no eager segment) and written into its input;
    a per-row one of a reduction kernel (a running mean) by the kernel itself."""
    x, rm = torch.randn(6, 40), torch.randn(6)
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t = fd.from_pytorch(x)
        r = fd.from_pytorch(rm)
        fd.add_output(fd.ops.sum(t, [1]))
        fd.add_output(r * 0.9 + fd.ops.mean(t, [1]) * 0.1, alias_input=r)
    want_rm = rm * 0.9 + x.mean(1) * 0.1
    (s,) = fs.execute([x, rm])
    torch.testing.assert_close(s, x.sum(1))
    torch.testing.assert_close(rm, want_rm)
    assert fs.last_run.kernels == 1 and fs.last_run.eager_segments == 0, fs.last_run
    y = torch.randn(5, 7)
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t = fd.from_pytorch(y)
        fd.add_output(fd.ops.relu(t) + 1, alias_input=t)
    want = torch.relu(y) + 1
    assert fs.execute([y]) == [] and torch.equal(y, want)
    assert fs.last_run.kernels == 1 and fs.last_run.eager_segments == 0, fs.last_run


def test_handles_shape_ndim_methods_and_identity():
    with FusionDefinition() as fd:
        t = fd.define_tensor(symbolic_sizes=[-1, 1, 5], dtype=DataType.Float)
        assert t.ndim == 3 and t.dtype is DataType.Float and t._get_fusion_definition() is fd
        b, one, c = t.shape
        assert len(t.shape()) == 3 and isinstance(c, pyfuser.Scalar)
        assert isinstance(t, pyfuser.Tensor) and {t: 1}[t] == 1 and (t == t) and t != b
        with pytest.raises(TypeError, match="only known when the fusion runs"):
            bool(t > 0)
        with pytest.raises(AttributeError, match="has no attribute 'frobnicate'"):
            t.frobnicate
        fd.add_output(fd.ops.div(t.squeeze([-1, 1, 5], [1]), c).neg())
    x = torch.randn(4, 1, 5)
    assert torch.equal(fd.execute([x])[0], -(x.squeeze(1) / 5))


# ---- the subclass form and user schedules ------------------------------------------------------
def test_subclass_definition_and_schedule():
    x = torch.randn(4, 4, 4)

    class UserSched(FusionDefinition):
        def definition(self):
            self.t0 = self.from_pytorch(x)
            self.t1 = self.ops.sigmoid(self.t0)
            self.add_output(self.t1)

        def schedule(self):
            self.sched.split(self.t1, 1, 2)
            self.sched.merge(self.t1, -2)

    fd = UserSched()
    a = fd.execute([x])
    b = fd.execute([x], override_user_schedule=True)
    assert torch.equal(a[0], torch.sigmoid(x)) and torch.equal(a[0], b[0])
    assert [c[0] for c in fd.sched.calls] == ["split", "merge"]


def test_subclass_errors_are_runtime_errors_naming_what():
    x = torch.randn(4, 4)

    class DefError(FusionDefinition):
        def definition(self):
            t1 = self.ops.tanh(self.from_pytorch(x))
            self.add_output(t1)
            self.sched.merge(t1, 1)

    class SchedError(FusionDefinition):
        def definition(self):
            self.t1 = self.ops.tanh(self.from_pytorch(x))
            self.add_output(self.t1)

        def schedule(self):
            self.ops.relu(self.t1)

    class BadAxis(SchedError):
        def schedule(self):
            self.sched.split(self.t1, 5, 2)

    with pytest.raises(RuntimeError, match="only valid inside schedule\\(\\).*inside definition"):
        DefError().execute([x])
    with pytest.raises(RuntimeError, match="relu: schedule\\(\\) may only make scheduling calls"):
        SchedError().execute([x])
    with pytest.raises(RuntimeError, match="axis 5 is out of range for the 2 loop axes"):
        BadAxis().execute([x])
    with pytest.raises(NotImplementedError, match="never defined"):
        FusionDefinition().execute([x])


# ---- errors ---------------------------------------------------------------------------------------
def test_errors_name_definition_statement_and_call():
    class Mine(FusionDefinition):
        def definition(self):
            t = self.define_tensor(2)
            self.ops.gather(t, t, 0)

    with pytest.raises(FusionDefinitionError) as info:
        Mine().execute([torch.randn(2, 2)])
    assert str(info.value).startswith("FusionDefinition Mine statement 2, fd.ops.gather: gather: "
                                      "the index tensor T0_g must be Int or Int32")
    with pytest.raises(FusionDefinitionError) as info:
        with FusionDefinition() as fd:
            fd.define_tensr(3)
    assert "FusionDefinition has no attribute 'define_tensr'" in str(info.value)
    assert "fd.ops" not in str(info.value)
    with pytest.raises(FusionDefinitionError, match="fd.ops has no op named 'frobnicate'"):
        with FusionDefinition() as fd:
            fd.ops.frobnicate(fd.define_tensor(1))
    with pytest.raises(FusionDefinitionError, match="slice: end index 9 of axis 0 is past its size 4"):
        with FusionDefinition() as fd:
            fd.ops.slice(fd.define_tensor(shape=[4]), [0], [9], [1])
    with pytest.raises(RuntimeError, match="must have rank 2"):
        fd = FusionDefinition()
        with fd:
            _relu(fd)
        fd.execute([torch.ones(3)])
    with pytest.raises(FusionDefinitionError, match="unknown option"):
        fd.execute([torch.ones(3, 3)], device=1)


# ---- module-level API of that era ---------------------------------------------------------------
def test_version_contiguity_dtypes_and_module_names():
    from pyfuser._C import DataType as CDataType, Fusion as CFusion, FusionCache as CCache
    from pyfuser.nvfuser_version import Version
    assert CDataType is DataType and CFusion is Fusion and CCache is FusionCache
    assert version() > "0.0.0" and version() > Version("0.0.0") and version() == pyfuser.__version__
    assert Version("0.1") == Version("0.1.0") < "0.10"
    assert torch_dtype_to_nvfuser_dtype(torch.bfloat16) is DataType.BFloat16
    assert torch_dtype_to_nvfuser_dtype(float) is DataType.Double
    assert nvfuser_dtype_to_torch_dtype(DataType.ComplexFloat) is torch.complex64
    with pytest.raises(FusionDefinitionError, match="no DataType for"):
        torch_dtype_to_nvfuser_dtype(torch.uint16)
    assert DataType.Null is None


def test_scalar_first_comparison_on_a_sliced_input_with_a_reduction():
    """`fd.ops.eq(S, T)` with the scalar first, on a slice (a non-contiguous kernel input), in a
    fusion with a reduction: the output-layout pass ran `torch.eq(0.0, tensor)` on meta tensors,
    which torch rejects (found by nvFuser's test_nanogpt_mha_dpa)."""
    x = torch.randn(2, 3, 4, 4)
    mask = torch.randint(0, 2, (1, 1, 8, 8)).float()

    def fusion_func(fd):
        t0 = fd.define_tensor(symbolic_sizes=[-1, -1, -1, -1], contiguous=[True] * 4,
                              dtype=DataType.Float)
        t1 = fd.define_tensor(symbolic_sizes=[1, 1, -1, -1], contiguous=[None, None, True, True],
                              dtype=DataType.Float)
        t2 = fd.ops.slice(t1, start_indices=[0, 0, 0, 0], end_indices=[1, 1, 4, 4],
                          strides=[1, 1, 1, 1])
        t3 = fd.ops.eq(fd.define_constant(0.0), t2)
        t4 = fd.ops.broadcast_in_dim(t3, output_shape=[2, 3, 4, 4], broadcast_dims=[0, 1, 2, 3])
        t5 = fd.ops.where(t4, fd.define_constant(float("-inf")), t0)
        t6 = fd.ops.max(t5, axes=[3], keepdim=False, dtype=DataType.Null)
        fd.add_output(t6)

    out, _ = exec_nvfuser(fusion_func, [x, mask])
    want = torch.where(mask[:, :, :4, :4] == 0.0, float("-inf"), x).amax(3)
    torch.testing.assert_close(out[0], want)
