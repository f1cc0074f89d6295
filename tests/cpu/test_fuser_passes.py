"""The fuser's passes one by one: in-place safety, bias split, alias copies, the scan's rules,
cleanup, determinism, the argument limit and the graph_passes dump."""
import pytest
import torch
import torch.nn.functional as F

from pyfuser.frontend.torchscript import parse_ir
from pyfuser.frontend.torchscript.fuse_api import fuse_graph, jit, to_graph
from pyfuser.frontend.torchscript.passes import run_pipeline


def _kinds(g):
    return [n.kind for n in g.nodes() if n.kind != "prim::Constant"]


def _groups(g):
    return [n for n in g.all_nodes() if n.kind == "prim::PyfuserGroup"]


def _sub_kinds(group):
    return [n.kind for n in group.g("Subgraph").nodes() if n.kind != "prim::Constant"]


def _mutate_input(x, y):
    z = x * 2
    x.add_(y)
    return z + x


def _view_then_inplace(x):
    t = x + 1
    v = t.view(-1)
    t.mul_(2)
    return v + 1


def test_inplace_on_graph_input_stays_and_is_explained():
    f = jit(torch.jit.script(_mutate_input))
    assert "aten::add_" in _kinds(f.graph)
    reasons = [fb["reason"] for fb in f.last_run.fallbacks if fb["kind"] == "aten::add_"]
    assert len(reasons) == 1 and "input of the graph" in reasons[0]
    x1, y = torch.randn(3, 4), torch.randn(3, 4)
    x2 = x1.clone()
    out = f(x2, y)
    ref = _mutate_input(x1, y)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x2, x1)            # the caller's tensor is mutated as eagerly


def test_inplace_on_viewed_tensor_stays():
    f = jit(torch.jit.script(_view_then_inplace))
    kinds = _kinds(f.graph)
    assert "aten::mul_" in kinds and "aten::view" in kinds
    why = {fb["kind"]: fb["reason"] for fb in f.last_run.fallbacks}
    assert "aliased by aten::view" in why["aten::mul_"]
    x = torch.randn(2, 3)
    torch.testing.assert_close(f(x), _view_then_inplace(x))


def test_safe_inplace_becomes_functional():
    def fn(x, y):
        t = x + y
        t.mul_(y)
        return t.relu_()
    g = fuse_graph(torch.jit.script(fn))
    assert len(_groups(g)) == 1
    sub = _sub_kinds(_groups(g)[0])
    assert not any(k.endswith("_") for k in sub)
    assert [k for k in sub if k != "prim::inplace_cast"] == ["aten::add", "aten::mul", "aten::relu"]


def test_linear_bias_split_fuses_the_add():
    def fn(x, w, b):
        return torch.relu(F.linear(x, w, b))
    g = fuse_graph(torch.jit.script(fn))
    linear = [n for n in g.nodes() if n.kind == "aten::linear"][0]
    assert linear.inputs[2].node.kind == "prim::Constant" and not linear.inputs[2].node.has_attr("value")
    assert _sub_kinds(_groups(g)[0]) == ["prim::add_optional", "aten::relu"]
    f = jit(torch.jit.script(fn))
    x, w, b = torch.randn(3, 4), torch.randn(5, 4), torch.randn(5)
    torch.testing.assert_close(f(x, w, b), fn(x, w, b))


def test_conv_bias_unsqueezed_into_group():
    def fn(x, w, b):
        return torch.sigmoid(F.conv2d(x, w, b))
    g = fuse_graph(torch.jit.script(fn))
    sub = _sub_kinds(_groups(g)[0])
    assert sub == ["prim::unsqueeze_copy", "prim::unsqueeze_copy", "prim::add_optional",
                   "aten::sigmoid"]


def test_lone_view_returns_to_alias_op():
    def fn(x):
        return x.view(-1)
    g = fuse_graph(torch.jit.script(fn))
    assert _kinds(g) == ["aten::view"] and not _groups(g)


def test_unfusible_op_between_moves_group():
    def fn(x):
        a = x + 1
        c = torch.cumsum(x, 0)
        return a * 2, c
    g = fuse_graph(torch.jit.script(fn))
    assert len(_groups(g)) == 1
    assert _sub_kinds(_groups(g)[0]) == ["aten::add", "aten::mul"]


