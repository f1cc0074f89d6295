"""Regions of HF models that compiled to more than one kernel, in small functions through
pyfuser.compile: each test checks eager's values and the region's kernel count (and which
schedulers run them). The kernels run on the CPU interpreter, whose executor first compiles each
kernel's CUDA source with NVRTC (sm_90 on a machine without a GPU).

- Llama's rotary embedding of q and of k (different head counts) reads one cos and one sin: one
  horizontal kernel, whose components may read a common input (schedule/horizontal.py);
- GPT-2's packed-sequence mask (a cat and slices of the positions) beside its causal mask, of
  other shapes: one horizontal kernel (slices, pads, cats and iotas are taken in components);
"""
from __future__ import annotations

import pytest
import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs
from pyfuser.runtime import dispatch

pytestmark = pytest.mark.usefixtures("fresh_compile")


def _compiled(f, *args):
    """Run f compiled (no grad) and eagerly; check the values; return the one graph's regions."""
    with torch.no_grad():
        got = pyfuser.compile(f)(*args)
        want = f(*args)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)
    (graph,) = compiled_graphs()
    return graph.regions


def _schedulers(region) -> list:
    """The schedulers of the kernels the region's last call ran (each compiled by NVRTC and run
    by the interpreter: no eager segment, no evaluator fallback)."""
    report = dispatch.last_report(region.fusion)
    assert report.eager_segments == 0, report
    kernels = [s for s in report.segments if s.kind == "kernel"]
    assert all(s.backend == "interpret" for s in kernels), report
    assert region.kernels() == len(kernels)
    return [s.scheduler for s in kernels]


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], -1)


def test_rotary_of_q_and_k_reading_one_cos_and_sin_is_one_kernel():
    """q and k have different head counts (grouped-query attention): the pointwise scheduler
    takes neither pair of outputs; both read cos and sin, which had made them one component for
    the horizontal scheduler: two kernels."""
    def f(q, k, cos, sin):
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16)
    (region,) = _compiled(f, q, k, torch.randn(8, 16), torch.randn(8, 16))
    assert _schedulers(region) == ["horizontal"]


def test_masks_of_other_shapes_with_slices_and_cats_are_one_kernel():
    """GPT-2's packed-sequence mask ([b, s]: a cat and two slices of the positions) and its
    causal mask ([b, 1, s, s]) from views of one position tensor: two kernels before."""
    def f(pos):
        shifted = torch.cat([pos[:, :1] - 1, pos], -1)
        starts = (shifted[:, 1:] - shifted[:, :-1]) != 1
        causal = pos[:, None, None, :] <= pos[:, None, :, None]
        return starts, causal & True
    pos = torch.tensor([[0, 1, 2, 0, 1, 2, 3, 0], [0, 1, 2, 3, 4, 5, 6, 7]])
    (region,) = _compiled(f, pos)
    assert _schedulers(region) == ["horizontal"]

