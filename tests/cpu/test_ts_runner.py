"""Eager runner and make_inputs: equal to PyTorch eager on the corpus, hooks, errors."""
from __future__ import annotations

import math
import pathlib

import pytest
import torch

from pyfuser.errors import RunnerError
from pyfuser.frontend.torchscript import (graph_from_function, make_inputs, parse_ir,
                                          run_graph)

import ts_corpus

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"


def clone(a):
    if isinstance(a, torch.Tensor):
        return a.clone()
    if isinstance(a, (list, tuple)):
        return type(a)(clone(x) for x in a)
    return a


def assert_same(expected, got, path="out"):
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), f"{path}: {type(got)}"
        if expected.dtype.is_floating_point or expected.dtype.is_complex:
            torch.testing.assert_close(got, expected, equal_nan=True, msg=path)
        else:
            assert got.dtype == expected.dtype and torch.equal(got, expected), path
    elif isinstance(expected, (list, tuple)):
        assert isinstance(got, (list, tuple)) and len(got) == len(expected), f"{path}: {got}"
        for i, (e, g) in enumerate(zip(expected, got)):
            assert_same(e, g, f"{path}[{i}]")
    elif isinstance(expected, float) and math.isnan(expected):
        assert isinstance(got, float) and math.isnan(got), path
    else:
        assert type(got) is type(expected) and got == expected, f"{path}: {got!r} != {expected!r}"


@pytest.mark.parametrize("entry", ts_corpus.CORPUS, ids=lambda e: e[0])
def test_corpus_matches_eager(entry):
    obj, text = ts_corpus.build(entry)
    g = parse_ir(text)
    args = entry[3]()
    expected = entry[2](*clone(args))
    inputs = ([obj] if ts_corpus.is_module(entry) else []) + list(clone(args))
    outs = run_graph(g, inputs)
    assert len(outs) == 1
    assert_same(expected, outs[0])


def test_optimized_graphs_run_their_subgraphs():
    seen = []

    def spy(node, args, ctx):
        seen.append(node.kind)
        return None                          # let the default run it

    for name, (text, fn, args) in ts_corpus.optimized_graph_texts().items():
        g = parse_ir(text)
        outs = run_graph(g, list(args), node_handler=spy)
        torch.testing.assert_close(outs[0], fn(*args))
    assert "prim::TensorExprGroup" in seen and "prim::DifferentiableGraph" in seen
    assert "aten::sigmoid" in seen           # the hook sees nodes inside subgraphs too
    assert "prim::CallFunction" not in seen  # guards passed: no fallback path taken


def test_node_handler_intercepts():
    g = parse_ir("graph(%x : Tensor):\n  %y : Tensor = prim::PyfuserGroup(%x)\n"
                 "  %z : Tensor = aten::neg(%y)\n  return (%z)\n")
    x = torch.randn(3)
    with pytest.raises(RunnerError, match="prim::PyfuserGroup"):
        run_graph(g, [x])

    def handler(node, args, ctx):
        return [args[0] * 10] if node.kind == "prim::PyfuserGroup" else None

    torch.testing.assert_close(run_graph(g, [x], node_handler=handler)[0], -10 * x)


def test_runner_error_names_node_and_line():
    g = parse_ir("graph(%x : Tensor):\n  %k : int[] = prim::Constant[value=[3]]()\n"
                 "  %y : Tensor = aten::view(%x, %k)\n  return (%y)\n", "f.ir")
    with pytest.raises(RunnerError) as ei:
        run_graph(g, [torch.randn(4)])
    msg = str(ei.value)
    assert "aten::view" in msg and "%y" in msg and "line 3" in msg
    assert "aten::view(%x, %k)" in msg
    assert ei.value.line == 3
    tens = parse_ir("graph():\n  %t : Tensor = prim::Constant[value=<Tensor>]()\n  return (%t)\n")
    with pytest.raises(RunnerError, match="not printed"):
        run_graph(tens, [])


