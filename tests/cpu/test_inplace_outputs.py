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
    f = _accumulate(split=True)[0]
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


def _transpose_added_in_place() -> Fusion:
    """y = x + x.T written into x (Fusion.aliases)."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        y = B.elementwise("add", x, B.permute(x, [1, 0]))
        f.add_output(y)
        f.aliases[y] = x
    return f


def test_a_transposed_read_of_the_input_is_copied_in_after_the_kernel():
    """y = x + x.T written into x: another thread reads the element this one writes, so the
    kernel writes a fresh tensor, copied into x after it (eager's values: the old x's)."""
    f = _transpose_added_in_place()
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


def test_an_input_another_component_reads_is_not_written_by_the_horizontal_kernel():
    """buf <- exp(x) of shape [4, 1] (one component) while y = buf + z of shape [4, 6]
    (another component, another shape) reads buf: the writer's blocks would race the reader's,
    so buf is written after the kernel and y sees the old values."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, 1], DataType.Float)
        buf = B.define_tensor([-1, 1], DataType.Float)
        z = B.define_tensor([-1, -1], DataType.Float)
        new = B.elementwise("exp", x)
        f.add_output(new)
        f.aliases[new] = buf
        f.add_output(B.elementwise("add", buf, z))
    x, buf, z = torch.randn(4, 1), torch.randn(4, 1), torch.randn(4, 6)
    want_y = buf + z
    out, y = dispatch.execute_fusion(f, [x, buf, z])
    assert out is buf
    torch.testing.assert_close(buf, x.exp())
    torch.testing.assert_close(y, want_y)
    report = dispatch.last_report(f)
    assert [s.scheduler for s in report.segments] == ["horizontal"] and report.copies == 1
    assert _plan(f).inplace == {}


def test_an_input_only_written_joins_the_writers_kernel_segment():
    """buf <- exp(x), buf read by no expr, the fusion's outputs in another order than the
    kernel segment's (so the segment is a sub-Fusion without buf): buf becomes an unread input
    of that sub-Fusion, whose kernel is handed it as the output."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        buf = B.define_tensor([-1, -1], DataType.Float)
        s = B.elementwise("sin", x)
        b = B.elementwise("exp", x)
        f.add_output(b)
        f.add_output(s)
        f.aliases[b] = buf
    (seg,) = segment(f).segments
    assert seg.fusion is not f and buf in seg.inputs and len(seg.fusion.aliases) == 1
    x, buf = torch.randn(5, 6), torch.zeros(5, 6)
    out, sin = dispatch.execute_fusion(f, [x, buf])
    assert out is buf
    torch.testing.assert_close(buf, x.exp())
    torch.testing.assert_close(sin, x.sin())
    assert dispatch.last_report(f).copies == 0


# ---- cached calls: the replay programs (fake CUDA: kernels run by the CPU interpreter) --------
def _accumulate(split: bool):
    """acc <- 0.9 * acc + 0.1 * relu(x) written in place; `split`: also diff = acc - new, an
    output listed first (the kernel segment is then a sub-Fusion: the segmented runtime)."""
    f = Fusion()
    with f:
        acc = B.define_tensor([-1, -1], DataType.Float)
        x = B.define_tensor([-1, -1], DataType.Float)
        new = B.elementwise("add", B.elementwise("mul", acc, 0.9),
                            B.elementwise("mul", B.elementwise("relu", x), 0.1))
        if split:
            f.add_output(B.elementwise("sub", acc, new))
        f.add_output(new)
        f.aliases[new] = acc

    def eager(acc, x):
        new = acc * 0.9 + x.relu() * 0.1
        out = [acc - new, new] if split else [new]
        acc.copy_(new)
        return out
    return f, lambda: [torch.randn(6, 10), torch.randn(6, 10)], eager, 1


def _counters():
    f = Fusion()
    with f:
        acc = B.define_tensor([-1, -1], DataType.Float)
        cnt = B.define_tensor([], DataType.Int)
        for o, i in ((B.elementwise("mul", acc, 0.5), acc), (B.elementwise("add", cnt, 1), cnt)):
            f.add_output(o)
            f.aliases[o] = i

    def eager(acc, cnt):
        acc.mul_(0.5)
        cnt.add_(1)
        return [acc.clone(), cnt.clone()]
    return f, lambda: [torch.randn(6, 10), torch.tensor(7)], eager, 1


def _running_mean():
    """rm <- 0.9 * rm + 0.1 * column means of x (a running statistic, per row of the
    reduction), and the means: one reduction kernel writing rm itself."""
    f = Fusion()
    with f:
        x = B.define_tensor([6, -1], DataType.Float)
        rm = B.define_tensor([-1], DataType.Float)
        mean = B.elementwise("mul", B.reduction("sum", x, [0]), 1 / 6)
        new = B.elementwise("add", B.elementwise("mul", rm, 0.9), B.elementwise("mul", mean, 0.1))
        f.add_output(mean)
        f.add_output(new)
        f.aliases[new] = rm

    def eager(x, rm):
        mean = x.sum(0) / 6
        rm.mul_(0.9).add_(mean * 0.1)
        return [mean, rm.clone()]
    return f, lambda: [torch.randn(6, 12), torch.randn(12)], eager, 1


def _two_kernels():
    """A row sum (a reduction kernel) beside acc <- 2 * acc (a pointwise kernel, the only one
    reading acc, which it writes)."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1, -1], DataType.Float)
        acc = B.define_tensor([-1, -1, -1], DataType.Float)
        f.add_output(B.reduction("sum", x, [1]))
        new = B.elementwise("mul", acc, 2.0)
        f.add_output(new)
        f.aliases[new] = acc

    def eager(x, acc):
        acc.mul_(2.0)
        return [x.sum(1), acc.clone()]
    return f, lambda: [torch.randn(6, 12), torch.randn(2, 3, 4)], eager, 2


