"""2-D max pooling through torch.compile (frontend/lowering/aten_pooling.py):
max_pool2d_with_indices and its backward fused, against eager exactly (values, NaN and -inf
windows, ties, padding, strides, dilation, ceil_mode, rank 3 and 4, float32 and bfloat16), the
indices eager's, the gradient eager's; a conv / batch norm / ReLU / max-pool stem's training
step as close to float64 as eager's with nothing of the pooling left to eager; the refusals."""
import pytest
import torch
import torch.nn.functional as F

import pyfuser
from compile_checks import assert_ran_as_sm90_kernels, check_fn
from pyfuser.errors import UnsupportedOpError
from pyfuser.frontend.fx import compiled_graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _unfused():
    return {k: v for g in compiled_graphs() for k, v in g.unsupported.items() if "pool" in k}


def _regions():
    return [r for g in compiled_graphs() for r in g.regions]


def _special(x):
    """NaNs (one window with two), a window of -inf, ties."""
    x = x.clone()
    x.view(-1)[3] = float("nan")
    x.view(-1)[5] = float("nan")
    x[0, 0, -3:, -3:] = float("-inf")
    x[-1, -1, :, :4] = 0.5
    return x


@pytest.mark.parametrize("cfg", [
    dict(kernel_size=3, stride=2, padding=1),
    dict(kernel_size=(2, 3), stride=(1, 2), padding=(1, 0)),
    dict(kernel_size=3, stride=2, padding=1, dilation=2),
    dict(kernel_size=2, stride=2, ceil_mode=True),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), ceil_mode=True),
], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_values_and_indices_are_eager_s(cfg, dtype):
    x = _special(torch.randn(2, 3, 9, 11, generator=torch.Generator().manual_seed(1))).to(dtype)

    def f(x):
        y, i = F.max_pool2d(x * 2, return_indices=True, **cfg)
        return y, i
    got, want = pyfuser.compile(f)(x), f(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.stride() == w.stride()
        assert torch.equal(g.isnan(), w.isnan()) and torch.equal(g.nan_to_num(), w.nan_to_num())
    assert not _unfused(), _unfused()
    assert_ran_as_sm90_kernels(_regions())


def test_rank_3_input():
    x = torch.randn(4, 7, 8, generator=torch.Generator().manual_seed(2))
    f = lambda x: F.max_pool2d(x.sin(), 3, 1, 1, return_indices=True)   # noqa: E731
    got, want = pyfuser.compile(f)(x), f(x)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert not _unfused(), _unfused()


@pytest.mark.parametrize("cfg", [dict(kernel_size=3, stride=2, padding=1),
                                 dict(kernel_size=2, stride=1),
                                 dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1),
                                      dilation=(1, 2), ceil_mode=True)], ids=str)
def test_gradient_is_eager_s(cfg):
    """The gradient of a pooling with overlapping windows (3 / 2: an input position in up to
    four windows) and ties (several windows picking one position): each input position sums
    the gradients of the windows whose index is it, in eager's order."""
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 10, 9, generator=gen).round(decimals=1)     # ties
    gy = torch.randn(*F.max_pool2d(x, **cfg).shape, generator=gen)

    def f(x):
        return (F.max_pool2d(x * 1.5, **cfg) * gy).sum()
    xs, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    pyfuser.compile(f)(xs).backward()
    f(xe).backward()
    torch.testing.assert_close(xs.grad, xe.grad, rtol=1e-6, atol=1e-6)
    assert not _unfused(), _unfused()
    ops = {op for r in _regions() for op in r.ops}
    assert {"aten.max_pool2d_with_indices.default",
            "aten.max_pool2d_with_indices_backward.default"} <= ops
    assert_ran_as_sm90_kernels(_regions())


def test_forward_and_backward_are_one_kernel_each():
    """The windows' flat positions are computed inside the gathering kernel (a gather's index
    computed from iotas: pointwise_graph.index_leaves), not written to memory as int64 tensors
    by a kernel of their own: the forward (values and indices) and the backward each run as
    one kernel."""
    from pyfuser.runtime import dispatch
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(2, 3, 11, 10, generator=gen)
    gy = torch.randn(2, 3, 6, 5, generator=gen)

    def f(x):
        return F.max_pool2d(x, 3, 2, 1)
    xs, xe = x.clone().requires_grad_(), x.clone().requires_grad_()
    got, want = pyfuser.compile(f)(xs), f(xe)
    assert torch.equal(got, want)
    got.backward(gy)
    want.backward(gy)
    torch.testing.assert_close(xs.grad, xe.grad, rtol=0, atol=0)
    pools = [r for r in _regions() if any("max_pool2d" in op for op in r.ops)]
    assert len(pools) == 2, [r.ops for r in _regions()]
    for r in pools:
        report = dispatch.last_report(r.fusion)
        assert report.kernels == 1 and report.eager_segments == 0, (r.ops, report)


