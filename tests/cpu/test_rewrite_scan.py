"""cumsum of integers over a short axis as a masked sum (frontend/fx/rewrite_scan.py): fused with
its producers through torch.compile, results bit-equal to eager's (values, dtype, shape), every
kernel compiled with NVRTC for sm_90; floating, long and symbolic-size cumsums stay eager's."""
import pytest
import torch

from pyfuser.frontend.fx import compiled_graphs

from compile_checks import assert_ran_as_sm90_kernels

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _compiled(f, *args, dynamic=False):
    import pyfuser
    got = torch.compile(f, backend=pyfuser.backend, dynamic=dynamic)(*args)
    want = f(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)
    (g,) = compiled_graphs()
    return g


def _unfused(g) -> dict:
    """{reason: count} of the nodes left unfused that name cumsum."""
    return {k: v for k, v in g.report()["unfused"].items() if "cumsum" in k}


def test_packed_sequence_detection_is_one_region():
    """HF's packed-sequence test over position ids: diff, compare, cumsum in one kernel."""
    def f(p):
        d = torch.diff(p, prepend=p[:, :1] - 1, dim=-1)
        return (d != 1).cumsum(-1) * 2
    p = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7]])
    g = _compiled(f, p)
    assert len(g.regions) == 1 and not _unfused(g)
    assert [r.kernels() for r in g.regions] == [1]       # the diff's cat and slices included
    assert_ran_as_sm90_kernels(g.regions)


@pytest.mark.parametrize("dtype", [torch.bool, torch.int8, torch.int32, torch.int64])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_integer_cumsum_along_each_axis(dtype, dim):
    gen = torch.Generator().manual_seed(3)
    x = torch.randint(-50, 50, (5, 7, 3), generator=gen).to(dtype)
    g = _compiled(lambda x: (x + x).cumsum(dim) + 1, x) if dtype is not torch.bool else \
        _compiled(lambda x: (~x).cumsum(dim) + 1, x)
    assert not _unfused(g)
    assert_ran_as_sm90_kernels(g.regions)


def test_dtype_argument_and_a_non_contiguous_input():
    x = torch.randint(0, 9, (6, 4)).t()                  # [4, 6], strides (1, 4)
    g = _compiled(lambda x: torch.cumsum(x * 3, 1, dtype=torch.int32), x)
    assert not _unfused(g)
    assert_ran_as_sm90_kernels(g.regions)


def test_overflowing_int32_wraps_as_eager():
    x = torch.full((3, 5), 2 ** 30, dtype=torch.int32)
    g = _compiled(lambda x: torch.cumsum(x + 1, -1, dtype=torch.int32), x)
    assert not _unfused(g)


@pytest.mark.parametrize("case", ["float", "long_axis", "no_fused_neighbour"])
def test_what_stays_eager(case):
    if case == "float":
        f, x = (lambda x: (x * 2).cumsum(-1) + 1), torch.randn(4, 9)
    elif case == "long_axis":
        f, x = (lambda x: (x * 2).cumsum(-1) + 1), torch.randint(0, 3, (2, 1100))
    else:
        f, x = (lambda x: x.cumsum(-1)), torch.randint(0, 3, (2, 9))
    import pyfuser
    got = torch.compile(f, backend=pyfuser.backend)(x)
    assert torch.equal(got, f(x)) if case != "float" else torch.allclose(got, f(x))
    (g,) = compiled_graphs()
    assert _unfused(g) == {"aten.cumsum.default has no lowering": 1}


def test_symbolic_sizes_stay_eager():
    import pyfuser
    f = lambda x: (x * 2).cumsum(-1) + 1      # noqa: E731
    fn = torch.compile(f, backend=pyfuser.backend, dynamic=True)
    for n in (5, 9):
        x = torch.randint(0, 4, (3, n))
        assert torch.equal(fn(x), f(x))
    graphs = compiled_graphs()
    assert graphs and all(_unfused(g) == {"aten.cumsum.default has no lowering": 1}
                          for g in graphs)


def test_positions_from_an_arange_join_the_masked_sum():
    """GPT-2's positions: an arange's diff (a cat and slices of the iota) before the cumsum; the
    reduction kernel computes the iota at the shifted index (it was a kernel of its own)."""
    def f(x):
        p = torch.arange(x.shape[1]).expand(x.shape[0], -1)
        d = torch.diff(p, prepend=p[:, :1] - 1, dim=-1)
        return (d != 1).cumsum(-1) + x
    g = _compiled(f, torch.randint(0, 5, (3, 12)))
    assert [r.kernels() for r in g.regions] == [1]
    assert_ran_as_sm90_kernels(g.regions)


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("n", [16, 13])
def test_sums_of_cats_holding_an_iota(axis, n):
    """An iota read at a shifted index inside reduction kernels, along a reduced and a kept
    axis, vectorizable (16) or not (13): start + shifted index * step, per lane."""
    def f(x):
        it = (torch.arange(n) * 3 + 1).float()
        it = it.expand(x.shape[0], n) if axis == 1 else it[:, None].expand(n, x.shape[1])
        return torch.cat([x * 2, it], axis).sum(1 - axis) * 1     # the iota second: shifted
    x = torch.randn(16, 16)
    g = _compiled_close(f, x)
    assert [r.kernels() for r in g.regions] == [1]
    assert_ran_as_sm90_kernels(g.regions)


def _compiled_close(f, x):
    import pyfuser
    got = torch.compile(f, backend=pyfuser.backend)(x)
    want = f(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-5)
    (g,) = compiled_graphs()
    return g


def test_bool_result_dtype_raises_as_eager():
    """`cumsum(dtype=torch.bool)` is refused by eager's kernels; the rewrite must not answer it
    with a bool sum (it used to return a value where eager raises)."""
    import pyfuser
    f = lambda x: torch.cumsum(x * 7, 1, dtype=torch.bool)   # noqa: E731
    x = torch.randint(-5, 5, (4, 6))
    with pytest.raises(Exception, match="Bool"):
        f(x)
    with pytest.raises(Exception, match="Bool"):
        torch.compile(f, backend=pyfuser.backend)(x)
