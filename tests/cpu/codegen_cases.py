"""Helpers of the codegen tests: build a fusion, plan it, run the CPU interpreter, compare with
eager, and compile every generated kernel with NVRTC for sm_90 (each distinct source once)."""
from __future__ import annotations

import hashlib

import torch

import pyfuser.ir.builder as B  # noqa: F401  (re-exported for the tests)
from pyfuser.codegen import api
from pyfuser.codegen.prelude import PRELUDE
from pyfuser.ir import DataType, Fusion  # noqa: F401
from pyfuser.ir.shapes import bind

ARCH = "sm_90"
_compiled: set = set()


def compile_source(source: str, name: str) -> None:
    key = hashlib.sha256(source.encode()).hexdigest()
    if key in _compiled:
        return
    from pyfuser.runtime.nvrtc import compile_cuda
    compile_cuda(source, name, ARCH)
    _compiled.add(key)


def compile_many(plans) -> None:
    """Compile many plans' kernels as one NVRTC module (one prelude), each in its own namespace."""
    parts, first = [PRELUDE], None
    seen = set()
    for i, p in enumerate(plans):
        if p.body in seen:
            continue
        seen.add(p.body)
        name = f"{p.kernel.name}_{i}"
        first = first or f"k{i}::{name}"
        parts.append(f"namespace k{i} {{\ntypedef {p.index_type} nidx_t;\n"
                     f"{p.body.replace(p.kernel.name + '(', name + '(')}\n}}\n")
    if first:
        compile_source("\n".join(parts), first)


def poison(t: torch.Tensor) -> None:
    """NaN (floating) or 0x7f bytes (others) in every element of a dense output."""
    if t.numel() == 0:
        return
    flat = torch.as_strided(t, (t.numel(),), (1,), t.storage_offset())
    if t.dtype.is_floating_point:
        flat.fill_(float("nan"))
    else:
        flat.view(torch.uint8).fill_(0x7F)


def make_fusion(build):
    """`build()` defines inputs (via B.define_tensor / B.symbolic_scalar + add_input) and returns
    the outputs; they are added in order."""
    f = Fusion()
    with f:
        outs = build()
        for o in (outs if isinstance(outs, (list, tuple)) else [outs]):
            f.add_output(o)
    return f


def run_plan(f, inputs, plan=None):
    plan = plan or api.plan_kernel(f, inputs)
    b = bind(f, inputs)
    outs = plan.allocate_outputs(b, inputs, torch.device("cpu"))
    for o in outs:
        poison(o)
    api.interpret(plan, inputs, outs, b)
    return plan, outs


def assert_close(got: torch.Tensor, want: torch.Tensor, what: str = "") -> None:
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} != {want.dtype}"
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.dtype.is_floating_point:
        tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2, torch.float32: 1e-5, torch.float64: 1e-12}
        r = tol[want.dtype]
        torch.testing.assert_close(got.double(), want.double(), rtol=r, atol=r, equal_nan=True,
                                   msg=lambda m: f"{what}: {m}")
    else:
        assert torch.equal(got, want), f"{what}: values differ\n{got}\n{want}"


def check(build, inputs, ref, compile_now=True, strides=True):
    """Plan + interpret + compare with `ref(*inputs)` (a tensor or list); returns the plan."""
    f = make_fusion(build)
    plan, outs = run_plan(f, inputs)
    want = ref(*inputs)
    want = want if isinstance(want, (list, tuple)) else [want]
    assert len(outs) == len(want)
    for i, (g, w) in enumerate(zip(outs, want)):
        assert_close(g, w, f"output {i} of {plan.kernel.name}")
        if strides and w.numel() > 1:
            assert g.stride() == w.stride() or _same_layout(g, w), \
                f"output {i}: strides {g.stride()} != eager {w.stride()}"
    if compile_now:
        compile_source(plan.kernel.source, plan.kernel.name)
    return plan


def _same_layout(a, b):
    # strides may differ only on size-1 axes
    return all(x == y for x, y, s in zip(a.stride(), b.stride(), a.shape) if s != 1)
