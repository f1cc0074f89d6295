"""Kernel counts of `pyfuser.jit` come from the segmenter's split of each group (its RunReport):
views peeled off a group cost no kernel, a view-only group is 0 kernels, counts are per call; a
cat or stack of computed tensors is one group and one kernel (its list built in the group)."""
import json

import pytest
import torch

from pyfuser.cli import main
from pyfuser.frontend.torchscript import make_inputs, parse_ir, run_graph
from pyfuser.frontend.torchscript.fuse_api import jit
from pyfuser.frontend.torchscript.jit import RunStats

MODES = ["evaluator", "interpret"]


def view_only(x):
    return x.t().float()                      # float input: t() and a no-op cast, views only


def view_at_end(x):
    return (x + 1).view(-1)


def view_at_start(x, y):
    return torch.relu(x.t() + y)


def contiguous_view(x):
    return x.contiguous().view(-1)


def reduction_in_group(x, y):
    s = (x * y).sum(1, keepdim=True)          # a normalization pattern: one group, one kernel
    return torch.relu(s + y)


def cat_of_computed(x, y):
    return torch.cat([x * 2.0, torch.sin(y), x], 1) * 3.0   # the list built in the group


def rotate_half(x, y):
    h = x.shape[-1] // 2                      # Llama's rotary: a cat of the halves' slices
    return x * y + torch.cat([-x[:, h:], x[:, :h]], -1) * 0.5


def stack_of_computed(x, y):
    return torch.stack([x + 1.0, y * y], 0).relu()


# fn, number of inputs, (groups, kernels, host_segments)
CASES = [
    (cat_of_computed, 2, (1, 1, 0)),
    (rotate_half, 2, (1, 1, 0)),
    (stack_of_computed, 2, (1, 1, 0)),
    (view_only, 1, (1, 0, 1)),
    (view_at_end, 1, (1, 1, 1)),
    (view_at_start, 2, (1, 1, 1)),
    (contiguous_view, 1, (1, 0, 1)),        # x.contiguous() of a contiguous x is x
    (reduction_in_group, 2, (1, 1, 0)),
]


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fn,nargs,want", CASES, ids=[c[0].__name__ for c in CASES])
def test_exact_counts(fn, nargs, want, mode):
    f = jit(torch.jit.script(fn), cpu_executor=mode)
    args = [torch.randn(5, 5) for _ in range(nargs)]
    for _ in range(2):                        # per call, not accumulated over calls
        out = f(*args)
        torch.testing.assert_close(out, fn(*args))
        stats = f.last_run
        assert (stats.groups, stats.kernels, stats.host_segments) == want, stats.as_dict()
        assert stats.eager_groups == 0 and stats.eager_segments == 0
        assert stats.as_dict()["host_segments"] == want[2]


def test_view_only_group_is_a_view_like_eager():
    f = jit(torch.jit.script(view_only))
    x = torch.randn(4, 6)
    out = f(x)
    assert torch.equal(out, view_only(x)) and out.data_ptr() == x.data_ptr()
    assert f.last_run.kernels == 0


@pytest.mark.parametrize("mode", MODES)
def test_contiguous_of_a_contiguous_input_is_the_input_like_eager(mode):
    """Eager's x.contiguous() returns x when x is contiguous, so its view aliases x: no kernel
    copies it. A transposed x is copied (a new layout guard, its own lowering)."""
    f = jit(torch.jit.script(contiguous_view), cpu_executor=mode)
    x = torch.randn(4, 6)
    for _ in range(2):
        out = f(x)
        assert torch.equal(out, contiguous_view(x)) and out.data_ptr() == x.data_ptr()
        assert f.last_run.kernels == 0
    xt = torch.randn(6, 4).t()
    for _ in range(2):
        out = f(xt)
        assert torch.equal(out, contiguous_view(xt)) and out.stride() == (1,)
        assert f.last_run.kernels == 1
    assert f(x).data_ptr() == x.data_ptr()


def test_eager_group_counts_no_kernel():
    f = jit(torch.jit.script(view_at_end))
    f(torch.randn(3, 4))
    assert f.last_run.kernels == 1
    x = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)    # autograd: eager
    for _ in range(2):                                                # checked, then the plan
        out = f(x)
        assert out.dtype == torch.float64 and torch.equal(out, view_at_end(x))
        assert out.requires_grad
        assert f.last_run.kernels == 0 and f.last_run.host_segments == 0
        assert f.last_run.eager_groups == 1
    with torch.no_grad():
        f(x)
    assert f.last_run.kernels == 1 and f.last_run.eager_groups == 0


def test_cuda_counts_launched_cpu_counts_kernel_segments():
    from pyfuser.segment.segmented_fusion import RunReport
    report = RunReport(kernels=2, launched=1, host_segments=1, eager_segments=0)
    cpu, gpu = RunStats(), RunStats()
    cpu.add_run(report, on_cuda=False)
    gpu.add_run(report, on_cuda=True)
    assert (cpu.kernels, gpu.kernels) == (2, 1)
    assert cpu.host_segments == gpu.host_segments == 1


@pytest.mark.parametrize("mode", MODES)
def test_seed003_one_kernel(mode):
    with open("examples/seed003_bn_add_relu.ir") as fh:
        g = parse_ir(fh.read())
    f = jit(g, cpu_executor=mode)
    inputs = make_inputs(g, device="cpu", seed=0, size_override=6)
    ref = run_graph(g, [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs],
                    device="cpu")
    out = f.run(inputs, device="cpu")
    torch.testing.assert_close(out[0], ref[0])
    # one kernel; the [256] parameters' broadcasts are views taken on the host (no copy)
    assert (f.last_run.groups, f.last_run.kernels, f.last_run.host_segments) == (1, 1, 1)


VIEW_ONLY_IR = """graph(%x : Float(6, 10, strides=[10, 1], requires_grad=0, device=cpu)):
  %none : NoneType = prim::Constant()
  %f : bool = prim::Constant[value=0]()
  %dt : int = prim::Constant[value=6]()
  %y : Tensor = aten::t(%x)
  %z : Tensor = aten::to(%y, %dt, %f, %f, %none)
  return (%z)
"""

VIEW_AT_END_IR = """graph(%x : Float(6, 10, strides=[10, 1], requires_grad=0, device=cpu)):
  %one : int = prim::Constant[value=1]()
  %shape : int[] = prim::Constant[value=[60]]()
  %y : Tensor = aten::add(%x, %one, %one)
  %z : Tensor = aten::view(%y, %shape)
  return (%z)
"""


def _json(capsys, path, *extra):
    rc = main(["run", str(path), "--device", "cpu", "--json", *extra])
    return rc, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("text,kernels,host", [(VIEW_ONLY_IR, 0, 1), (VIEW_AT_END_IR, 1, 1)],
                         ids=["view_only", "view_at_end"])
def test_run_json_counts_split_groups(tmp_path, capsys, text, kernels, host):
    path = tmp_path / "g.ir"
    path.write_text(text)
    rc, rep = _json(capsys, path)
    assert rc == 0 and rep["matches_eager"] is True
    assert (rep["groups"], rep["kernels"], rep["host_segments"]) == (1, kernels, host)


def test_run_json_seed003(capsys):
    rc, rep = _json(capsys, "examples/seed003_bn_add_relu.ir", "--shrink", "8")
    assert rc == 0 and rep["matches_eager"] is True
    assert (rep["groups"], rep["kernels"], rep["host_segments"]) == (1, 1, 1)
