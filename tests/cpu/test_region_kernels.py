"""Regions of HF models that compiled to more than one kernel, in small functions through
pyfuser.compile: each test checks eager's values and the region's kernel count (and which
schedulers run them). The kernels run on the CPU interpreter, whose executor first compiles each
kernel's CUDA source with NVRTC (sm_90 on a machine without a GPU).

- Llama's rotary embedding of q and of k (different head counts) reads one cos and one sin: one
  horizontal kernel, whose components may read a common input (schedule/horizontal.py);
- GPT-2's packed-sequence mask (a cat and slices of the positions) beside its causal mask, of
  other shapes: one horizontal kernel (slices, pads, cats and iotas are taken in components);
- Llama's positions (an iota) read by both masks, the rotary cos / sin and a normalization:
  computed in each kernel reading them (segment/load_free.py), no kernel of their own;
- a cross-entropy's count of the targets not ignored joins the final sum over the rows once the
  row kernel recomputes the `ne` they share (segment/merges.py merge_again);
- two pure reductions of one domain that read different tensors join (segment/merges.py
  merge_siblings);
- Llama's grouped-query key gradient (a sum of 2 to 4 query heads) and its rotary backward: adds
  of selects (fx/rewrite_reduce.unroll_small_sums) in one pointwise kernel;
- GPT-2's position embedding read at `arange(seq) + past`: a lookup's index may be an iota plus
  or minus a scalar (pointwise_graph.index_source), no positions kernel.
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

@pytest.mark.parametrize("scaled", [True, False], ids=["scaled", "unscaled"])
def test_llamas_positions_are_computed_in_each_kernel_reading_them(scaled):
    """Llama's first region: positions (an iota), the packed-sequence mask and the causal mask
    of them, the rotary cos / sin of them, and the rotation of q and k. The positions had been
    one kernel, their broadcasts host views that no kernel took, and each mask and the cos / sin
    a kernel of its own: 6 kernels. Each kernel now computes the positions itself (load-free
    values, segment/load_free.py), so the masks and cos / sin are independent: one horizontal
    kernel, then q and k in another. Unscaled, cos and sin are a group of their own (each
    joined the cat they read before the other could: outputs of two shapes) until the siblings
    merge; the cat's group then joins them (segment/merges.py merge_again)."""
    def f(inv_freq, q, k):
        b, s = q.shape[0], q.shape[2]
        ids = (torch.arange(s) + 0)[None, :].expand(b, -1)
        shifted = torch.cat([ids[:, :1] - 1, ids], -1)
        starts = (shifted[:, 1:] - shifted[:, :-1]) != 1
        causal = ids[:, None, None, :] <= ids[:, None, :, None]
        freqs = ids[:1, :, None].float() * inv_freq
        emb = torch.cat([freqs, freqs], -1)
        cos, sin = emb.cos(), emb.sin()
        if scaled:                                    # HF Llama multiplies by its scaling
            cos, sin = cos * 1.0, sin * 1.0
        cos, sin = cos[:, None], sin[:, None]
        return starts, causal, q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin
    inv_freq = 1.0 / (10000 ** (torch.arange(0, 16, 2).float() / 16))
    q, k = torch.randn(2, 4, 8, 16), torch.randn(2, 2, 8, 16)
    (region,) = _compiled(f, inv_freq, q, k)
    assert _schedulers(region) == ["horizontal", "horizontal"]


def test_a_normalization_reads_positions_it_computes():
    """Positions read by a causal mask (a kernel of its own: another shape) and, through a
    broadcast, by a layer norm's input: the layer norm's kernel computes them, and the positions'
    kernel and their host views are gone (3 kernels before)."""
    def f(x, w):
        b, s, h = x.shape
        pos = (torch.arange(s) + 0)[None, :].expand(b, -1)
        causal = pos[:, None, None, :] <= pos[:, None, :, None]
        return causal, torch.nn.functional.layer_norm(x + pos[..., None].float() * w, (h,))
    (region,) = _compiled(f, torch.randn(2, 8, 32), torch.randn(32))
    assert _schedulers(region) == ["pointwise", "inner_persistent"]

def test_cross_entropys_mean_over_the_rows_and_its_count_are_one_kernel():
    """HF's loss: the log-softmax and the target's pick in a row kernel, then the sum of the
    rows' losses over the count of targets that are not ignored. The count's `ne` (also read by
    the row kernel, which recomputes it) had put the count's kernel on a path through the row
    kernel to the final sum: three kernels. The count now joins the final sum (two reductions of
    the same axis)."""
    import torch.nn.functional as F

    def f(x, t):
        return F.cross_entropy(x.view(-1, x.shape[-1]).float(), t.view(-1))
    x = torch.randn(2, 8, 64, requires_grad=True)
    t = torch.randint(0, 64, (2, 8))
    t[0, 3] = -100
    loss = pyfuser.compile(f)(x, t)
    torch.testing.assert_close(loss, f(x, t), rtol=1e-6, atol=1e-6)
    # the forward (the graph cache compiles the backward with it: a second graph)
    (graph,) = [g for g in compiled_graphs() if g.kind == "forward"]
    (region,) = graph.regions
    assert _schedulers(region) == ["inner_persistent", "reduction"]


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("dt", [torch.float32, torch.bfloat16])
def test_an_inference_cross_entropy_reads_its_logits_once(dt, reduction):
    """Without grad, torch.compile's cross-entropy is nll_loss of a log_softmax: the picked
    log-probability, (x - max) - log(sum) at the target, is computed for that one element once
    the row's online (max, sum) exists, so the row kernel is the reduction scheduler's one
    streamed pass (it was an inner-persistent kernel of three passes over a row held on chip,
    the third summing the picked log-probabilities)."""
    import torch.nn.functional as F

    def f(x, t):
        return F.cross_entropy(x, t, reduction=reduction)
    x = (2 * torch.randn(12, 1000)).to(dt)
    t = torch.randint(0, 1000, (12,))
    t[4] = -100
    with torch.no_grad():
        got = pyfuser.compile(f)(x, t)
    want = f(x, t)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = 1e-5 if dt == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)
    (graph,) = compiled_graphs()
    (region,) = graph.regions
    assert _schedulers(region) == ["reduction"] * (1 if reduction == "none" else 2)


