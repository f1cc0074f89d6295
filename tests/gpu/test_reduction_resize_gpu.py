"""Slices, pads and cats inside reduction-family kernels on a GPU (their CPU tests:
tests/cpu/test_reduction_resize.py): GPT-2's q / k / v gradient cat and the bias gradient's sum
over the tokens as one kernel at the benchmark's size (8 x 512 tokens, hidden 768), the cat
bit-equal to eager's and the sums within docs/reductions.md's tolerances, float32 and bfloat16,
odd sizes, non-contiguous operands, pads and slices, normalizations over a cat along the rows
or columns; outputs poisoned (an element the kernel does not write shows as NaN)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compiled_graphs, reset_compiled
from pyfuser.runtime import dispatch

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.bfloat16]


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    monkeypatch.setenv("PYFUSER_POISON_OUTPUTS", "1")
    torch._dynamo.reset()
    reset_compiled()
    yield
    torch._dynamo.reset()
    torch.cuda.synchronize()


def _close(got, want, n: int):
    assert got.dtype == want.dtype and got.shape == want.shape
    scale = max(want.float().abs().max().item() if want.numel() else 1.0, 1.0)
    atol, rtol = 2 ** -20 * (1 + n ** 0.5) * scale, 1e-5
    if want.dtype == torch.bfloat16:
        atol, rtol = max(64 * atol, 2 ** -8 * scale), 1.6e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol)


def _run(f, *args, n: int = 1, exact=()):
    with torch.no_grad():
        fn = pyfuser.compile(f)
        fn(*args)
        got = fn(*args)                       # the cached call
        want = f(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for i, (g, w) in enumerate(zip(got, want)):
        if i in exact:
            assert g.dtype == w.dtype and g.shape == w.shape and torch.equal(g, w), i
        else:
            _close(g, w, n)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert regions and all(r.eager_calls == 0 for r in regions)
    reports = [dispatch.last_report(r.fusion) for r in regions]
    return [s.scheduler for rep in reports for s in rep.segments if s.kind == "kernel"]


def _randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, device="cuda").to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(8, 512, 768), (3, 37, 101)], ids=["bench", "odd"])
def test_cat_and_its_sum_over_the_tokens_are_one_kernel(dtype, shape):
    def f(q, k, v):
        c = torch.cat([q, k, v], -1)
        return c, c.sum((0, 1))
    xs = [_randn(*shape, dtype=dtype) for _ in range(3)]
    assert _run(f, *xs, n=shape[0] * shape[1], exact=(0,)) == ["reduction"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_sum_of_a_cat_reads_the_operands(dtype):
    def f(q, k, v):
        return torch.cat([q * 2, k, v.float()], -1).sum((0, 1))
    xs = [_randn(8, 512, n, dtype=dtype) for n in (768, 256, 512)]
    assert _run(f, *xs, n=4096) == ["reduction"]


def test_gpt2_c_attn_backward_region():
    """The attention backward's q / k / v gradients viewed [B, T, C] (host views), their cat
    read by the weight gradient's matmul and summed for the bias gradient: one kernel."""
    def f(dq, dk, dv, x):
        c = torch.cat([t.reshape(8, 512, 768) for t in (dq, dk, dv)], -1)
        return x.t() @ c.view(4096, 2304), c.sum((0, 1))
    xs = [_randn(8, 512, 12, 64) for _ in range(3)] + [_randn(4096, 768)]
    with torch.no_grad():
        got = pyfuser.compile(f)(*xs)
        want = f(*xs)
    torch.testing.assert_close(got[0], want[0], rtol=1e-4, atol=1e-2)
    _close(got[1], want[1], 4096)
    regions = [r for g in compiled_graphs() for r in g.regions]
    assert [r.kernels() for r in regions] == [1]


def test_non_contiguous_operands():
    def f(a, b):
        c = torch.cat([a.transpose(0, 1), b[:, :, 1:129]], -1)
        return c, c.sum((0, 1))
    a, b = _randn(64, 8, 96), _randn(8, 64, 200)
    assert _run(f, a, b, n=512, exact=(0,)) == ["reduction"]


# slices of computed values (a slice of an input is a host view)
PADS_AND_SLICES = {
    "pad": lambda x: F.pad(x * 2, (4, 8)).sum(0),
    "pad_value": lambda x: F.pad(x.exp(), (3, 1), value=0.5).sum(0),
    "slice_kept": lambda x: (x * 2)[:, 8:1000].sum(0),
    "slice_reduced": lambda x: (x * 2)[100:3000].sum(0),
    "slice_both": lambda x: (x + 1)[1:2049, 3:].sum(0),
    "pad_of_slice": lambda x: F.pad((x * 2)[:, 1:1001], (2, 0), value=-1.0).sum(0),
    "pad_reduced": lambda x: F.pad(x * 2, (0, 0, 1, 2)).sum(0),
    "pad_both": lambda x: F.pad(x.exp(), (2, 1, 3, 0), value=0.25).sum(0),
    "row_sums_of_pad": lambda x: F.pad(x * 2, (3, 1), value=0.5).sum(-1),
    "row_sums_of_slice": lambda x: (x + 1)[:, 1:1000].sum(-1),
}


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
@pytest.mark.parametrize("case", list(PADS_AND_SLICES))
def test_pads_and_slices_before_sums(case, dtype):
    x = _randn(4096, 1024, dtype=dtype)
    assert _run(PADS_AND_SLICES[case], x, n=4099) == ["reduction"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_cat_along_the_reduced_tokens(dtype):
    def f(a, b):
        c = torch.cat([a, b], 1)
        return c, c.sum((0, 1))
    a, b = _randn(8, 200, 768, dtype=dtype), _randn(8, 312, 768, dtype=dtype)
    assert _run(f, a, b, n=4096, exact=(0,)) == ["reduction"]


def test_row_sums_of_a_cat_along_the_row():
    def f(a, b):
        return torch.cat([a * 2, b], -1).sum(-1)
    assert _run(f, _randn(4096, 1024), _randn(4096, 2048), n=3072) == ["reduction"]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "bf16"])
def test_normalizations_of_a_cat_along_the_rows(dtype):
    def f(a, b):
        c = torch.cat([a, b], 0).float()
        return torch.softmax(c, -1), torch.layer_norm(c, (3072,)), c.sum(-1)
    a, b = _randn(1000, 3072, dtype=dtype), _randn(3096, 3072, dtype=dtype)
    kernels = _run(f, a, b, n=3072)
    assert len(kernels) == 1


def test_column_normalization_of_a_cat():
    def f(a, b):
        c = torch.cat([a, b], -1)
        return c - c.mean(0)
    a, b = _randn(512, 16, 96), _randn(512, 16, 160)
    assert len(_run(f, a, b, n=512)) == 1


@pytest.mark.parametrize("knob", ["PYFUSER_RED_CLUSTER=2", "PYFUSER_RED_STEPS=0",
                                  "PYFUSER_RED_SPLITS=4", "PYFUSER_RED_STAGE=1"])
def test_kernel_variants(knob, monkeypatch):
    name, value = knob.split("=")
    monkeypatch.setenv(name, value)

    def f(a, b):
        c = torch.cat([a, b * 2], -1)
        return torch.softmax(c, -1), torch.cat([a, b], 0).sum(0)
    a, b = _randn(256, 8192), _randn(256, 8192)
    got = pyfuser.compile(f)(a, b)
    want = f(a, b)
    torch.testing.assert_close(got[0], want[0])
    _close(got[1], want[1], 512)
