"""The torch.compile backend (pyfuser/frontend/fx): registration, partitioning, lowering through
the shared op table, eager's results forward and backward, on the CPU (kernels through the
interpreter)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.frontend.fx.compile_graph import compile_graph
from pyfuser.frontend.fx.partition import partition, unit_order
from pyfuser.frontend.fx.support import node_support

from train_corpus import assert_as_close_as_eager

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


pytestmark = pytest.mark.usefixtures("fresh_compile")


def _graphs(kind=None):
    return [g for g in compiled_graphs() if kind is None or g.kind == kind]


def test_entry_point_makes_the_backend_available_without_importing_pyfuser(tmp_path):
    """pip-install a copy of this checkout into a target directory and, in a fresh process that
    sees only that copy, compile with backend="pyfuser" without importing pyfuser: torch finds
    the backend through the `torch_dynamo_backends` entry point of the installed metadata."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), src)
    shutil.copytree(os.path.join(ROOT, "pyfuser"), src / "pyfuser",
                    ignore=shutil.ignore_patterns("__pycache__"))
    target = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                    "--no-build-isolation", "--target", str(target), str(src)],
                   check=True, capture_output=True, timeout=300)
    eps = (target / "pyfuser-0.1.0.dist-info" / "entry_points.txt").read_text()
    assert "[torch_dynamo_backends]" in eps and "pyfuser = pyfuser.frontend.fx.backend:" in eps
    script = textwrap.dedent("""
        import sys, torch
        f = torch.compile(lambda x: torch.relu(x) * 2 + 1, backend="pyfuser")
        x = torch.randn(5, 7)
        assert torch.equal(f(x), torch.relu(x) * 2 + 1)
        mod = sys.modules["pyfuser"]
        from pyfuser.frontend.fx import compiled_graphs
        print(mod.__file__, len(compiled_graphs()), compiled_graphs()[0].report()["regions"])
    """)
    env = dict(os.environ, PYTHONPATH=str(target))
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                         timeout=300, cwd=str(tmp_path))
    assert out.returncode == 0, out.stderr[-3000:]
    path, graphs, regions = out.stdout.split()
    assert path.startswith(str(target)) and int(graphs) == 1 and int(regions) == 1


def test_pyfuser_compile_forward_and_backward_match_eager():
    def f(x, w, b):
        y = F.gelu(x @ w + b)
        return F.layer_norm(y * 2 + 1, (y.shape[-1],))

    torch.manual_seed(0)
    args = [torch.randn(6, 8, requires_grad=True), torch.randn(8, 16, requires_grad=True),
            torch.randn(16, requires_grad=True)]
    ref_args = [a.detach().clone().requires_grad_() for a in args]
    ora_args = [a.detach().double().requires_grad_() for a in args]
    out = pyfuser.compile(f)(*args)
    ref, ora = f(*ref_args), f(*ora_args)
    torch.testing.assert_close(out, ref)
    assert out.requires_grad
    for o in (out, ref, ora):
        o.square().sum().backward()
    for a, r, o in zip(args, ref_args, ora_args):
        assert_as_close_as_eager(a.grad, r.grad, o.grad)
    fw, bw = _graphs("forward"), _graphs("backward")
    assert len(fw) == len(bw) == 1
    # the matmul stays an aten call; everything around it fuses into one region
    assert fw[0].report()["regions"] == 1 and fw[0].kernels() >= 1
    assert "aten.mm.default has no lowering" in fw[0].report()["unfused"]
    # gelu backward, layer norm backward and the bias gradient's sum fuse
    assert bw[0].report()["regions"] == 1
    ops = {op for r in bw[0].regions for op in r.ops}
    assert {"aten.native_layer_norm_backward.default", "aten.gelu_backward.default"} <= ops


def test_inference_graph_under_no_grad():
    f = pyfuser.compile(lambda x, y: torch.sigmoid(x) * y - x.sum(-1, keepdim=True))
    x, y = torch.randn(4, 9), torch.randn(4, 9)
    with torch.no_grad():
        torch.testing.assert_close(f(x, y), torch.sigmoid(x) * y - x.sum(-1, keepdim=True))
    assert [g.kind for g in _graphs()] == ["inference"]


def test_fullgraph():
    """The backend never breaks a graph: fullgraph=True compiles a function whose graph mixes
    fused and unfused ops (the name "pyfuser" is tested through the installed entry point)."""
    def f(x, w):
        h = torch.tanh(x @ w)
        return torch.softmax(h, -1) * torch.cumsum(h, 0)
    x, w = torch.randn(5, 6), torch.randn(6, 7)
    got = torch.compile(f, backend=pyfuser.backend, fullgraph=True)(x, w)
    torch.testing.assert_close(got, f(x, w))
    assert _graphs()[0].report()["regions"] >= 1