def test_independent_sums_over_the_same_axes_are_one_kernel():
    """ViT's last layer norm's backward: the CLS token's gradient padded to the sequence
    (select_backward) times x_hat, and the padded gradient itself, each summed over the rows
    (dweight and dbias). A pointwise kernel wrote both; the two sums read different tensors,
    so they were no siblings: two reduction kernels. Pure reductions of one domain then joined
    (3 kernels -> 2), and the reduction kernel now takes the pad (schedule/reduction_resize.py;
    a pad along the reduced rows): one kernel."""
    def f(g, x):
        p = torch.nn.functional.pad(g[:, None], (0, 0, 0, 16))
        a = p * x
        return a.sum([0, 1]), p.sum([0, 1]), a + 1
    (region,) = _compiled(f, torch.randn(2, 32), torch.randn(2, 17, 32))
    assert _schedulers(region) == ["reduction"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("rep", [2, 4])
def test_grouped_query_key_gradient_and_its_rotary_backward_are_one_kernel(dtype, rep):
    """Llama's key gradient under grouped-query attention: the sum over the query heads that
    share a key head (the backward of repeat_kv's expand, AOTAutograd's keepdim sum of a
    matmul's result), then the rotary embedding's backward (slices, a cat). A reduction kernel
    takes no slice: a reduction kernel wrote the sum and a pointwise kernel read it back. The
    sum of `rep` elements is now adds of selects (fx/rewrite_reduce.unroll_small_sums): one
    pointwise kernel."""
    def f(g5, sin, cos):
        g = g5.sum(2, keepdim=True).squeeze(2)
        h = g.shape[-1] // 2
        m = g * sin
        return torch.cat([m[..., h:], -m[..., :h]], -1) + g * cos
    torch.manual_seed(0)
    g5 = torch.randn(2, 2, rep, 8, 16).to(dtype)
    sin, cos = torch.randn(8, 16).to(dtype), torch.randn(8, 16).to(dtype)
    with torch.no_grad():
        got = pyfuser.compile(f)(g5, sin, cos)
    want = f(g5, sin, cos)                     # bfloat16: eager rounds after each op too
    assert got.dtype == want.dtype == dtype
    torch.testing.assert_close(got, want, **({} if dtype == torch.float32 else
                                            {"rtol": 1.6e-2, "atol": 1e-5}))
    (graph,) = compiled_graphs()
    (region,) = graph.regions
    assert "aten.sum.dim_IntList" not in region.ops
    assert _schedulers(region) == ["pointwise"]


def test_position_embedding_at_shifted_positions_is_read_in_the_layer_norms_kernel():
    """GPT-2's embeddings: token and position lookups, added, then the first layer norm; the
    positions are `arange(seq) + past`. A lookup's index had to be an input or an iota, so the
    positions were a kernel of their own (an iota plus a scalar) and, also read by the causal
    mask, a host view between kernels: 3 kernels. The index may now be an iota plus or minus a
    scalar, computed from the element's index where the table is read: the mask's kernel and
    the layer norm's (2 kernels)."""
    def f(ids, wte, wpe, w, b):
        pos = torch.arange(ids.shape[1]) + 3
        emb = torch.nn.functional.embedding
        h = emb(ids, wte) + emb(pos, wpe)[None]
        causal = pos[None, None, :] <= pos[None, :, None]
        return torch.nn.functional.layer_norm(h, (h.shape[-1],), w, b), causal
    args = (torch.randint(0, 50, (2, 8)), torch.randn(50, 32), torch.randn(16, 32),
            torch.randn(32), torch.randn(32))
    (region,) = _compiled(f, *args)
    assert _schedulers(region) == ["pointwise", "inner_persistent"]


@pytest.mark.parametrize("shift", ["add", "sub"])
def test_lookup_at_an_iota_plus_a_scalar_in_a_pointwise_kernel(shift):
    def f(x, wpe):
        pos = torch.arange(x.shape[0]) + 5 if shift == "add" else torch.arange(4, 4 + x.shape[0]) - 2
        return x * 2 + torch.nn.functional.embedding(pos, wpe)
    (region,) = _compiled(f, torch.randn(8, 32), torch.randn(16, 32))
    assert _schedulers(region) == ["pointwise"]
