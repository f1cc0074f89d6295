"""Review of host segments and replayed programs: views at the fusion's edges alias as eager does,
copies made by a host reshape (a declared-contiguous input that is not) are never replaced by the
input's own pointer on a replay, and every layout change of an input (strides, stride 0, storage
offset, same tensor twice) reaches the kernel as this call's tensor.

The CUDA fast path runs against the fake driver of test_runtime_fastpath.py."""
import os
import sys

import pytest
import torch

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-bindings (NVRTC) is not installed")

from pyfuser import DataType, Fusion, FusionDefinition  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

_fp = load_module_from_path("_fp2", os.path.join(
    os.path.dirname(__file__), "test_runtime_fastpath.py"), fresh=True, register=False)
fake = _fp.fake
F = DataType.Float


def _out_and_views():
    """y = relu(x); outputs y, reshape(y) and permute(y): the views are host segments of y."""
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        x = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=F)
        y = fd.ops.relu(x)
        fd.add_output(y)
        fd.add_output(fd.ops.reshape(y, [-1]))
        fd.add_output(fd.ops.permute(y, dims=[1, 0]))
    return fs


def _view_in():
    """reshape of a (declared contiguous) input, then compute: the reshape is a host segment."""
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        x = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=F)
        fd.add_output(fd.ops.relu(fd.ops.reshape(x, [-1])))
    return fs


def _ptrs(launch):
    return [v for k, v in launch[3].items() if k.startswith("T")]


def test_replayed_output_views_alias_the_output(fake):
    fs = _out_and_views()
    for _ in range(3):
        x = torch.randn(8, 6)
        y, flat, tr = fs.execute([x])
        assert fs.last_run.host_segments == 1 and fs.last_run.kernels == 1
        assert flat._base is y and tr._base is y
        assert (flat.shape, flat.stride(), tr.shape, tr.stride()) == ((48,), (1,), (6, 8), (1, 6))
        assert _ptrs(fake.launches[-1]) == [x.data_ptr(), y.data_ptr()]
    assert len(_fp._programs(fs)) == 1


def test_output_reshape_that_copies_is_not_replayed_as_a_view(fake):
    """x transposed: y = relu(x) is laid out as x (as eager), so reshape(y) copies, as in eager;
    a replay must not turn it into a view of y (which would read y in the wrong order)."""
    fs = _out_and_views()
    for _ in range(3):
        x = torch.randn(6, 8).t()
        y, flat, tr = fs.execute([x])
        assert y.stride() == x.stride() and y.reshape(-1)._base is None
        assert flat._base is not y and flat.data_ptr() != y.data_ptr()
        assert tr._base is y and tr.is_contiguous()


def test_host_reshape_copy_is_not_replayed_as_the_input(fake):
    """x declared contiguous, given transposed: the host reshape copies, so the kernel must read
    the copy (a replay passing x's own pointer would read it in the wrong order)."""
    fs = _view_in()
    for _ in range(3):
        x = torch.randn(6, 8).t()
        fs.execute([x])
        assert fake.launches[-1][3]["T1"] != x.data_ptr()
    contiguous = torch.randn(8, 6)
    for _ in range(2):
        fs.execute([contiguous])
        assert fake.launches[-1][3]["T1"] == contiguous.data_ptr()   # a view: x itself