def test_producer_used_by_unfusible_becomes_group_output():
    def fn(x):
        a = x.exp()
        s = torch.cumsum(a, 0)
        return a * s, a
    g = fuse_graph(torch.jit.script(fn))
    groups = _groups(g)
    assert len(groups) == 2
    assert len(groups[0].outputs) == 1 and groups[0].outputs[0].uses


def test_horizontal_siblings_merge():
    def fn(x, y):
        return x.sin() * y, x.cos() - y
    g = fuse_graph(torch.jit.script(fn))
    assert len(_groups(g)) == 1
    assert len(_groups(g)[0].outputs) == 2


def test_control_flow_blocks_kept_with_groups_inside():
    def fn(x, flag: bool):
        if flag:
            y = (x + 1) * 2
        else:
            y = x.relu() - 1
        return y
    g = fuse_graph(torch.jit.script(fn))
    top = _kinds(g)
    assert top == ["prim::If"]
    if_node = [n for n in g.nodes() if n.kind == "prim::If"][0]
    for b in if_node.blocks:
        assert [n.kind for n in b.nodes()] == ["prim::PyfuserGroup"]


def test_argument_limit_splits_groups():
    def fn(a, b, c, d):
        return ((a + b) * c) - d
    g1 = fuse_graph(torch.jit.script(fn))
    graph, _ = to_graph(torch.jit.script(fn))
    g2 = graph.copy()
    run_pipeline(g2, arg_limit=4)
    assert len(_groups(g1)) == 1
    assert len(_groups(g2)) > 1
    assert all(len(n.inputs) + len(n.outputs) <= 4 for n in _groups(g2))


def test_cse_and_dce():
    def fn(x):
        a = x + 1
        b = x + 1
        unused = x * 5
        return a * b
    g = fuse_graph(torch.jit.script(fn))
    assert _sub_kinds(_groups(g)[0]) == ["aten::add", "aten::mul"]


def test_fusing_twice_is_deterministic():
    text = open("examples/seed003_bn_add_relu.ir").read()
    a = str(fuse_graph(parse_ir(text)))
    b = str(fuse_graph(parse_ir(text)))
    assert a == b and "PyfuserGroup" in a

    def fn(x, y, z):
        p = x.sin() + y
        q = torch.cumsum(p, 0)
        return p * z, q.relu(), (x - z).exp()
    s = torch.jit.script(fn)
    assert str(fuse_graph(s)) == str(fuse_graph(s))


def test_fuse_graph_leaves_its_argument_alone():
    g = parse_ir(open("examples/seed000_mul.ir").read())
    before = str(g)
    fuse_graph(g)
    assert str(g) == before


def test_graph_passes_dump(monkeypatch, capsys):
    monkeypatch.setenv("PYFUSER_DUMP", "graph_passes,fusion_groups")
    fuse_graph(parse_ir(open("examples/seed000_mul_inplace.ir").read()))
    err = capsys.readouterr().err
    for name in ("inplace", "decompose", "alias_copy", "fusion_scan", "cleanup"):
        assert f"after {name} " in err
    assert "group 0:" in err


def test_reason_dump_names_unsafe_inplace(monkeypatch, capsys):
    monkeypatch.setenv("PYFUSER_DUMP", "fusion_groups")
    fuse_graph(torch.jit.script(_mutate_input))
    err = capsys.readouterr().err
    assert "not fused: aten::add_" in err and "input of the graph" in err


def test_script_module_with_self():
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.randn(4))

        def forward(self, x):
            return torch.relu(x * self.scale) + 1

    m = M().eval()
    f = jit(torch.jit.script(m))
    x = torch.randn(3, 4)
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    assert f.last_run.groups == 1 and f.last_run.kernels == 1


def test_inplace_that_eager_rejects_still_raises():
    """`int_tensor.add_(float_tensor)` raises in eager; the functionalized graph must too."""
    import pyfuser.frontend.torchscript.fuse_api as api

    def fn(a, x):
        b = a * 2
        b.add_(x)
        return b

    a = torch.arange(6, dtype=torch.int64).reshape(2, 3)
    x = torch.randn(2, 3)
    with pytest.raises(RuntimeError, match="can't be cast"):
        fn(a, x)
    compiled = api.jit(torch.jit.script(fn))
    from pyfuser.errors import RunnerError
    with pytest.raises((RuntimeError, RunnerError), match="can't be cast"):
        compiled(a, x)
    ok = compiled(a, x.to(torch.int64))
    assert torch.equal(ok, fn(a, x.to(torch.int64)))