def test_resnet_stem_trains_as_close_to_float64_as_eager():
    """A ResNet stem (convolution, training batch norm, ReLU, 3 / 2 max pool): forward and
    every input's gradient through pyfuser as close to float64 as eager's."""
    def stem(x, w, gamma, beta):
        y = F.batch_norm(F.conv2d(x, w, padding=1), None, None, gamma, beta, training=True)
        return F.max_pool2d(torch.relu(y), 3, 2, 1)
    check_fn(stem, (2, 3, 12, 12), (8, 3, 3, 3), (8,), (8,), seed=4,
             loss=lambda out: (out * out.detach().sin()).sum())
    assert not _unfused(), _unfused()


def test_refusals_leave_the_op_to_eager():
    from pyfuser.frontend.lowering.aten_pooling import _max_pool2d_with_indices
    from pyfuser.ir import DataType, Fusion
    from pyfuser.ir import builder as B
    with Fusion():
        x4 = B.define_tensor([2, 3, 8, 8], DataType.Float)
        xi = B.define_tensor([2, 3, 8, 8], DataType.Int)
        x2 = B.define_tensor([8, 8], DataType.Float)
        with pytest.raises(UnsupportedOpError, match="floating tensor of rank 3 or 4"):
            _max_pool2d_with_indices(xi, [2, 2])
        with pytest.raises(UnsupportedOpError, match="floating tensor of rank 3 or 4"):
            _max_pool2d_with_indices(x2, [2, 2])
        with pytest.raises(UnsupportedOpError, match="eager raises"):
            _max_pool2d_with_indices(x4, [2, 2], [2, 2], [2, 2])          # padding over k / 2
        with pytest.raises(UnsupportedOpError, match="eager raises"):
            _max_pool2d_with_indices(x4, [2, 2], [2, 2], [0, 0], [0, 1])  # dilation 0
        with pytest.raises(UnsupportedOpError, match="one or two constant ints"):
            _max_pool2d_with_indices(x4, [2, 2, 2])


def test_output_sizes_are_eager_s():
    """_out_size against eager's output sizes, ceil_mode's last window included."""
    from pyfuser.frontend.lowering.aten_pooling import _out_size
    for n in range(3, 12):
        for k, s, p, d in ((2, 2, 0, 1), (3, 2, 1, 1), (3, 3, 1, 2), (2, 3, 1, 1), (4, 2, 2, 1)):
            if (k - 1) * d + 1 > n + 2 * p:
                continue
            for ceil in (False, True):
                want = F.max_pool2d(torch.empty(1, 1, n, n), k, s, p, d, ceil).shape[-1]
                assert _out_size(n, k, s, p, d, ceil) == want, (n, k, s, p, d, ceil)


@pytest.mark.parametrize("ceil", [False, True])
def test_dynamic_sizes(ceil):
    """dynamic=True: the output sizes (ceil_mode's last-window rule too) are scalar expressions
    of the input's; without ceil_mode new heights and widths reuse the compiled graph (Dynamo
    guards ceil_mode's rule, so there it may compile again)."""
    f = lambda x: F.max_pool2d(x.cos(), 3, 2, 1, ceil_mode=ceil, return_indices=True)  # noqa
    c = torch.compile(f, backend=pyfuser.backend, dynamic=True)
    gen = torch.Generator().manual_seed(5)
    for shape in ((2, 3, 9, 11), (3, 2, 12, 7), (4, 2, 6, 8)):
        x = torch.randn(*shape, generator=gen)
        got, want = c(x), f(x)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), shape
    assert not _unfused(), _unfused()
    assert ceil or len(compiled_graphs()) == 1


def test_a_channels_last_result_is_left_to_eager():
    """The lowering writes row-major results: a pool of a channels-last input (whose result is
    channels-last in eager) stays eager's, with the reason, and keeps eager's strides."""
    x = torch.randn(2, 4, 8, 8).to(memory_format=torch.channels_last)
    f = lambda x: F.max_pool2d(x.exp(), 2)        # noqa: E731
    got, want = pyfuser.compile(f)(x), f(x)
    assert torch.equal(got, want) and got.stride() == want.stride()
    (why,) = _unfused().values()
    assert "channels-last" in why
