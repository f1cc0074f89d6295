"""The checking half of the torch.compile backend's fuzzer (fx_fuzz.py generates the programs).

`check(program)` compiles the program with `torch.compile(fn, backend=pyfuser, dynamic=False)`
and compares it with eager: outputs' dtype and shape, strides of an output eager returns as a
view of an input, requires_grad, the inputs after the call, values (integers and bools exact,
floats within the tolerance of the least precise float dtype in the program, gradients 10x
looser, NaNs equal; a program with gelu whose outputs differ is judged again against eager with
gelu computed by the op table's formula, since CPU eager's gelu(+inf) is NaN or inf depending
on its code path); eager's backward raising means pyfuser's must raise. A float output or
gradient over its tolerance is judged again against a float64 rerun (`Float64Judge`: per
element, pyfuser's distance from float64 at most twice the larger of eager's own distance and
the spread that rounding every op's result as the program's least precise float dtype would
gives the float64 run). A program Dynamo itself rejects (`torch._dynamo.exc.Unsupported`, or
any error the `aot_eager` backend raises too) is skipped, not failed. `run_many(seeds)` checks
a range of seeds.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from fx_fuzz import F32, FLOATS, TOLERANCE, Program, generate


@dataclass
class Failure:
    program: Program
    what: str

    def __str__(self):
        return f"{self.what}\n{self.program.describe()}"


def _is_dynamo_rejection(e: BaseException) -> bool:
    import torch._dynamo.exc as exc
    return isinstance(e, exc.Unsupported) and not isinstance(e, exc.BackendCompilerFailed)


def _tolerance(want, loosest=F32, grad=False):
    rtol, atol = max(TOLERANCE[want.dtype], TOLERANCE[loosest])
    return (rtol * 10, atol * 10) if grad else (rtol, atol)


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
    rtol, atol = _tolerance(want, loosest, grad)
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
    return any(ptr == x.untyped_storage().data_ptr() for x in inputs
               if isinstance(x, torch.Tensor) and x.numel())


def _float_sum(outs):
    parts = [o.float().sum() for o in outs if o.requires_grad and o.dtype.is_floating_point]
    return sum(parts) if parts else None


def _record(p: Program) -> None:
    """What the backend made of `p`: nodes fused, calls that fell back to eager and why, why
    nodes stayed unfused (the fuzzer's coverage, summed by bench/fuzz_fx.py)."""
    from pyfuser.frontend.fx import compiled_graphs
    for g in compiled_graphs():
        rep = g.report()
        p.stats["fused_nodes"] = p.stats.get("fused_nodes", 0) + rep["fused_nodes"]
        p.stats["eager_calls"] = p.stats.get("eager_calls", 0) + sum(
            r.eager_calls for r in g.regions)
        for reason, k in rep["unfused"].items():
            p.stats.setdefault("unfused", {})
            p.stats["unfused"][reason] = p.stats["unfused"].get(reason, 0) + k
        for r in g.regions:             # why a region ran eagerly for some call
            for reason in r._logged:
                p.stats.setdefault("eager_reasons", {})
                p.stats["eager_reasons"][reason] = p.stats["eager_reasons"].get(reason, 0) + 1


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
            if _raises_without_pyfuser(fn, p):
                p.stats["dynamo_skipped"] = 1
                return None
            return Failure(p, f"pyfuser raised {type(e).__name__}: {str(e)[:400]}")
        _record(p)
    torch._dynamo.reset()
    return judge_call(p, got, want, eager_error, eager_in, fused_in)


def _raises_without_pyfuser(fn, p: Program) -> bool:
    """Whether the program raises under torch.compile's `aot_eager` backend too (Dynamo and
    AOTAutograd, no pyfuser): a fake-tensor run of a node can refuse what eager runs (FX seed
    310343 with more ops: `torch.lerp` of a float16 tensor and a float32 0-dim one), Dynamo's
    failure, not pyfuser's (fx_check_dynamic's `_dynamos_own` for dynamic programs)."""
    torch._dynamo.reset()
    try:
        torch.compile(fn, backend="aot_eager", dynamic=False)(*p.make_inputs())
    except Exception:  # noqa: BLE001
        return True
    finally:
        torch._dynamo.reset()
    return False


def judge_call(p: Program, got, want, eager_error, eager_in, fused_in) -> Optional[Failure]:
    """One call's verdict: pyfuser's outputs `got` against eager's `want` (or eager's error),
    the inputs after the call, and in grad mode the backward of the float outputs' sum and the
    inputs' gradients (fx_fuzz_dynamic's checker judges each of its calls with it). Inputs that
    are not tensors (Python floats) are passed over."""
    if eager_error is not None:
        return Failure(p, f"eager raised {type(eager_error).__name__}: {eager_error} "
                          f"but pyfuser returned")
    if len(got) != len(want):
        return Failure(p, f"{len(got)} outputs, eager {len(want)}")
    judged = None
    judge = Float64Judge(p) if Float64Judge.applies(p) else None
    for i, (g, w) in enumerate(zip(got, want)):
        bad = _compare(f"output {i}", g, w, p.loosest)
        if bad and "F.gelu(" in p.source:
            if judged is None:
                judged = _eager_with_gelu_formula(p)
            if judged is not None and _compare(f"output {i}", g, judged[i], p.loosest) is None:
                bad = None
        if bad and judge is not None:
            bad = judge.rejudge(bad, i, g, w)
        if bad:
            return Failure(p, bad)
        if _views_input(w, eager_in) and g.stride() != w.stride():
            return Failure(p, f"output {i}: a view of an input with strides {g.stride()}, "
                              f"eager {w.stride()}")
        if g.requires_grad != w.requires_grad:
            return Failure(p, f"output {i}: requires_grad {g.requires_grad}, eager "
                              f"{w.requires_grad}")
    for i, (a, b) in enumerate(zip(fused_in, eager_in)):
        if not isinstance(b, torch.Tensor):
            continue
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
                if not isinstance(b, torch.Tensor):
                    continue
                # a gradient is a sum of products: cancellation (the gradient of a layer
                # norm's sum is ~0) leaves a few float32 ulps of the terms (seed 1054)
                bad = _compare(f"grad of x{i}", a.grad, b.grad, p.loosest, grad=True)
                if bad and judge is not None:
                    bad = judge.rejudge(bad, len(want) + i, a.grad, b.grad, grad=True)
                if bad:
                    return Failure(p, bad)
    return None


def _eager_with_gelu_formula(p: Program):
    """Eager's outputs with `F.gelu` as the op table's formula (fx_fuzz_base._FormulaGelu): the judge
    of a mismatch in a program with gelu, where CPU eager's own gelu disagrees with itself on
    +inf (NaN on its vectorized path, inf otherwise; seeds 730167, 740104). None if it raises."""
    with torch.set_grad_enabled(p.grad), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            return p.function(gelu_formula=True)(*p.make_inputs())
        except Exception:  # noqa: BLE001
            return None


# ---- the float64 judge -----------------------------------------------------------------------
# A float32 result over its tolerance from eager's need not be wrong: where the computation is
# ill-conditioned, one rounding of an intermediate moves the output past any fixed tolerance, and
# which rounding an implementation makes is not specified (seed 800046: `sin` of a variance near
# 5e4, where one float32 ulp of the variance, 0.004, moves the sine by 0.002; seed 800210: a layer
# norm's gradient that is 0 in exact arithmetic, where the float32 rounding of the forward's mean
# leaves 0.002 in the backward formula of CUDA eager, PyTorch's decomposition and pyfuser, and
# 1e-8 in CPU eager's, whose terms happen to share that rounding). The judge measures both
# distances from the truth: a float64 rerun of the program, and the spread of that rerun when
# every op's result is perturbed by a float32 (or half, bfloat16) rounding (Monte Carlo
# arithmetic).

MCA_SAMPLES = 8               # perturbed float64 runs
JUDGE_FACTOR = 2.0            # pyfuser may be this many rounding distances from float64

# ops whose result is one of their inputs' elements or a constant: every float dtype computes
# them exactly, so the perturbed runs leave them as they are
_EXACT_OPS = frozenset((
    "cat", "stack", "clone", "copy", "copy_", "_to_copy", "index_select", "embedding",
    "constant_pad_nd", "where", "clamp", "clamp_min", "clamp_max", "maximum", "minimum", "abs",
    "neg", "relu", "floor", "amax", "amin", "max", "min", "fill", "full", "full_like",
    "zeros", "zeros_like", "ones", "ones_like", "scalar_tensor", "lift_fresh_copy",
    "select_backward", "slice_backward", "threshold_backward", "new_zeros", "new_empty",
    "empty", "empty_like", "empty_strided", "new_empty_strided"))


class _Rounding(TorchDispatchMode):
    """Every op's fresh float64 result (not a view, not an in-place op's, not an exact op's)
    multiplied by 1 + eps * u, u uniform in [-1, 1]: the rounding a computation in a dtype of
    relative spacing eps (torch.finfo(dtype).eps: one ulp) adds at each step, in a float64 run,
    forward and backward alike."""

    def __init__(self, g: torch.Generator, eps: float):
        super().__init__()
        self.g, self.eps = g, eps

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func.overloadpacket.__name__ in _EXACT_OPS:
            return out
        shared = {a.untyped_storage().data_ptr() for a in tree_leaves((args, kwargs))
                  if isinstance(a, torch.Tensor) and a.numel()}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64 and t.numel() and \
                    t.untyped_storage().data_ptr() not in shared:
                u = torch.rand(t.shape, generator=self.g, dtype=torch.float64)
                t.mul_(1 + self.eps * (2 * u - 1))
        return out


class Float64Judge:
    """judge.accepts(k, got, want): result k (the outputs, then the inputs' gradients) of pyfuser,
    `got`, is as close to the truth as rounding allows, where eager's `want` is. The truth is the
    program run eagerly in float64 (its float inputs in float64, float64 the default dtype, its
    casts and `dtype=` to a float dtype to float64); the rounding distance of an element is the
    larger of eager's distance from the truth and the spread of MCA_SAMPLES float64 runs with
    every op's result rounded as the program's least precise float dtype would (`_Rounding`:
    float32, or half / bfloat16 where the program holds such a value, as the first check's
    tolerance is that dtype's), which measures the computation's conditioning (an element that
    one float32 rounding moves far, `sin` of 5e4, gets that far; seed 830068: a bfloat16 layer
    norm of `log_softmax(x) - x`, a row constant in exact arithmetic that rounding makes uneven
    by 0.03, may be anything). An element passes within the first check's tolerance of eager's
    or within JUDGE_FACTOR rounding distances plus that tolerance (relative to the truth) of the
    truth; NaNs must be where eager's are. A result moved by more than rounding can move it (a
    wrong value) still fails. The runs happen on the first mismatch only, so passing programs
    cost nothing."""

    def __init__(self, p: Program):
        self.p = p
        self._runs = None

    @staticmethod
    def applies(p: Program) -> bool:
        return p.loosest in FLOATS

    def _run(self, rounding: Optional[TorchDispatchMode]):
        p = self.p
        ins = [x.detach().double().requires_grad_(x.requires_grad)
               if isinstance(x, torch.Tensor) and x.is_floating_point() else x
               for x in p.make_inputs()]
        old = torch.get_default_dtype()
        torch.set_default_dtype(torch.float64)
        try:
            with torch.set_grad_enabled(p.grad), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                if rounding is not None:
                    with rounding:
                        return self._forward_backward(ins)
                return self._forward_backward(ins)
        finally:
            torch.set_default_dtype(old)

    def _forward_backward(self, ins):
        outs = list(self.p.function(float64=True)(*ins))
        grads = []
        if self.p.grad:
            parts = [o.sum() for o in outs if o.requires_grad and o.dtype.is_floating_point]
            if parts:                               # _float_sum's loss, in float64
                sum(parts).backward()
            grads = [x.grad if isinstance(x, torch.Tensor) else None for x in ins]
        return [o.detach() if isinstance(o, torch.Tensor) else None for o in outs + grads]

    def _results(self):
        if self._runs is None:
            try:
                truth = self._run(None)
                g = torch.Generator().manual_seed(self.p.seed)
                spread = [None] * len(truth)
                for _ in range(MCA_SAMPLES):
                    rounding = _Rounding(g, torch.finfo(self.p.loosest).eps)
                    for k, (s, t) in enumerate(zip(self._run(rounding), truth)):
                        if s is None or t is None or s.shape != t.shape or \
                                not t.dtype.is_floating_point:
                            continue
                        d = (s - t).abs().nan_to_num(0.0, 0.0, 0.0)
                        spread[k] = d if spread[k] is None else torch.maximum(spread[k], d)
                self._runs = truth, spread
            except Exception:  # noqa: BLE001  (no float64 rerun: the mismatch stands)
                self._runs = [], []
        return self._runs

    def rejudge(self, bad: str, k: int, got, want, grad: bool = False) -> Optional[str]:
        """None when `accepts`, else the first check's message `bad` (marked as judged, for a
        float result)."""
        if got is None or not got.dtype.is_floating_point:
            return bad
        return None if self.accepts(k, got, want, grad) else \
            f"{bad} (float64 judge: farther from a float64 run than float32 rounding explains)"

    def accepts(self, k: int, got, want, grad: bool = False) -> bool:
        truth, spread = self._results()
        if k >= len(truth) or truth[k] is None or spread[k] is None or got is None or \
                want is None or truth[k].shape != got.shape or not got.dtype.is_floating_point:
            return False
        t, noise = truth[k], spread[k]
        g, w = got.detach().double(), want.detach().double()
        if not torch.equal(g.isnan(), w.isnan()):
            return False
        rtol, atol = _tolerance(want, self.p.loosest, grad)
        near_eager = torch.isclose(g, w, rtol=rtol, atol=atol, equal_nan=True)
        eager_err = (w - t).abs().nan_to_num(0.0, 0.0, 0.0)
        bound = JUDGE_FACTOR * torch.maximum(eager_err, noise) + atol + rtol * t.abs()
        near_truth = t.isfinite() & g.isfinite() & ((g - t).abs() <= bound)
        return bool((near_eager | near_truth).all())


def run_many(seeds, generate=generate, check=check):
    """Yield (program, failure) for each failing seed (programs of `generate`, judged by
    `check`: the dynamic-shape fuzzer passes its own)."""
    for s in seeds:
        p = generate(s)
        f = check(p)
        if f is not None:
            yield p, f