def test_unknown_backend_options_are_an_error():
    with pytest.raises(Exception, match="unknown option"):
        torch.compile(lambda x: x + 1, backend=pyfuser.backend, options={"bogus": 1})(torch.ones(2))


def test_lowering_refusal_leaves_the_node_to_fx_and_partitions_again():
    """max.dim's indices of a bool tensor have no lowering: the node the graph reads them
    from stays an aten call (the reason recorded) and the rest still fuses."""
    def f(x):
        v, i = (x * 2 > 1).max(dim=1)
        return v.int() + 1, i
    x = torch.randn(4, 6)
    got = pyfuser.compile(f)(x)
    want = f(x)
    torch.testing.assert_close(got[0], want[0])
    assert torch.equal(got[1], want[1])
    g = _graphs()[0]
    assert any("is not produced by its lowering" in r for r in g.unsupported.values()), g.unsupported
    assert g.report()["regions"] >= 1


def test_identical_layers_share_one_fusion():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(16, 16)
            self.norm = torch.nn.LayerNorm(16)

        def forward(self, x):
            return self.norm(F.silu(self.lin(x)) + x)

    torch.manual_seed(0)
    model = torch.nn.Sequential(*[Block() for _ in range(3)])
    x = torch.randn(4, 16)
    with torch.no_grad():
        got = pyfuser.compile(model)(x)
        torch.testing.assert_close(got, model(x))
    regions = _graphs()[0].regions
    assert len(regions) == 3
    assert len({id(r.fusion) for r in regions}) == 1       # one Fusion, one set of kernels


def test_partition_never_makes_regions_depend_on_each_other_both_ways():
    """g1 -> h2 and y -> n with g1, n fusible in one region and y, h2 in another would make the
    two regions need each other; the partitioner must not join them so."""
    def f(a, b):
        g1 = a * 2                  # region A
        y = b + 1                   # region B
        h2 = torch.mm(g1, g1) + y   # needs A, joins ... (mm is not fused)
        n = g1 * y                  # needs A and B
        return h2, n
    gm = torch.fx.symbolic_trace(f)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp
    aten_gm = torch.fx.experimental.proxy_tensor.make_fx(f)(torch.randn(4, 4), torch.randn(4, 4))
    FakeTensorProp(aten_gm, FakeTensorMode()).propagate(torch.randn(4, 4), torch.randn(4, 4))
    nodes = list(aten_gm.graph.nodes)
    outs = set(nodes[-1].all_input_nodes)
    supported = {n for n in nodes if node_support(n, outs)[0]}
    regions = partition(nodes, supported)
    order = unit_order(nodes, regions)             # asserts the units form a DAG
    assert len(order) >= len(regions)
    compiled = compile_graph(aten_gm, None, "inference")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    for got, want in zip(compiled([a, b]), f(a, b)):
        torch.testing.assert_close(got, want)
    del gm


def test_views_at_the_end_stay_views_and_layouts_are_eagers():
    def f(x):
        y = (x + 1).transpose(0, 1)
        z = (x * 3).t().contiguous()       # eager makes this copy contiguous
        return y, z
    x = torch.randn(5, 3)
    with torch.no_grad():
        y, z = pyfuser.compile(f)(x)
    want_y, want_z = f(x)
    torch.testing.assert_close(y, want_y)
    torch.testing.assert_close(z, want_z)
    assert y.stride() == want_y.stride() and z.stride() == want_z.stride()
    assert z.is_contiguous()


def test_mixed_dtypes_and_scalars_follow_eager_promotion():
    def f(a, b, c):
        return (a.to(torch.int32) + b) * 3, torch.where(c > 0, a, 2.5).to(torch.bfloat16)
    a = torch.randint(-5, 5, (4, 6))
    b = torch.randint(-5, 5, (4, 6), dtype=torch.int32)
    c = torch.randn(4, 6)
    with torch.no_grad():
        got = pyfuser.compile(f)(a, b, c)
    want = f(a, b, c)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        assert torch.equal(g, w)