@pytest.mark.parametrize("make", [
    lambda: torch.randn(8, 6),
    lambda: torch.randn(6, 8).t(),                       # transposed
    lambda: torch.randn(8, 12)[:, ::2],                  # strided
    lambda: torch.randn(1, 6).expand(8, 6),              # stride 0
    lambda: torch.randn(49)[1:].view(8, 6),              # storage offset: 4-byte alignment
])
def test_each_layout_launches_this_calls_tensor(fake, make):
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        a = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=F)
        b = fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[True, True], dtype=F)
        fd.add_output(fd.ops.add(a, b))
    plain = torch.randn(8, 6)
    fs.execute([plain, plain])                           # a program for contiguous inputs first
    for _ in range(2):
        x, y = make(), make()
        (out,) = fs.execute([x, y])
        vals = fake.launches[-1][3]
        assert [vals["T0"], vals["T1"]] == [x.data_ptr(), y.data_ptr()]
        assert vals["T2"] == out.data_ptr() and out.shape == (8, 6)
        (same,) = fs.execute([x, x])                     # the same tensor twice
        vals = fake.launches[-1][3]
        assert [vals["T0"], vals["T1"], vals["T2"]] == [x.data_ptr(), x.data_ptr(), same.data_ptr()]
        assert same.data_ptr() != x.data_ptr()


# ---- values and aliasing against eager, on the evaluator and the interpreter -------------------
_CASES = {
    "permute_in": (lambda fd, a, b: [fd.ops.relu(fd.ops.permute(a, dims=[1, 0]))],
                   lambda a, b: [torch.relu(a.permute(1, 0))]),
    "permute_in_add": (lambda fd, a, b: [fd.ops.add(fd.ops.permute(a, dims=[1, 0]), b)],
                       lambda a, b: [a.permute(1, 0) + b]),
    "reshape_in": (lambda fd, a, b: [fd.ops.mul(fd.ops.reshape(a, [-1]), fd.ops.reshape(b, [-1]))],
                   lambda a, b: [a.reshape(-1) * b.reshape(-1)]),
    "out_and_views": (lambda fd, a, b: (lambda y: [y, fd.ops.reshape(y, [-1]),
                                                   fd.ops.permute(y, dims=[1, 0]), a])(
                          fd.ops.add(a, b)),
                      lambda a, b: (lambda y: [y, y.reshape(-1), y.permute(1, 0), a])(a + b)),
}
_LAYOUTS = {
    "contiguous": lambda: torch.randn(6, 6),
    "transposed": lambda: torch.randn(6, 6).t(),
    "strided": lambda: torch.randn(6, 12)[:, ::2],
    "expanded": lambda: torch.randn(1, 6).expand(6, 6),
    "offset": lambda: torch.randn(37)[1:].view(6, 6),
    "size0": lambda: torch.randn(0, 6).t().t(),
    "size1": lambda: torch.randn(6, 1).expand(6, 6)[:1],
}


@pytest.mark.parametrize("mode", ["evaluator", "interpret"])
@pytest.mark.parametrize("case", sorted(_CASES))
@pytest.mark.parametrize("declared", [True, False])
def test_edges_match_eager(monkeypatch, mode, case, declared):
    """Declared contiguous or not, every layout: the values eager gives, outputs laid out as eager
    lays them out (non-size-1 axes), views of outputs and inputs aliasing where eager's do."""
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", mode)
    body, ref = _CASES[case]
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        a, b = (fd.define_tensor(symbolic_sizes=[-1, -1], contiguous=[declared] * 2, dtype=F)
                for _ in range(2))
        for o in body(fd, a, b):
            fd.add_output(o)
    for name, make in _LAYOUTS.items():
        for _ in range(2):
            a, b = make(), make()
            if case == "permute_in_add":
                b = b.t() if b.dim() == 2 else b
            outs, refs = fs.execute([a, b]), ref(a, b)
            assert len(outs) == len(refs)
            for k, (o, r) in enumerate(zip(outs, refs)):
                where = f"{case} {name} output {k}"
                assert o.shape == r.shape, where
                torch.testing.assert_close(o, r, msg=where)
                keep = [i for i, n in enumerate(r.shape) if n != 1]
                if r.numel() > 1:
                    assert [o.stride(i) for i in keep] == [r.stride(i) for i in keep], where
                assert (o._base is None) == (r._base is None) or o is a, where
            if case == "out_and_views":
                assert outs[3] is a
                if refs[1]._base is not None:
                    assert outs[1]._base is outs[0] and outs[2]._base is outs[0]
