"""Checks the torch.compile training tests share: the graphs compiled so far by kind, a
function's forward and backward through pyfuser against eager (and float64), and that regions
ran as NVRTC-compiled sm_90 kernels on the CPU interpreter, and that a graph's copies into
mutated inputs were written in place by its kernels.
"""
from __future__ import annotations

import os

import torch

import pyfuser
from pyfuser.frontend.fx import compiled_graphs

from train_corpus import assert_as_close_as_eager


def graphs(kind):
    """The graphs of `kind` (forward / backward / inference) compiled in this process."""
    return [g for g in compiled_graphs() if g.kind == kind]


def check_fn(f, *shapes, seed=0, loss=lambda out: out.square().sum()):
    """Forward and backward of f through pyfuser against eager (float32 and float64)."""
    gen = torch.Generator().manual_seed(seed)
    base = [torch.randn(*s, generator=gen) for s in shapes]
    ours = [b.clone().requires_grad_() for b in base]
    ref = [b.clone().requires_grad_() for b in base]
    ora = [b.double().requires_grad_() for b in base]
    out = pyfuser.compile(f)(*ours)
    want, oracle = f(*ref), f(*ora)
    assert_as_close_as_eager(out, want, oracle, "forward")
    for args, o in ((ours, out), (ref, want), (ora, oracle)):
        loss(o).backward()
    for i, (a, r, o) in enumerate(zip(ours, ref, ora)):
        assert_as_close_as_eager(a.grad, r.grad, o.grad, f"grad {i}")
    return out


def assert_ran_as_sm90_kernels(regions):
    """Every region's last call ran kernels only (no eager segment, no evaluator fallback), on
    the CPU interpreter, whose executor first compiles each kernel's CUDA source with NVRTC for
    the default arch: sm_90 on a machine without a GPU (the GPU tests run them on the GPU)."""
    from pyfuser.runtime import dispatch, nvrtc
    if not torch.cuda.is_available() and not os.environ.get("PYFUSER_ARCH"):
        assert nvrtc.default_arch() == "sm_90"
    for r in regions:
        report = dispatch.last_report(r.fusion)
        assert report is not None and report.eager_segments == 0, (r, report)
        kernels = [s for s in report.segments if s.kind == "kernel"]
        assert kernels and all(s.backend == "interpret" for s in kernels), (r, report)


def assert_input_copies_fused(g, n):
    """Graph g's n copy_ nodes of mutated inputs are in its regions (none left to FX, none in
    the rewritten graph) and the kernels wrote every one of them in place (no copy after)."""
    from pyfuser.runtime import dispatch
    assert not [k for k, why in g.unsupported.items() if "copy_" in why], g.unsupported
    assert not [n for n in g.gm.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert sum(op == "aten.copy_.default" for r in g.regions for op in r.ops) == n
    for r in g.regions:
        if "aten.copy_.default" in r.ops:
            report = dispatch.last_report(r.fusion)
            assert report.copies == 0 and report.eager_segments == 0, (r, report)
