"""A torch.compile region's outputs in eager's layouts (frontend/fx/region.py `FusedRegion`):
an output eager lays out dense in a permuted order (a transposed weight after its autocast cast)
is checked on every call, the check remembered per (sizes, strides) found dense, and one not
dense in that order is still copied into it. Results are compared with eager."""
from __future__ import annotations

import pytest
import torch

import pyfuser
import pyfuser.frontend.fx.region as R
from pyfuser.frontend.fx import compiled_graphs

pytestmark = pytest.mark.usefixtures("fresh_compile")
bf16 = torch.bfloat16


def _casts_and_transposes(x, w1, w2):
    return x.to(bf16) @ w1.to(bf16).t(), w2.to(bf16).t() * 2


def _region_with_transposed_outputs():
    (graph,) = compiled_graphs()
    (region,) = [r for r in graph.regions if any(not rm for _, _, rm, _ in r.checks)]
    return region


def _same_layout(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.stride() == want.stride()
    torch.testing.assert_close(got, want)


def test_a_permuted_dense_output_is_checked_once_per_layout_and_stays_eagers():
    args = (torch.randn(4, 6), torch.randn(5, 6), torch.randn(3, 7))
    f = pyfuser.compile(_casts_and_transposes)
    with torch.no_grad():
        for _ in range(3):
            for g, e in zip(f(*args), _casts_and_transposes(*args)):
                _same_layout(g, e)
    region = _region_with_transposed_outputs()
    permuted = [seen for _, _, row_major, seen in region.checks if not row_major]
    assert permuted and all(len(seen) == 1 for seen in permuted)


def test_an_output_not_dense_in_eagers_order_is_copied_into_it_after_the_check_was_remembered(
        monkeypatch):
    """The remembered check passes only the (sizes, strides) it found dense: a program giving
    another layout for the same output is relaid out (counted), not trusted."""
    args = (torch.randn(4, 6), torch.randn(5, 6), torch.randn(3, 7))
    f = pyfuser.compile(_casts_and_transposes)
    with torch.no_grad():
        f(*args)
        f(*args)
    region = _region_with_transposed_outputs()
    k = next(k for k, _, row_major, _ in region.checks if not row_major)
    real_run = region.progs.run

    class Progs:   # the region's programs, but output k row-major (not eager's transposed order)
        def run(self, inputs):
            outs = list(real_run(inputs))
            outs[k] = outs[k].contiguous()
            return outs
    monkeypatch.setattr(region, "progs", Progs())
    copies = []
    real = R._relayout
    monkeypatch.setattr(R, "_relayout", lambda t, order: (copies.append(order), real(t, order))[1])
    with torch.no_grad():
        got = f(*args)
    for g, e in zip(got, _casts_and_transposes(*args)):
        _same_layout(g, e)
    assert len(copies) == 1