def test_partition_of_random_graphs_is_convex_and_acyclic():
    """Random DAGs, random nodes supported: every region is convex (no path leaves it and comes
    back) and the regions with the other nodes order topologically."""
    import random
    rng = random.Random(0)
    add, mm = torch.ops.aten.add.Tensor, torch.ops.aten.mm.default
    for trial in range(200):
        g = torch.fx.Graph()
        nodes = [g.placeholder(f"x{i}") for i in range(2)]
        supported = set()
        for i in range(rng.randint(3, 25)):
            args = rng.sample(nodes, min(len(nodes), 2))
            fused = rng.random() < 0.7
            n = g.call_function(add if fused else mm, tuple(args))
            if fused:
                supported.add(n)
            nodes.append(n)
        g.output(nodes[-1])
        order = list(g.nodes)
        regions = partition(order, supported)
        unit_order(order, regions)
        for r in regions:
            members = set(r.nodes)
            assert members <= supported
            # no path from the region through outside nodes back into it
            seen, stack = set(), [u for n in r.nodes for u in n.users if u not in members]
            while stack:
                u = stack.pop()
                if u in seen:
                    continue
                seen.add(u)
                assert u not in members, f"trial {trial}: region {r.nodes} is not convex"
                stack.extend(u.users)


@pytest.mark.parametrize("op", ["mean", "var", "var_mean", "sum"])
def test_reductions_over_an_axis_expanded_inside_the_region_count_its_expanded_size(op):
    """Fuzzer seed 50358: `(a * 2).expand(2, -1, 2)` then mean / var over the expanded axes
    divided by the unexpanded count (an expanded axis' extent is 1; its size is the expanded
    one): twice eager's mean. The count is now the expanded size."""
    def f(a):
        v = (a * 2).expand([2, -1, 2])
        if op == "var_mean":
            return torch.var_mean(v, (1, 2), correction=1)
        return getattr(torch, op)(v, (1, 2)) if op != "var" else torch.var(v, (1, 2), correction=1)
    a = torch.randn(7, 1)
    got, want = pyfuser.compile(f)(a), f(a)
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple)
                    else (want,)):
        torch.testing.assert_close(g, w)


@pytest.mark.parametrize("shape,dim", [((0, 37), -2), ((5, 0), -1), ((3, 0, 4), 1)])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "sum", "var_mean"])
def test_reductions_over_an_empty_axis(shape, dim, op):
    """Fuzzer seed 60274: softmax over an axis of size 0 planned a persistent kernel with
    0-element arrays, which NVRTC rejects. Eager's values (empty, 0 sums, NaN variances)."""
    fns = {"softmax": lambda x: torch.softmax(x * 2, dim),
           "log_softmax": lambda x: torch.log_softmax(x + 1, dim),
           "sum": lambda x: (x * 2).sum(dim),
           "var_mean": lambda x: torch.var_mean(x * 2, dim)}
    x = torch.randn(*shape)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")            # var_mean: no degrees of freedom
        got, want = pyfuser.compile(fns[op])(x), fns[op](x)
    for g, w in zip(got if isinstance(got, tuple) else (got,),
                    want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape and g.dtype == w.dtype
        torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 2.5])
def test_var_of_one_element_propagates_nan_and_inf_as_eager(value):
    """Fuzzer seed 60439: the variance of a 0-dim value (its one element) was the constant 0,
    where eager's (x - mean)^2 gives NaN for a NaN or infinite element."""
    def f(x):
        return torch.var(x * 1.0, 0, correction=0), torch.var_mean(x + 0.0, 0, correction=0)[0]
    x = torch.tensor(value)
    for g, w in zip(pyfuser.compile(f)(x), f(x)):
        torch.testing.assert_close(g, w, equal_nan=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int32, torch.bool])
def test_prod_and_integer_logsumexp_fuse(dtype):
    """Left to eager before the FX fuzzer's --more-ops run (seeds 870200-871499): `prod` (no
    lowering) and `logsumexp` of an integer or bool tensor (eager's is of the tensor in the
    default dtype). Both fuse now, through the reduction kernels, with eager's dtypes."""
    from pyfuser.frontend.fx import compiled_graphs, reset_compiled

    def f(x):
        return (torch.prod(x * 1, -1), torch.prod(x.t() * 1, 0, keepdim=True), torch.prod(x + 0),
                torch.logsumexp(x * 1 if dtype != torch.bool else x.logical_not(), (0, 1)))
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(5, 7, generator=g) + 0.5).to(dtype) if dtype.is_floating_point else \
        torch.randint(-2, 3, (5, 7), generator=g).to(dtype)
    reset_compiled()
    got, want = pyfuser.compile(f)(x), f(x)
    tol = {} if dtype != torch.float16 else {"rtol": 1e-2, "atol": 1e-2}
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        torch.testing.assert_close(a, b, **tol)
    assert not any(c.report()["unfused"] for c in compiled_graphs())