def test_overload_resolution_by_runtime_types():
    g = parse_ir("""graph(%x : Tensor, %y : Tensor, %s : float, %i : int):
  %one : int = prim::Constant[value=1]()
  %a : Tensor = aten::add(%x, %y, %one)
  %b : Tensor = aten::add(%x, %s, %one)
  %c : int = aten::add(%i, %one)
  %d : float = aten::add(%s, %i)
  %e : float = aten::div(%i, %one)
  %f : int[] = aten::size(%x)
  %g : int = aten::size(%x, %one)
  return (%a, %b, %c, %d, %e, %f, %g)
""")
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    a, b, c, d, e, f, h = run_graph(g, [x, y, 0.5, 4])
    torch.testing.assert_close(a, x + y)
    torch.testing.assert_close(b, x + 0.5)
    assert (c, d, e, f, h) == (5, 4.5, 4.0, [2, 3], 3)
    assert isinstance(e, float)


def test_overload_whose_name_ends_in_out_is_not_an_out_variant():
    """Regression: `aten::to.dtype_layout` (what traced HF models call, `x.to(dtype=...)` with
    every keyword) was dropped as if it were an `out=` overload because its name ends in
    "out", so the eager runner could not run it."""
    g = parse_ir("""graph(%x : Tensor):
  %dt : int = prim::Constant[value=11]()
  %lay : int = prim::Constant[value=0]()
  %dev : Device = prim::Constant[value="cpu"]()
  %none : NoneType = prim::Constant()
  %f : bool = prim::Constant[value=0]()
  %y : Tensor = aten::to(%x, %dt, %lay, %dev, %none, %f, %f, %none)
  return (%y)
""")
    x = torch.tensor([0.0, 2.0, -1.0])
    (y,) = run_graph(g, [x])
    assert y.dtype == torch.bool and torch.equal(y, x.to(torch.bool))


def test_device_mapping_runs_cuda_graph_on_cpu():
    g = parse_ir((EXAMPLES / "seed000_mul.ir").read_text())
    ins = make_inputs(g, device="cpu", seed=1, size_override=8)
    assert all(t.device.type == "cpu" and t.shape == (8, 8) for t in ins)
    (out,) = run_graph(g, [t.clone() for t in ins], device="cpu")
    expect = ((ins[0].to(torch.int32) + ins[1]) * ins[2]).to(torch.int64)
    assert out.device.type == "cpu" and torch.equal(out, expect)
    if not torch.cuda.is_available():
        with pytest.raises(RunnerError, match="_to_copy"):
            run_graph(g, ins)                 # without mapping it asks for cuda:0


@pytest.mark.parametrize("name", ["seed000_mul_inplace", "seed000_add_mul_inplace"])
def test_inplace_examples_equal_out_of_place(name):
    ref = parse_ir((EXAMPLES / "seed000_mul.ir").read_text())
    g = parse_ir((EXAMPLES / f"{name}.ir").read_text())
    ins = make_inputs(g, "cpu", seed=3, size_override=16)
    assert torch.equal(run_graph(g, clone(ins), device="cpu")[0],
                       run_graph(ref, clone(ins), device="cpu")[0])


def test_seed003_bn_add_relu_full_size():
    g = parse_ir((EXAMPLES / "seed003_bn_add_relu.ir").read_text())
    ins = make_inputs(g, device="cpu", seed=0)
    assert all((ins[i] > 0).all() for i in (4, 9))        # running_var inputs are positive
    assert (ins[0] < 0).any() and isinstance(ins[10], int) and 1 <= ins[10] <= 9
    (out,) = run_graph(g, ins, device="cpu")
    bn = lambda i: torch.nn.functional.batch_norm(ins[i], ins[i + 3], ins[i + 4], ins[i + 1],
                                                  ins[i + 2], False, 0.1, 1e-5)
    assert out.shape == (8, 256, 56, 56) and not out.isnan().any()
    torch.testing.assert_close(out, torch.relu(bn(0) + ins[10] * bn(5)))


