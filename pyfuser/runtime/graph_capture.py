"""Capturing a callable into a CUDA graph and replaying it, for the frontends' graphed calls
(`pyfuser.jit(f, cuda_graphs=True)`: frontend/torchscript/cuda_graphs.py; torch.compile's
inference graphs with `cuda_graphs=True`: frontend/fx/cuda_graphs.py).

`Backend` is the one place that touches torch.cuda.CUDAGraph: `capture(fn, device)` runs `fn`
once on a side stream (lazy work such as kernel loading and workspace allocation happens
outside the graph), then records a second run; `replay(graph)` launches what was recorded.
Tests substitute a stand-in with the same two methods that replays by running the function
again on the same buffers, which is what a graph does.

Random numbers: the recorded run draws graph-safe states (runtime/rng.py's `capturing`): its
kernels read two device words that a captured `torch.randint` refreshes on every replay, which
the graph keeps alive (`graph.pyfuser_rng`).

`invalidate(storage, message)` makes every later access of a storage's tensors raise `message`
(torch's `_set_storage_data_ptr_access_error_msg`, CUDA builds only: `can_invalidate`): a
graphed call that hands out the graph's own output memory (frontend/fx/cuda_graph_outputs.py)
invalidates what a caller still holds before a replay writes that memory again.

Invariants: a captured graph reads its inputs from, and writes its outputs to, the addresses of
the capturing call, so its callers copy new inputs into those buffers and hand out either copies
of the outputs (`fresh_copies`) or tensors on the graph's memory that are invalidated before a
later replay overwrites it, never tensors that a replay changes silently.
"""
from __future__ import annotations

import torch

from . import rng


class Backend:
    """Capture and replay through torch.cuda.CUDAGraph."""

    def capture(self, fn, device):
        """Warm up once on a side stream, then capture `fn()`; (graph, its result)."""
        with torch.cuda.device(device):
            cur = torch.cuda.current_stream(device)
            side = torch.cuda.Stream(device)
            side.wait_stream(cur)
            try:
                with torch.cuda.stream(side):
                    fn()
            finally:                         # a warm-up that raised may have queued writes: a
                cur.wait_stream(side)        # caller's restore or plain run goes after them
            graph = torch.cuda.CUDAGraph()
            with rng.capturing(device) as cap, torch.cuda.graph(graph):
                out = fn()
            graph.pyfuser_rng = cap          # the device words its random kernels read
        return graph, out

    def replay(self, graph) -> None:
        graph.replay()

    can_invalidate = hasattr(torch._C, "_set_storage_data_ptr_access_error_msg")

    def invalidate(self, storage, message: str) -> None:
        """Every later access of the data of a tensor on `storage` (any view of it) raises
        `message`; the storage lets its memory go (a storage that does not own it)."""
        torch._C._set_storage_data_ptr_access_error_msg(storage._cdata, message)


def tensors_of(x, out: list) -> list:
    """The tensors of a result (nested lists / tuples), appended to `out`."""
    if isinstance(x, torch.Tensor):
        out.append(x)
    elif isinstance(x, (list, tuple)):
        for e in x:
            tensors_of(e, out)
    return out


def fresh_copies(x, _memo=None):
    """A result with every tensor in the caller's own memory (not the graph's): each storage the
    result's tensors view is copied once and every tensor rebuilt on the copy at its offset and
    strides, so views of one intermediate stay views of one copy and strides, gaps and expanded
    axes are the captured ones (what a run without the graph returns)."""
    memo = {} if _memo is None else _memo
    if isinstance(x, torch.Tensor):
        st = x.untyped_storage()
        new = memo.get(st.data_ptr())
        if new is None:
            new = memo[st.data_ptr()] = st.clone()
        return torch.empty(0, dtype=x.dtype, device=x.device).set_(
            new, x.storage_offset(), x.size(), x.stride())
    if isinstance(x, tuple):
        return tuple(fresh_copies(e, memo) for e in x)
    if isinstance(x, list):
        return [fresh_copies(e, memo) for e in x]
    return x


def shares_storage(outs, others) -> bool:
    """Whether a tensor of `outs` shares storage with one of `others` (a copy would break the
    aliasing the caller may rely on)."""
    seen = {t.untyped_storage().data_ptr() for t in others}
    return any(t.untyped_storage().data_ptr() in seen and t.numel() for t in outs)


def overlaps_itself(t) -> bool:
    """Whether two elements of `t` share memory for certain (an expanded tensor: a zero stride on
    an axis longer than 1), which `copy_` refuses to write into a buffer of its strides. A layout
    the check cannot decide (a slice with gaps, a step: "too hard", not "yes") copies fine: its
    elements that share memory share it in the caller's tensor as well, and hold one value."""
    return torch._debug_has_internal_overlap(t) == 1      # MemOverlap::Yes

