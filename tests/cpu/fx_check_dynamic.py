"""The checking half of the dynamic-shape fuzzer (fx_fuzz_dynamic.py generates the programs).

`check(program)` compiles the program once (`dynamic=True`, or `dynamic=None` with
`torch._dynamo.mark_dynamic` on the axes that vary) and calls it at each of its CALLS sets of
sizes; each call is judged as fx_check judges a static program (`fx_check.judge_call`: dtype,
shape, strides of views of inputs, requires_grad, values with the float64 judge, inputs after
the call, the backward and gradients in grad mode). Then:

- no recompilation: Dynamo compiled no frame after the first call (a backend wrapper counts
  them) and pyfuser compiled no graph after it (forward, backward: `compiled_graphs()`);
- about three programs in ten (`replay`) are then compiled with dynamic=False and called at
  each size again (a static graph per size, sharing their regions' Fusions and kernels);
- where pyfuser raises or Dynamo recompiles, the same calls run through `backend="aot_eager"`:
  if that raises or recompiles too, the program is Dynamo's (a guard the program's own ops make,
  a ConstraintViolation of a marked axis) and skipped (counted in `stats`), not failed.

`stats` (per program, summed by bench/fuzz_fx.py --dynamic) also holds the fused nodes, why
nodes stayed unfused and the reasons regions ran eagerly for some call (`eager_reasons`): sizes
are 2 or more, so a binding that a static graph accepts should be accepted here too.
"""
from __future__ import annotations

import warnings
from typing import Optional

import torch

import fx_check
from fx_check import Failure, _is_dynamo_rejection, _record, judge_call
from fx_fuzz_dynamic import CALLS, DynProgram, generate


def _inputs(p: DynProgram, k: int, mark: bool) -> list:
    """Call k's inputs, its varying axes marked dynamic where `mark` and p.mark."""
    ins = p.concrete(k).make_inputs()
    if mark and p.mark:
        for x, (dims, _, _) in zip(ins, p.inputs):
            for axis, d in enumerate(dims):
                if p.varying(d):
                    torch._dynamo.mark_dynamic(x, axis)
    return ins


def _run(p: DynProgram, backend, on_call=None, static=False):
    """Compile p with `backend` (dynamic=False where `static`) and call it at each size. Returns
    (frames compiled after each call, the error raised or None); on_call(k, got, want,
    eager_error, eager_in, fused_in) may return a Failure, which stops the run and is returned
    as the error."""
    frames = [0]
    if isinstance(backend, str):                    # "aot_eager"
        backend = torch._dynamo.lookup_backend(backend)

    def counting(gm, example_inputs):
        frames[0] += 1
        return backend(gm, example_inputs)
    torch._dynamo.reset()
    dynamic = False if static else None if p.mark else True
    compiled = torch.compile(p.function(), backend=counting, dynamic=dynamic)
    seen = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for k in range(CALLS):
            fn = p.concrete(k).function()
            eager_in, fused_in = _inputs(p, k, False), _inputs(p, k, not static)
            with torch.set_grad_enabled(p.grad):
                try:
                    want, eager_error = fn(*eager_in), None
                except Exception as e:  # noqa: BLE001
                    want, eager_error = None, e
                try:
                    got = compiled(*fused_in)
                except Exception as e:  # noqa: BLE001
                    return seen, (None if eager_error is not None else e)
            seen.append(frames[0])
            if on_call is not None:
                f = on_call(k, got, want, eager_error, eager_in, fused_in)
                if f is not None:
                    return seen, f
    return seen, None


def _dynamos_own(p: DynProgram) -> bool:
    """The calls raise or recompile under aot_eager too (no pyfuser involved)."""
    seen, err = _run(p, "aot_eager")
    torch._dynamo.reset()
    return err is not None or len(set(seen)) > 1


def check(p: DynProgram, backend=None) -> Optional[Failure]:
    import pyfuser
    from pyfuser.frontend.fx import compiled_graphs, reset_compiled
    from pyfuser.frontend.fx.compile_graph import clear_cache
    backend = backend or pyfuser.backend
    reset_compiled()
    clear_cache()           # regions lowered for earlier programs: a seed's result is its own
    graphs = []

    def on_call(k, got, want, eager_error, eager_in, fused_in):
        f = judge_call(p.concrete(k), got, want, eager_error, eager_in, fused_in)
        graphs.append(len(compiled_graphs()))       # after the backward (compiled at call 0)
        if f is not None:
            f.program = p
            f.what = f"call {k} (sizes {_sizes_at(p, k)}): {f.what}"
        return f

    seen, err = _run(p, backend, on_call)
    torch._dynamo.reset()
    if isinstance(err, Failure):
        return err
    if err is not None:
        if not (_is_dynamo_rejection(err) or _dynamos_own(p)):
            return Failure(p, f"call {len(seen)} (sizes {_sizes_at(p, len(seen))}): pyfuser "
                              f"raised {type(err).__name__}: {str(err)[:400]}")
        p.stats["dynamo_skipped"] = 1
    elif len(set(seen)) > 1:
        if not _dynamos_own(p):
            return Failure(p, f"recompiled: Dynamo compiled {seen} frames after each call, "
                              f"aot_eager once")
        p.stats["dynamo_recompiled"] = 1
    elif backend is pyfuser.backend and len(set(graphs)) > 1:
        return Failure(p, f"pyfuser compiled graphs after the first call: {graphs}")
    f = _replay(p, backend) if p.replay else None
    _record(p)                  # the graphs of both runs (and why regions ran eagerly)
    return f


def _replay(p: DynProgram, backend) -> Optional[Failure]:
    """p compiled with dynamic=False and called at each size: a static graph per size, whose
    regions share one Fusion (compile_graph's cache by region form), so a kernel planned at one
    size serves another (a slice one element long at n = 3 and not at n = 5)."""
    def on_call(k, got, want, eager_error, eager_in, fused_in):
        f = judge_call(p.concrete(k), got, want, eager_error, eager_in, fused_in)
        if f is not None:
            f.program = p
            f.what = f"static replay, call {k} (sizes {_sizes_at(p, k)}): {f.what}"
        return f
    seen, err = _run(p, backend, on_call, static=True)
    torch._dynamo.reset()
    if isinstance(err, Failure):
        return err
    if err is not None and not _is_dynamo_rejection(err):
        return Failure(p, f"static replay, call {len(seen)}: pyfuser raised "
                          f"{type(err).__name__}: {str(err)[:400]}")
    return None


def _sizes_at(p: DynProgram, k: int) -> dict:
    return {s: v[k] for s, v in p.sizes.items()}


def run_many(seeds):
    """Yield (program, failure) for each failing seed."""
    return fx_check.run_many(seeds, generate, check)


__all__ = ["check", "run_many", "Failure", "fx_check"]
