"""Random numbers drawn inside fused kernels (Philox4x32-10): the torch-op Philox against a plain
Python reference checked on Random123's known answers, the CPU interpreter's bits against the
reference, dropout / rand_like / bernoulli through the torch.compile backend (reproducible under
torch.manual_seed, the keep rate and independence of the masks, the backward's mask is the
forward's)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.ir import builder as B
from pyfuser.ir import philox
from pyfuser.ir.dtypes import DataType
from pyfuser.ir.evaluator import evaluate
from pyfuser.ir.fusion import Fusion
from pyfuser.runtime import dispatch, rng

import philox_reference as REF


pytestmark = pytest.mark.usefixtures("fresh_compile")


# ---- the generator ------------------------------------------------------------------------------
@pytest.mark.parametrize("ctr,key,want", REF.KATS)
def test_reference_and_torch_philox_give_random123s_known_answers(ctr, key, want):
    assert REF.philox4x32_10(ctr, key) == want
    got = philox.philox4x32(*ctr, *key)
    assert tuple(int(w) for w in got) == want


def test_torch_philox_bits_equal_the_reference():
    """Seeds across the 64-bit range (negative int64 bit patterns included), offsets that carry
    into the high word, indices across the 4-word groups."""
    cases = [(0, 0, 0), (1234, 8, 1), ((1 << 64) - 1, (1 << 34) - 4, 3), (-5, 4 * 7, 0),
             (0x0123456789ABCDEF, 4 * ((1 << 32) - 1), 2)]
    index = torch.tensor([0, 1, 2, 3, 4, 5, 1023, (1 << 31) + 7, (1 << 40) + 2])
    for seed, offset, k in cases:
        got = philox.random_bits(seed if seed < 1 << 63 else seed - (1 << 64), offset, k, index)
        want = [REF.bits(seed, offset, k, int(i)) for i in index]
        assert [int(v) for v in got] == want, (seed, offset, k)
        u = philox.uniform(seed if seed < 1 << 63 else seed - (1 << 64), offset, k, index, 24)
        assert [float(v) for v in u] == [REF.uniform(seed, offset, k, int(i), 24) for i in index]


def _rand_fusion(shape, dtype=DataType.Float, ops=1):
    f = Fusion()
    with f:
        x = B.define_tensor([-1] * len(shape), DataType.Float)
        outs = []
        for _ in range(ops):
            u = B.rand([d.extent for d in x.logical], dtype)
            outs.append(u)
        f.add_output(B.elementwise("add", x, outs[0]))
        for u in outs:
            f.add_output(u)
    return f


@pytest.mark.parametrize("shape,dtype", [((37, 129), DataType.Float),      # 1-D, one lane
                                         ((64, 256), DataType.Float),      # vectorized
                                         ((3, 5, 64), DataType.Half),
                                         ((8, 32), DataType.BFloat16)])
def test_kernel_bits_equal_the_reference(shape, dtype):
    """The generated kernel (CPU interpreter of its kernel IR, the CUDA source NVRTC-compiled)
    draws the reference's numbers at every element's row-major index; so does the evaluator."""
    f = _rand_fusion(shape, dtype, ops=2)
    x = torch.zeros(shape)
    with rng.fixed(99, 40):
        out = dispatch.execute_fusion(f, [x])
    assert dispatch.run_summary(f)["kernels"] == 1
    digits = {DataType.Float: 24, DataType.Half: 11, DataType.BFloat16: 8}[dtype]
    flat = [o.reshape(-1).float() for o in out[1:]]
    n = flat[0].numel()
    picks = sorted({0, 1, 2, 3, 5, n // 2, n - 1})
    for k, u in enumerate(flat):
        assert [float(u[i]) for i in picks] == [REF.uniform(99, 40, k, i, digits) for i in picks]
        want = philox.uniform(99, 40, k, torch.arange(n), digits)
        assert torch.equal(u, want)
    assert out[1].dtype == dtype.torch and float(out[1].max()) < 1.0
    with rng.fixed(99, 40):
        ev = evaluate(f, [x])
    for a, b in zip(out, ev):
        assert torch.equal(a, b)


def test_each_launch_advances_the_offset():
    f = _rand_fusion((16, 16), ops=3)
    x = torch.zeros(16, 16)
    with rng.fixed(7, 0):
        first = dispatch.execute_fusion(f, [x])
        second = dispatch.execute_fusion(f, [x])
    with rng.fixed(7, 4 * 3):                 # 3 random ops: 12 of the offset a launch
        again = dispatch.execute_fusion(f, [x])
    assert not torch.equal(first[1], second[1])
    assert all(torch.equal(a, b) for a, b in zip(second, again))
    assert torch.equal(first[3], philox.uniform(7, 0, 2, torch.arange(256), 24).view(16, 16))


def test_cpu_launch_state_follows_torch_manual_seed():
    torch.manual_seed(3)
    a = rng.launch_state("cpu", 4)
    torch.manual_seed(3)
    b = rng.launch_state("cpu", 4)
    c = rng.launch_state("cpu", 4)
    assert a == b and a != c and a[1] == 0


# ---- through torch.compile ----------------------------------------------------------------------
def _dropout_fn(p):
    def f(x, y):
        return F.dropout(x * 2, p=p, training=True) + y
    return f


def test_dropout_fuses_and_is_reproducible():
    f = pyfuser.compile(_dropout_fn(0.3))
    x, y = torch.randn(64, 96), torch.randn(64, 96)
    torch.manual_seed(0)
    a = f(x, y)
    torch.manual_seed(0)
    b = f(x, y)
    c = f(x, y)
    assert torch.equal(a, b) and not torch.equal(a, c)
    g = compiled_graphs()[0]
    assert any("aten.native_dropout.default" in r.ops for r in g.regions)
    assert "aten.native_dropout.default" not in str(g.gm.code)     # no eager dropout left
    # kept elements are x * 2 / 0.7 + y, dropped ones y
    kept = a != y
    torch.testing.assert_close(a[kept], (x * 2 / 0.7 + y)[kept])


def test_dropout_keep_rate_and_independence():
    """p = 0.3 over 2^17 elements: the keep rate within 5 standard deviations of 0.7; the masks
    of neighbouring elements, of the two dropouts of one kernel and of two calls are
    independent (their joint keep rate is the product, within 5 standard deviations)."""
    p, n = 0.3, 1 << 17

    def two(x):
        return F.dropout(x, p, True), F.dropout(x, p, True)
    f = pyfuser.compile(two)
    x = torch.ones(256, n // 256)
    torch.manual_seed(1)
    a, b = f(x)
    c, _ = f(x)
    q = 1 - p
    masks = [t.reshape(-1) != 0 for t in (a, b, c)]
    for m in masks:
        assert abs(m.float().mean().item() - q) < 5 * math.sqrt(q * p / n)
    joint = q * q
    sd = 5 * math.sqrt(joint * (1 - joint) / n)
    m = masks[0]
    for other in (m.roll(1), m.roll(4), masks[1], masks[2]):
        assert abs((m & other).float().mean().item() - joint) < sd
    # and not the same stream shifted: the second op's mask is not the first's
    assert (masks[0] != masks[1]).float().mean().item() > 0.3


def test_backward_uses_the_forwards_mask():
    def f(x, w):
        return F.dropout(x * w, p=0.4, training=True)
    x = torch.randn(33, 65, requires_grad=True)
    w = torch.randn(65, requires_grad=True)
    out = pyfuser.compile(f)(x, w)
    out.backward(torch.ones_like(out))
    kept = out != 0
    scale = 1 / 0.6
    torch.testing.assert_close(x.grad, torch.where(kept, w.detach() * scale, 0.0).expand_as(x))
    want_w = torch.where(kept, x.detach() * scale, 0.0).sum(0)
    torch.testing.assert_close(w.grad, want_w, rtol=1e-5, atol=1e-5)
    bw = [g for g in compiled_graphs() if g.kind == "backward"][0]
    assert any("aten.native_dropout_backward.default" in r.ops for r in bw.regions)


def test_rand_like_and_bernoulli_fuse():
    def f(x):
        u = torch.rand_like(x)
        m = torch.empty_like(x).bernoulli_(0.25)
        return x * (u < 0.5) + m
    x = torch.ones(128, 128)
    torch.manual_seed(5)
    a = pyfuser.compile(f)(x)
    torch.manual_seed(5)
    b = pyfuser.compile(f)(x)
    assert torch.equal(a, b)
    ops = {op for r in compiled_graphs()[0].regions for op in r.ops}
    assert "aten.rand_like.default" in ops and "aten.bernoulli.p" in ops
    vals = set(a.unique().tolist())
    assert vals <= {0.0, 1.0, 2.0}
    half = (a >= 1).float().mean().item()      # u < 0.5 or m: 1 - 0.5 * 0.75
    assert abs(half - 0.625) < 5 * math.sqrt(0.625 * 0.375 / a.numel())


# ---- in reduction and normalization kernels -----------------------------------------------------
def _rand_norm_fusion(shape, axes, dtype=DataType.Float):
    """y = x * (u < 0.75) (u uniform, x's shape; 0.75 exact in every dtype), its sum over `axes`
    and y - that sum broadcast back (a normalization: the row is used again after its
    reduction), plus u itself."""
    f = Fusion()
    with f:
        x = B.define_tensor([-1] * len(shape), DataType.Float)
        u = B.rand([d.extent for d in x.logical], dtype)
        y = B.elementwise("mul", x, B.elementwise("lt", u, 0.75))
        s = B.reduction("sum", y, axes, keepdim=True)
        f.add_output(B.elementwise("sub", y, s))
        f.add_output(B.reduction("sum", y, axes))
        f.add_output(u)
    return f


@pytest.mark.parametrize("shape,axes,dtype", [((6, 100), [1], DataType.Float),       # inner
                                              ((64, 256), [1], DataType.BFloat16),  # vectorized
                                              ((300, 24), [0], DataType.Float),     # outer
                                              ((4, 9, 40), [0, 2], DataType.Half)])
def test_reduction_kernels_draw_the_evaluators_bits(shape, axes, dtype):
    """Random numbers inside a reduction-family kernel (reduction, inner / outer persistent) are
    the stream's numbers at each element's row-major index, as in a pointwise kernel: the
    fused kernel (CPU interpreter of its kernel IR, the CUDA source NVRTC-compiled) gives the
    evaluator's bits, and u equals the reference's uniform numbers."""
    f = _rand_norm_fusion(shape, axes, dtype)
    x = torch.randn(shape)
    with rng.fixed(21, 8):
        out = dispatch.execute_fusion(f, [x])
    report = dispatch.last_report(f)
    assert report.kernels == 1, report
    assert report.segments[-1].scheduler in ("reduction", "inner_persistent", "outer_persistent")
    with rng.fixed(21, 8):
        ev = evaluate(f, [x])
    for a, b in zip(out, ev):
        assert a.dtype == b.dtype and a.shape == b.shape
    assert torch.equal(out[2], ev[2])
    n = out[2].numel()
    digits = {DataType.Float: 24, DataType.Half: 11, DataType.BFloat16: 8}[dtype]
    assert torch.equal(out[2].reshape(-1).float(), philox.uniform(21, 8, 0, torch.arange(n), digits))
    torch.testing.assert_close(out[1], ev[1], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(out[0], ev[0], rtol=1e-5, atol=1e-4)


def test_dropout_residual_and_layer_norm_are_one_kernel():
    """A transformer's dropout + residual add + layer_norm (GPT-2, BERT): one inner persistent
    kernel drawing the mask, writing the residual stream and the normalized rows; the mask is
    the forward's in the backward."""
    ln = torch.nn.LayerNorm(96)

    def f(x, r):
        h = F.dropout(x, 0.1, True) + r
        return h, ln(h)
    x = torch.randn(4, 16, 96, requires_grad=True)
    r = torch.randn(4, 16, 96, requires_grad=True)
    torch.manual_seed(0)
    h, y = pyfuser.compile(f)(x, r)
    fw = [g for g in compiled_graphs() if g.kind == "forward"][0]
    (region,) = [reg for reg in fw.regions if "aten.native_dropout.default" in reg.ops]
    assert "aten.native_layer_norm.default" in region.ops
    report = dispatch.last_report(region.fusion)
    assert report.kernels == 1 and report.segments[-1].scheduler == "inner_persistent", report
    kept = (h - r) != 0
    assert abs(kept.float().mean().item() - 0.9) < 0.02
    torch.testing.assert_close((h - r)[kept], (x / 0.9)[kept])
    torch.testing.assert_close(y, ln(h), rtol=1e-5, atol=1e-5)
    (y.sum() + h.sum()).backward()
    hh = h.detach().requires_grad_()
    (ln(hh).sum() + hh.sum()).backward()
    torch.testing.assert_close(x.grad, torch.where(kept, hh.grad / 0.9, 0.0), rtol=1e-5, atol=1e-5)
