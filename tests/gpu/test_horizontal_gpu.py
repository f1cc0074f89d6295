"""The horizontal scheduler on CUDA tensors: independent casts and pointwise computations of
different shapes run as ONE kernel launch (counted by fs.last_run and by the profiler), results
equal to eager (values, dtypes, strides); a BERT-like set of weight and bias casts to bf16 timed
against one launch per cast (printed; run with -s to see it)."""
import os
import sys
import time

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from bench.common import load_module_from_path  # noqa: E402

pytestmark = pytest.mark.gpu


def _load(name):
    return load_module_from_path(name, os.path.join(
        os.path.dirname(__file__), "..", "cpu", f"{name}.py"), fresh=True, register=False)


HC = _load("horizontal_cases")


def _cuda_kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
               and "memcpy" not in e.name.lower() and "memset" not in e.name.lower())


def _kinds(fs):
    return [(s.kind, s.scheduler) for s in fs.last_run.segments]


@pytest.mark.parametrize("k,seed", [(2, 0), (5, 2), (16, 4), (40, 5)])
def test_casts_one_launch(k, seed):
    torch.manual_seed(seed)
    fs, inputs, eager = HC.casts(k, seed, device="cuda")
    outs = fs.execute(inputs)
    HC.check_against_eager(outs, eager(*inputs))
    assert _kinds(fs) == [("kernel", "horizontal")] and fs.last_run.launched == 1
    assert _cuda_kernels(lambda: fs.execute(inputs)) == 1
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))       # the cached replay


@pytest.mark.parametrize("layouts", [("dense",), ("transposed",), ("sliced",)])
def test_layouts(layouts):
    torch.manual_seed(1)
    fs, inputs, eager = HC.casts(10, 7, device="cuda", layouts=layouts)
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert _kinds(fs) == [("kernel", "horizontal")]


def test_ops_broadcast_scalar_and_large_sizes():
    torch.manual_seed(2)
    fs, inputs, eager = HC.mixed_ops(device="cuda", n=4099, m=771)
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert [k for k in _kinds(fs) if k[0] == "kernel"] == [("kernel", "horizontal")]
    assert _cuda_kernels(lambda: fs.execute(inputs)) == 1


def test_size_zero_components():
    fs, inputs, eager = HC.casts(4, 0, device="cuda", shapes=[(0,), (5, 3), (4, 0), (1,)],
                                 layouts=("dense",))
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert fs.last_run.kernels == 1


def test_reduction_beside_casts_two_kernels():
    fs, inputs, eager = HC.reduction_and_casts(3, device="cuda")
    HC.check_against_eager(fs.execute(inputs), eager(*inputs))
    assert sorted(s for _, s in _kinds(fs)) == ["horizontal", "reduction"]
    assert _cuda_kernels(lambda: fs.execute(inputs)) == 2


BERT_SHAPES = [(768, 768)] * 4 * 4 + [(768,)] * 4 * 4 + [(3072, 768), (768, 3072)] * 4 + \
    [(3072,), (768,)] * 4 + [(768,)] * 8 * 4


def test_bert_like_weight_casts_timing():
    """The casts of a 4-layer BERT-like model's weights and biases to bf16 (~100 tensors):
    one horizontal launch vs one pointwise launch per cast. Prints both times; asserts only the
    results and the launch count (timings are for the report)."""
    from pyfuser.frontend.definition import Fusion, FusionDefinition
    from pyfuser.ir import DataType
    torch.manual_seed(3)
    xs = [torch.randn(*s, device="cuda") for s in BERT_SHAPES]
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        for x in xs:
            fd.add_output(fd.ops.cast(fd.from_pytorch(x), DataType.BFloat16))
    singles = []
    for x in xs:
        f1 = Fusion()
        with FusionDefinition(f1) as fd:
            fd.add_output(fd.ops.cast(fd.from_pytorch(x), DataType.BFloat16))
        singles.append(f1)
    outs = fs.execute(xs)
    for o, x in zip(outs, xs):
        assert torch.equal(o, x.bfloat16())
    kinds = {s for _, s in _kinds(fs)}
    assert kinds == {"horizontal"}, _kinds(fs)

    def run_h():
        fs.execute(xs)

    def run_singles():
        for f1, x in zip(singles, xs):
            f1.execute([x])

    def run_eager():
        for x in xs:
            x.bfloat16()
    times = {}
    for name, fn in (("horizontal", run_h), ("one kernel per cast", run_singles),
                     ("eager", run_eager)):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
        times[name] = (time.perf_counter() - t) / 20 * 1e6
    print(f"\n{len(xs)} casts to bf16 ({fs.last_run.kernels} horizontal kernel(s)): " +
          ", ".join(f"{k} {v:.0f} us" for k, v in times.items()))
    assert _cuda_kernels(run_h) == fs.last_run.kernels


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
def test_two_devices_never_share_a_kernel():
    from pyfuser.frontend.definition import Fusion, FusionDefinition
    from pyfuser.ir import DataType
    a, b = torch.randn(33, 5, device="cuda:0"), torch.randn(7, device="cuda:1")
    fs = Fusion()
    with FusionDefinition(fs) as fd:
        fd.add_output(fd.ops.cast(fd.from_pytorch(a), DataType.BFloat16))
        fd.add_output(fd.ops.cast(fd.from_pytorch(b), DataType.Half))
    outs = fs.execute([a, b])
    assert torch.equal(outs[0], a.bfloat16()) and outs[0].device == a.device
    assert torch.equal(outs[1], b.half()) and outs[1].device == b.device