def test_make_inputs_rules():
    g = parse_ir("""graph(%a : Float(3, 4, strides=[1, 3]), %b : Long(5), %c : Bool(6),
      %d : Float(*, 2), %e : Tensor, %f : int, %g : float, %h : bool, %i : int[],
      %j : Half(2, 3, strides=[0, 1]), %k : Device, %l : NoneType, %m : (int, Tensor)):
  return ()
""")
    ins = make_inputs(g, "cpu", seed=7)
    again = make_inputs(g, "cpu", seed=7)
    other = make_inputs(g, "cpu", seed=8)
    assert torch.equal(ins[0], again[0]) and not torch.equal(ins[0], other[0])
    assert ins[0].stride() == (1, 3) and ins[0].dtype == torch.float32
    assert ins[1].dtype == torch.int64 and ins[1].min() >= 1 and ins[1].max() <= 9
    assert ins[2].dtype == torch.bool and ins[2].any()
    assert ins[3].shape == (4, 2) and ins[4].shape == (4,)
    assert isinstance(ins[5], int) and 1 <= ins[5] <= 9 and 0.5 <= ins[6] < 2
    assert isinstance(ins[7], bool) and len(ins[8]) == 2
    assert ins[9].stride() == (0, 1) and ins[9].dtype == torch.float16 and ins[9].abs().sum() > 0
    assert ins[10] == torch.device("cpu") and ins[11] is None
    assert isinstance(ins[12], tuple) and isinstance(ins[12][1], torch.Tensor)
    small = make_inputs(g, "cpu", seed=7, size_override=2)
    assert small[0].shape == (2, 2) and small[0].stride() == (1, 2)


def test_module_graph_with_self_and_getattr():
    m = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU()).eval()
    sm = torch.jit.script(m)
    g = graph_from_function(sm)
    assert g.inputs[0].debug_name.startswith("self")
    assert "prim::GetAttr" in [n.kind for n in g.nodes()]
    x = torch.randn(4, 3)
    torch.testing.assert_close(run_graph(g, [sm, x])[0], m(x))
    with pytest.raises(RunnerError, match="cannot make a random input"):
        make_inputs(g)


def test_raise_exception_becomes_runner_error():
    g = graph_from_function(ts_corpus.s_raise_ok)
    with pytest.raises(RunnerError, match="negative n"):
        run_graph(g, [torch.randn(2), -1])


def _add_out(x, y, c):
    torch.add(x, y, alpha=2, out=c)
    return c * 2, torch.relu(c)


def test_out_overloads_of_a_torch_graph_run_as_torch_matched_them():
    """`torch.add(x, y, out=c)` is `aten::add(%x, %y, %alpha, %c)` in the IR: four positional
    arguments that fit no other overload of add (a RunnerError before). A graph read through
    torch's API knows the overload torch matched (`add.out`), and the runner calls it: `c` is
    written in place and read after, as eager does; the text of the graph alone names none."""
    s = torch.jit.script(_add_out)
    g = graph_from_function(s)
    (node,) = [n for n in g.block.nodes() if n.kind == "aten::add"]
    assert node.overload == "out"
    x, y = torch.randn(5), torch.randn(5)
    c, want_c = torch.zeros(5), torch.zeros(5)
    (got,) = run_graph(g, [x, y, c])              # the graph returns one tuple
    want = _add_out(x, y, want_c)
    assert_same(list(want), list(got))
    assert torch.equal(c, want_c)                      # written in place
    with pytest.raises(RunnerError, match="aten::add"):
        run_graph(parse_ir(str(s.graph)), [x, y, torch.zeros(5)])


def test_out_overloads_run_under_pyfuser_jit_on_both_call_paths():
    """The same through pyfuser.jit: the first call runs the graph (mul and relu fused after
    the in-place add), later calls its call plan; each writes `c` and returns eager's values."""
    import pyfuser
    f = pyfuser.jit(torch.jit.script(_add_out))
    x, y = torch.randn(6), torch.randn(6)
    for _ in range(3):
        c, want_c = torch.full((6,), 7.0), torch.full((6,), 7.0)
        got = f(x, y, c)
        want = _add_out(x, y, want_c)
        assert_same(list(want), list(got))
        assert torch.equal(c, want_c)


def _linear_out(x, w, b, c):
    y = torch._C._nn.linear(x, w, b, out=c)
    return y.relu(), c * 1


def test_the_bias_of_a_linear_with_out_is_not_split_off():
    """`linear(x, w, b, out=c)`: the bias split (passes/decompose.py) made it
    `linear(x, w, None, c)` plus an add, which c never saw: once the runner ran out= overloads,
    c held x @ w.T without the bias (found by review). Such a node is not split."""
    import pyfuser
    f = pyfuser.jit(torch.jit.script(_linear_out))
    x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
    for _ in range(3):
        c, want_c = torch.zeros(3, 5), torch.zeros(3, 5)
        got = f(x, w, b, c)
        want = _linear_out(x, w, b, want_c)
        assert_same(list(want), list(got))
        torch.testing.assert_close(c, want_c)
