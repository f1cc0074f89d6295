"""The checking half of the torch.compile backend's fuzzer (fx_fuzz.py generates the programs).

`check(program)` compiles the program with `torch.compile(fn, backend=pyfuser, dynamic=False)`
and compares it with eager: outputs' dtype and shape, strides of an output eager returns as a
view of an input, requires_grad, the inputs after the call, values (integers and bools exact,
floats within the tolerance of the least precise float dtype in the program, gradients 10x
looser, NaNs equal; a program with gelu whose outputs differ is judged again against eager with
gelu computed by the op table's formula, since CPU eager's gelu(+inf) is NaN or inf depending
on its code path); eager's backward raising means pyfuser's must raise. A program Dynamo
itself rejects (`torch._dynamo.exc.Unsupported`) is skipped, not failed. `run_many(seeds)`
checks a range of seeds.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch

from fx_fuzz import F32, TOLERANCE, Program, generate


@dataclass
class Failure:
    program: Program
    what: str

    def __str__(self):
        return f"{self.what}\n{self.program.describe()}"


def _is_dynamo_rejection(e: BaseException) -> bool:
    import torch._dynamo.exc as exc
    return isinstance(e, exc.Unsupported) and not isinstance(e, exc.BackendCompilerFailed)


def _compare(tag: str, got, want, loosest=F32, grad=False) -> Optional[str]:
    if want is None or got is None:
        return None if want is None and got is None else f"{tag}: {got!r} vs eager {want!r}"
    if got.dtype != want.dtype:
        return f"{tag}: dtype {got.dtype}, eager {want.dtype}"
    if tuple(got.shape) != tuple(want.shape):
        return f"{tag}: shape {tuple(got.shape)}, eager {tuple(want.shape)}"
    if not want.dtype.is_floating_point:
        if not torch.equal(got, want):
            bad = (got != want).nonzero()[:3].tolist()
            return f"{tag}: values differ at {bad}: {got.flatten()[:8].tolist()} vs " \
                   f"{want.flatten()[:8].tolist()}"
        return None
    rtol, atol = max(TOLERANCE[want.dtype], TOLERANCE[loosest])
    if grad:
        rtol, atol = rtol * 10, atol * 10
    try:
        torch.testing.assert_close(got.detach(), want.detach(), rtol=rtol, atol=atol,
                                   equal_nan=True)
    except AssertionError as e:
        return f"{tag}: {str(e).splitlines()[0]} / " + " ".join(str(e).split("\n")[1:4])
    return None


def _views_input(t: torch.Tensor, inputs) -> bool:
    """`t` shares an input's storage. An empty tensor views nothing: empty storages all have
    data_ptr 0 (seed 710315: an empty float32 result "matched" an empty float16 input), and
    the strides of an empty tensor hold no layout to compare."""
    if t.numel() == 0:
        return False
    ptr = t.untyped_storage().data_ptr()
    return any(ptr == x.untyped_storage().data_ptr() for x in inputs if x.numel())


def _float_sum(outs):
    parts = [o.float().sum() for o in outs if o.requires_grad and o.dtype.is_floating_point]
    return sum(parts) if parts else None


def _record(p: Program) -> None:
    """What the backend made of `p`: nodes fused, calls that fell back to eager, why nodes
    stayed unfused (the fuzzer's coverage, summed by bench/fuzz_fx.py)."""
    from pyfuser.frontend.fx import compiled_graphs
    for g in compiled_graphs():
        rep = g.report()
        p.stats["fused_nodes"] = p.stats.get("fused_nodes", 0) + rep["fused_nodes"]
        p.stats["eager_calls"] = p.stats.get("eager_calls", 0) + sum(
            r.eager_calls for r in g.regions)
        for reason, k in rep["unfused"].items():
            p.stats.setdefault("unfused", {})
            p.stats["unfused"][reason] = p.stats["unfused"].get(reason, 0) + k


def check(p: Program, backend=None) -> Optional[Failure]:
    """Compile `p` with the pyfuser backend and compare it with eager; None when they agree
    (or Dynamo rejects the program)."""
    import pyfuser
    from pyfuser.frontend.fx import reset_compiled
    backend = backend or pyfuser.backend
    fn = p.function()
    eager_in, fused_in = p.make_inputs(), p.make_inputs()
    torch._dynamo.reset()
    reset_compiled()
    with torch.set_grad_enabled(p.grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            want = fn(*eager_in)
            eager_error = None
        except Exception as e:  # noqa: BLE001
            eager_error = e
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        try:
            got = compiled(*fused_in)
        except Exception as e:  # noqa: BLE001
            if eager_error is not None or _is_dynamo_rejection(e):
                return None
            return Failure(p, f"pyfuser raised {type(e).__name__}: {str(e)[:400]}")
        _record(p)
    torch._dynamo.reset()
    if eager_error is not None:
        return Failure(p, f"eager raised {type(eager_error).__name__}: {eager_error} "
                          f"but pyfuser returned")
    if len(got) != len(want):
        return Failure(p, f"{len(got)} outputs, eager {len(want)}")
    judged = None
    for i, (g, w) in enumerate(zip(got, want)):
        bad = _compare(f"output {i}", g, w, p.loosest)
        if bad and "F.gelu(" in p.source:
            if judged is None:
                judged = _eager_with_gelu_formula(p)
            if judged is not None and _compare(f"output {i}", g, judged[i], p.loosest) is None:
                bad = None
        if bad:
            return Failure(p, bad)
        if _views_input(w, eager_in) and g.stride() != w.stride():
            return Failure(p, f"output {i}: a view of an input with strides {g.stride()}, "
                              f"eager {w.stride()}")
        if g.requires_grad != w.requires_grad:
            return Failure(p, f"output {i}: requires_grad {g.requires_grad}, eager "
                              f"{w.requires_grad}")
    for i, (a, b) in enumerate(zip(fused_in, eager_in)):
        bad = _compare(f"input {i} after the call", a, b)
        if bad:
            return Failure(p, bad)
    if p.grad:
        lw, lg = _float_sum(want), _float_sum(got)
        if lw is not None and lg is not None:
            try:
                lw.backward()
            except Exception as e:  # noqa: BLE001  (pow's backward of a bool exponent: seed 10496)
                eager_error = e
            try:
                lg.backward()
            except Exception as e:  # noqa: BLE001
                if eager_error is not None:
                    return None
                return Failure(p, f"pyfuser's backward raised {type(e).__name__}: {str(e)[:400]}")
            if eager_error is not None:
                return Failure(p, f"eager's backward raised {type(eager_error).__name__}: "
                                  f"{eager_error} but pyfuser's did not")
            for i, (a, b) in enumerate(zip(fused_in, eager_in)):
                # a gradient is a sum of products: cancellation (the gradient of a layer
                # norm's sum is ~0) leaves a few float32 ulps of the terms (seed 1054)
                bad = _compare(f"grad of x{i}", a.grad, b.grad, p.loosest, grad=True)
                if bad:
                    return Failure(p, bad)
    return None


def _eager_with_gelu_formula(p: Program):
    """Eager's outputs with `F.gelu` as the op table's formula (fx_fuzz._FormulaGelu): the judge
    of a mismatch in a program with gelu, where CPU eager's own gelu disagrees with itself on
    +inf (NaN on its vectorized path, inf otherwise; seeds 730167, 740104). None if it raises."""
    with torch.set_grad_enabled(p.grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return p.function(gelu_formula=True)(*p.make_inputs())
        except Exception:  # noqa: BLE001
            return None


def run_many(seeds):
    """Yield (program, failure) for each failing seed."""
    for s in seeds:
        p = generate(s)
        f = check(p)
        if f is not None:
            yield p, f
