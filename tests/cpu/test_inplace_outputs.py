"""In-place outputs (Fusion.aliases) of pointwise and horizontal kernels: written by the kernel
into their input's storage where every load of the input is at the element the store writes
(schedule/pointwise_inplace.py), else computed fresh and copied in after the kernels (counted in
the RunReport's `copies`). Kernels run on the CPU interpreter, compiled by NVRTC first."""
import pytest
import torch

from pyfuser.ir import builder as B
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime import dispatch
from pyfuser.segment.segmenter import segment


@pytest.fixture(autouse=True)
def _interpret(monkeypatch, tmp_path_factory):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kernels"))
    monkeypatch.setenv("PYFUSER_CPU_EXECUTOR", "interpret")
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")


def _plan(f):
    """The KernelPlan of the fusion's one kernel segment (its CUDA source compiled by NVRTC
    before the interpreter ran it)."""
    (seg,) = [s for s in segment(f).segments if s.kind == "kernel"]
    ex = dispatch.get_executor(seg.fusion, "interpret")
    assert ex.num_kernels_compiled() == 1
    (plan,) = ex.plans().values()
    return plan


def _restricted(plan) -> dict:
    """Kernel pointer name -> whether it is declared __restrict__ (from the CUDA source)."""
    src = plan.kernel.source
    head = src[src.index("__global__"):src.index("{", src.index("__global__"))]
    out = {}
    for line in head.split("\n"):
        line = line.strip().rstrip(",")
        if "*" in line:
            out[line.split()[-1]] = "__restrict__" in line
    return out


def test_pointwise_update_of_an_input_is_written_by_the_kernel():
    """acc <- 0.9 * acc + 0.1 * relu(x), also read elementwise for a second output: one kernel,
    no copy; the input and its new value lose __restrict__, the other pointers keep it."""
    f = Fusion()
    with f:
        acc = B.define_tensor([-1, -1], DataType.Float)
        x = B.define_tensor([-1, -1], DataType.Float)
        new = B.elementwise("add", B.elementwise("mul", acc, 0.9),
                            B.elementwise("mul", B.elementwise("relu", x), 0.1))
        f.add_output(B.elementwise("sub", acc, new))
        f.add_output(new)
        f.aliases[new] = acc
    a, x = torch.randn(6, 10), torch.randn(6, 10)
    old = a.clone()
    diff, out = dispatch.execute_fusion(f, [a, x])
    want = old * 0.9 + x.relu() * 0.1
    assert out is a
    torch.testing.assert_close(a, want)
    torch.testing.assert_close(diff, old - want)
    report = dispatch.last_report(f)
    assert (report.kernels, report.copies) == (1, 0)
    plan = _plan(f)
    assert len(plan.inplace) == 1
    restricted = _restricted(plan)
    assert sorted(restricted.values()) == [False, False, True, True]   # acc, new | x, diff


def test_a_transposed_read_of_the_input_is_copied_in_after_the_kernel():
    """y = x + x.T written into x: another thread reads the element this one writes, so the
    kernel writes a fresh tensor, copied into x after it (eager's values: the old x's)."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        y = B.elementwise("add", x, B.permute(x, [1, 0]))
        f.add_output(y)
        f.aliases[y] = x
    x = torch.randn(9, 9)
    want = x + x.T
    (out,) = dispatch.execute_fusion(f, [x])
    assert out is x
    torch.testing.assert_close(x, want)
    assert dispatch.last_report(f).copies == 1
    assert _plan(f).inplace == {}


def test_horizontal_kernel_writes_each_components_input():
    """Three independent updates of different shapes (a [6, 10] float tensor, a 0-dim int64
    counter like num_batches_tracked, a [7] tensor only written): one horizontal kernel, each
    written in place."""
    f = Fusion()
    with f:
        acc = B.define_tensor([-1, -1], DataType.Float)
        cnt = B.define_tensor([], DataType.Int)
        buf = B.define_tensor([-1], DataType.Float)
        src = B.define_tensor([-1], DataType.Float)
        a2 = B.elementwise("mul", acc, 0.5)
        c2 = B.elementwise("add", cnt, 1)
        b2 = B.elementwise("exp", src)
        for o, i in ((a2, acc), (c2, cnt), (b2, buf)):
            f.add_output(o)
            f.aliases[o] = i
    acc, cnt = torch.randn(6, 10), torch.tensor(3, dtype=torch.int64)
    buf, src = torch.zeros(7), torch.randn(7)
    want = (acc * 0.5, cnt + 1, src.exp())
    outs = dispatch.execute_fusion(f, [acc, cnt, buf, src])
    assert all(o is t for o, t in zip(outs, (acc, cnt, buf)))
    for t, w in zip((acc, cnt, buf), want):
        torch.testing.assert_close(t, w)
    report = dispatch.last_report(f)
    assert [s.scheduler for s in report.segments] == ["horizontal"]
    assert report.copies == 0
    assert _plan(f).inplace == {0: 0, 1: 1, 2: 2}