REPLAY_CASES = {"pointwise": lambda: _accumulate(False), "segmented": lambda: _accumulate(True),
                "horizontal": _counters, "running mean": _running_mean,
                "two kernels": _two_kernels}


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
@pytest.mark.parametrize("case", list(REPLAY_CASES))
def test_in_place_calls_replay_their_program(monkeypatch, tmp_path, native, case):
    """A call whose in-place outputs the kernels wrote records a cached program like any other:
    later calls with new tensors of the same key replay it (the Python program or the native
    runner), launch the same kernels with this call's pointers, write this call's inputs and
    return them, and copy nothing after."""
    import fake_cuda
    fake = fake_cuda.install(monkeypatch, tmp_path, native=native)
    try:
        f, make, eager, kernels = REPLAY_CASES[case]()
        aliased = {f.outputs.index(o): f.inputs.index(i) for o, i in f.aliases.items()}
        reports = []
        for _ in range(4):
            ins = make()
            want_ins = [t.clone() for t in ins]
            want = eager(*want_ins)
            n = len(fake.launches)
            outs = dispatch.execute_fusion(f, ins)
            assert len(fake.launches) - n == kernels
            for k, j in aliased.items():
                assert outs[k] is ins[j]
            for o, w in zip(outs, want):
                torch.testing.assert_close(o, w)
            for t, w in zip(ins, want_ins):
                torch.testing.assert_close(t, w)
            report = dispatch.last_report(f)
            assert report.copies == 0 and report.kernels == kernels
            reports.append(report)
        progs = f.__dict__[dispatch._PROGS]
        assert len(progs.runs) == 1
        assert reports[1] is reports[2] is reports[3]         # replayed: the recorded report
        if native:
            assert progs.run == progs.native.run and len(progs.native) == 1
        assert not fake.callback_errors
    finally:
        dispatch.clear_caches()


def test_a_call_that_copies_after_its_kernels_is_not_replayed(monkeypatch, tmp_path):
    """y = x + x.T written into x is copied in after the kernel on every call: no program (its
    replay would skip the copy)."""
    import fake_cuda
    fake_cuda.install(monkeypatch, tmp_path)
    try:
        f = _transpose_added_in_place()
        for _ in range(3):
            x = torch.randn(9, 9)
            want = x + x.T
            (out,) = dispatch.execute_fusion(f, [x])
            assert out is x
            torch.testing.assert_close(x, want)
            assert dispatch.last_report(f).copies == 1
        progs = f.__dict__.get(dispatch._PROGS)
        assert progs is None or not progs.runs
    finally:
        dispatch.clear_caches()


def _ts_batch_norm(x, w, b, rm, rv):
    return torch.relu(torch.nn.functional.batch_norm(x, rm, rv, w, b, True, 0.1, 1e-5))


@pytest.mark.parametrize("native", [False, True], ids=["python", "native"])
def test_torchscript_training_batch_norm_replays_with_its_running_statistics(
        monkeypatch, tmp_path, native):
    """pyfuser.jit's training batch norm writes its running statistics in its kernel (in-place
    outputs since it was lowered): its later calls replay the recorded program, one launch each,
    and the statistics stay eager's."""
    import fake_cuda
    import pyfuser
    fake = fake_cuda.install(monkeypatch, tmp_path, native=native)
    try:
        f = pyfuser.jit(torch.jit.script(_ts_batch_norm))
        w, b = torch.randn(4), torch.randn(4)
        stats, ref = [torch.zeros(4), torch.ones(4)], [torch.zeros(4), torch.ones(4)]
        with torch.no_grad():
            for _ in range(5):
                x = torch.randn(8, 4, 5)
                n = len(fake.launches)
                torch.testing.assert_close(f(x, w, b, *stats), _ts_batch_norm(x, w, b, *ref))
                assert len(fake.launches) == n + 1
                for s, r in zip(stats, ref):
                    torch.testing.assert_close(s, r)
        # the batch norm's group (and its kernel segment's sub-Fusion): a recorded program
        progs = [fu.__dict__.get(dispatch._PROGS) for fu in dispatch._holders if fu.aliases]
        assert any(p is not None and p.runs for p in progs)
        assert not fake.callback_errors
    finally:
        dispatch.clear_caches()
