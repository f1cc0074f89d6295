"""The FusionDefinition frontend: the seed-002 repros run as written (only the import changed) and
give eager's results; `fs.fusion_definition()` regenerates source that rebuilds the same fusion."""
import pytest
import torch

from pyfuser import DataType, Fusion, FusionDefinition
from pyfuser.ir import OPS


def transpose_fusion(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(symbolic_sizes=[-1, -1, -1], contiguous=[True, True, True], dtype=DataType.Float)
    T1 = fd.ops.view(T0, original_shape=[768, 128, 64], new_shape=[64, 12, 128, 64])
    T2 = fd.ops.permute(T1, dims=[0, 2, 1, 3])
    T3 = fd.ops.set(T2)
    T4 = fd.ops.view(T3, original_shape=[64, 128, 12, 64], new_shape=[64, 128, 768])
    T5 = fd.ops.view(T4, original_shape=[64, 128, 768], new_shape=[8192, 768])
    fd.add_output(T5)


def gelu_fusion(fd: FusionDefinition) -> None:
    T0 = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
    T1 = fd.ops.view(T0, original_shape=[8192, 3072], new_shape=[64, 128, 3072])
    S2 = fd.define_constant(0.500000)
    T3 = fd.ops.mul(T1, S2)
    S4 = fd.define_constant(0.707107)
    T5 = fd.ops.mul(T1, S4)
    T6 = fd.ops.erf(T5)
    S7 = fd.define_constant(1.00000)
    T8 = fd.ops.add(T6, S7)
    T9 = fd.ops.mul(T3, T8)
    T10 = fd.ops.view(T9, original_shape=[64, 128, 3072], new_shape=[8192, 3072])
    fd.add_output(T1)
    fd.add_output(T10)


def sequential_fusion(fd: FusionDefinition) -> None:
    T = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
    current_shape = [8192, 3072]
    other_shape = [64, 128, 3072]

    def insert_view(_T):
        nonlocal current_shape, other_shape
        new_shape = other_shape
        out = fd.ops.view(_T, original_shape=current_shape, new_shape=new_shape)
        other_shape, current_shape = current_shape, other_shape
        return out
    T = insert_view(T)  # A
    T = fd.ops.add(T, T)
    T = insert_view(T)  # B
    T = fd.ops.mul(T, T)
    T = insert_view(T)  # C
    fd.add_output(T)


def define(fn) -> Fusion:
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        fn(fd)
    return fs


def rebuild(fs: Fusion) -> Fusion:
    """The fusion the printed definition builds: the same FusionCache entry (same id)."""
    namespace = {}
    exec(fs.fusion_definition(), namespace)
    fs2 = define(namespace[f"nvfuser_fusion_id{fs.id()}"])
    assert fs2.id() == fs.id() and fs2.ir_fusion is fs.ir_fusion
    return fs2


def test_transpose_repro_matches_eager_and_regenerates():
    fs = define(transpose_fusion)
    x = torch.randn(768, 128, 64)
    (out,) = fs.execute([x])
    assert torch.equal(out, x.view(64, 12, 128, 64).permute(0, 2, 1, 3).reshape(8192, 768))
    fs2 = rebuild(fs)
    assert str(fs2) == str(fs)
    assert torch.equal(fs2.execute([x])[0], out)


def test_gelu_repro_matches_eager_and_aliases_view_output():
    fs = define(gelu_fusion)
    x = torch.randn(8192, 3072, generator=torch.Generator().manual_seed(0))
    t1, t10 = fs.execute([x])
    v = x.view(64, 128, 3072)
    ref = ((v * 0.5) * (torch.erf(v * 0.707107) + 1.0)).view(8192, 3072)
    assert torch.equal(t1, v) and t1.data_ptr() == x.data_ptr()
    assert torch.equal(t10, ref)
    assert str(rebuild(fs)) == str(fs)


def test_sequential_view_fusion_matches_eager():
    fs = define(sequential_fusion)
    x = torch.randn(8192, 3072, generator=torch.Generator().manual_seed(1))
    (out,) = fs.execute([x])
    a = x.view(64, 128, 3072)
    b = (a + a).view(8192, 3072)
    assert out.shape == (64, 128, 3072)
    assert torch.equal(out, (b * b).view(64, 128, 3072))
    assert str(rebuild(fs)) == str(fs)


def test_printing_and_generated_source():
    fs = define(gelu_fusion)
    text = str(fs)
    assert text.startswith("%kernel {") and "= erff(" in text and "TransformPrinter :" in text
    src = fs.fusion_definition()
    assert src.split("\n")[1] == f"def nvfuser_fusion_id{fs.id()}(fd : FusionDefinition) -> None :"
    assert "fd.ops.erf(T" in src and src.count("fd.add_output(") == 2


def test_every_table_op_is_in_fd_ops():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t = fd.define_tensor(symbolic_sizes=[-1], dtype=DataType.Float)
        for name in OPS:
            assert callable(getattr(fd.ops, name)), name
        fd.add_output(fd.ops.sqrt(t))


def test_scalars_reductions_and_generated_source_roundtrip():
    def fusion(fd):
        t0 = fd.define_tensor(shape=[-1, 4], contiguous=[True, True], dtype=DataType.Half)
        s0 = fd.define_scalar(DataType.Double)
        s1 = fd.define_scalar(2, dtype=DataType.Int)
        t1 = fd.ops.cast(t0, dtype=DataType.Float)
        t2 = fd.ops.mul(t1, s0)
        t3 = fd.ops.sum(t2, axes=[1], keepdim=True)
        t4 = fd.ops.broadcast_in_dim(t3, output_shape=[3, 4], broadcast_dims=[0, 1])
        var, mean = fd.ops.var_mean(t1, axes=[0], correction=1, keepdim=False)
        t5 = fd.ops.where(fd.ops.gt(t1, s1), t4, fd.ops.neg(t4))
        t6 = fd.ops.clamp(t5, -1.0, 1.0)
        fd.add_output(fd.ops.cast(t6, dtype=DataType.Half))
        fd.add_output(var)
        fd.add_output(fd.ops.max(t1, axes=[0]))
    fs = define(fusion)
    x = torch.randn(3, 4, dtype=torch.float16, generator=torch.Generator().manual_seed(2))
    out, var, mx = fs.execute([x, 0.75])
    x32 = x.float()
    t4 = (x32 * 0.75).sum(1, keepdim=True).expand(3, 4)
    ref = torch.clamp(torch.where(x32 > 2, t4, -t4), -1.0, 1.0).half()
    assert out.dtype == torch.float16 and torch.equal(out, ref)
    torch.testing.assert_close(var, torch.var(x32, 0))
    assert torch.equal(mx, x32.amax(0))
    fs2 = rebuild(fs)
    assert str(fs2) == str(fs)
    assert torch.equal(fs2.execute([x, 0.75])[0], out)


def test_execute_goes_through_dispatch(monkeypatch):
    import pyfuser.runtime.dispatch as dispatch
    calls = []
    real = dispatch.execute_fusion
    monkeypatch.setattr(dispatch, "execute_fusion", lambda f, i: calls.append(f) or real(f, i))
    fs = define(transpose_fusion)
    fs.execute([torch.randn(768, 128, 64)])
    assert calls == [fs.ir_fusion]


def test_noncontiguous_input_is_fine_for_the_evaluator():
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=DataType.Float)
        fd.add_output(fd.ops.exp(t))
    x = torch.randn(5, 3).t()
    assert torch.equal(fs.execute([x])[0], torch.exp(x))


@pytest.mark.parametrize("alias,target", [("truediv", "div"), ("mod", "fmod")])
def test_aliases(alias, target):
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        t = fd.define_tensor(symbolic_sizes=[-1], dtype=DataType.Float)
        fd.add_output(getattr(fd.ops, alias)(t, 3.0))
    x = torch.randn(6)
    assert torch.equal(fs.execute([x])[0], OPS[target].ref(x, 3.0))