def _size_and_dtype_reads(x, y):
    z = x * y + 1.0
    return torch.relu(z), z.size(0), z.dtype, z.size()


def _size_read_of_dynamic_dim(x, k: int):
    z = x * 2.0
    return torch.relu(z), z.size(k)


def _only_a_size(x):
    z = x * 2.0
    return z.size()


def test_size_and_dtype_reads_move_into_the_group():
    """z is read only by size/dtype outside: those reads move into the group, z is no longer
    a group output (never written), and every result equals the scripted function's."""
    s = torch.jit.script(_size_and_dtype_reads)
    g = fuse_graph(s)
    (group,) = _groups(g)
    assert _sub_kinds(group)[-3:] == ["aten::size", "prim::dtype", "aten::size"]
    assert [str(o.type) for o in group.outputs] == ["Tensor", "int", "int", "int[]"]
    assert _kinds(g) == ["prim::PyfuserGroup", "prim::TupleConstruct"]
    f = jit(s)
    for shape in [(5, 7), (3, 7), (5, 7)]:
        x, y = torch.randn(shape), torch.randn(shape)
        got, want = f(x, y), s(x, y)
        assert torch.equal(got[0], want[0]) and got[1:] == want[1:]
    (runner,) = f.runners.values()
    assert len(runner.lowered.fusion.outputs) == 1 and f.last_run.kernels == 1
    x64 = torch.randn(4, 7, dtype=torch.float64)                     # its own lowering
    got, want = f(x64, x64), s(x64, x64)
    assert torch.equal(got[0], want[0]) and got[1:] == want[1:] and f.last_run.eager_groups == 0
    assert f.last_run.kernels == 1 and len(runner.variants) == 2


def test_size_read_with_a_dynamic_dim_keeps_the_output():
    s = torch.jit.script(_size_read_of_dynamic_dim)
    g = fuse_graph(s)
    (group,) = _groups(g)
    assert "aten::size" not in _sub_kinds(group) and len(group.outputs) == 2
    f = jit(s)
    x = torch.randn(4, 6)
    assert f(x, 1)[1] == 6 and torch.equal(f(x, 1)[0], s(x, 1)[0])


def test_a_group_of_only_size_reads_launches_nothing():
    s = torch.jit.script(_only_a_size)
    f = jit(s)
    for shape in [(2, 3), (4, 5)]:
        assert f(torch.randn(shape)) == list(shape)
    (runner,) = f.runners.values()
    assert not runner.lowered.fusion.outputs and f.last_run.kernels == 0


class _ConvNoBias(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3, bias=False)
        self.conv_b = torch.nn.Conv2d(4, 4, 1)

    def forward(self, x):
        return torch.relu(self.conv_b(torch.relu(self.conv(x)) * 2))


def test_conv_with_optional_bias_that_is_none():
    """A scripted Conv2d(bias=False) passes a `Tensor?` bias that is None: not split (it was
    unsqueezed, which failed at run time)."""
    torch.manual_seed(0)
    m = _ConvNoBias().eval()
    x = torch.randn(2, 3, 8, 8)
    f = jit(torch.jit.script(m))
    with torch.no_grad():
        torch.testing.assert_close(f(x), m(x))
    assert f.last_run.eager_groups == 0 and f.last_run.kernels >= 1


def _bn_train_relu(x, w, b, rm, rv):
    y = torch.batch_norm(x, w, b, rm, rv, True, 0.1, 1e-5, False)
    y.add_(x)
    return y.relu_()


def test_inplace_on_training_batch_norm_output_is_fused():
    """Training batch_norm writes its running statistics, but its output is fresh (its schema
    says it aliases nothing): add_/relu_ on it become functional and fuse."""
    f = jit(torch.jit.script(_bn_train_relu))
    args = [torch.randn(4, 3, 5), torch.rand(3) + 0.5, torch.randn(3), torch.randn(3),
            torch.rand(3) + 0.5]
    ref_args = [a.clone() for a in args]
    torch.testing.assert_close(f(*args), _bn_train_relu(*ref_args))
    for a, r in zip(args, ref_args):             # running statistics updated the same way
        torch.testing.assert_close(a, r)
    assert f.last_run.groups == 1 and f.last_run.kernels == 1
    assert not any(fb["kind"] in ("aten::add_", "aten::relu_") for fb in f.last_run.fallbacks)
