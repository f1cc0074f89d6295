"""Running a SegmentedFusion: segments in order, intermediates passed by value, a RunReport.

    outs, report = run_segments(sf, inputs, backend, executor_for)

`backend` is "cuda" (kernel segments launch through their FusionExecutor), "interpret" (the
executor's CPU interpreter mode) or "evaluator" (kernel segments run on the reference evaluator).
`executor_for(fusion, mode)` (from dispatch) returns the cached executor of a kernel segment's
program, or None when there is none (the evaluator runs it then).

- host segments apply their exprs as views (host.run_host); no kernel, no copy;
- eager segments run their sub-Fusion on the reference evaluator;
- a kernel segment's inputs are the tensors computed so far plus scalar values from the original
  fusion's Bindings (computed once per input-shape key; they also validate the inputs).

Invariants: an output that is a fusion input is returned as the very same tensor object; outputs
of host segments are views of the tensors they come from (torch decides, as eager would).
"""
from __future__ import annotations

import torch

from ..ir.evaluator import evaluate
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from .host import run_host
from .segmented_fusion import RunReport, SegmentRun

_MAX_BINDINGS = 256


def _bindings(sf, inputs):
    """The original fusion's Bindings, cached by input shapes when there are no scalar inputs."""
    if any(not isinstance(x, torch.Tensor) for x in inputs):
        return bind(sf.fusion, inputs)
    key = tuple((x.shape, x.dtype) for x in inputs)
    cache = sf.__dict__.setdefault("_bindings", {})
    b = cache.get(key)
    if b is None:
        if len(cache) >= _MAX_BINDINGS:
            cache.clear()
        b = cache[key] = bind(sf.fusion, inputs)
    return b


def run_segments(sf, inputs, backend: str, executor_for):
    fusion = sf.fusion
    report = RunReport()
    b = _bindings(sf, inputs)
    env = {id(v): x for v, x in zip(fusion.inputs, inputs)}
    for seg in sf.segments:
        names = [e.op_name for e in seg.exprs]
        if seg.kind == "host":
            for e in seg.exprs:
                env[id(e.output)] = run_host(e, env[id(e.inputs[0])], b)
            report.host_segments += 1
            report.segments.append(SegmentRun("host", None, names, None))
            continue
        args = [env[id(v)] if isinstance(v, TensorView) else
                (env[id(v)] if id(v) in env else b.value(v)) for v in seg.sub_inputs]
        used = "evaluator"
        if seg.kind == "kernel" and backend != "evaluator":
            ex = executor_for(seg.fusion, backend)
            if ex is not None:
                outs = ex.run(args)
                used = backend
                report.launched += int(ex.last_run.get("kernels", 0))
                if ex.last_run.get("fallback"):
                    used = "evaluator"
            else:
                outs = evaluate(seg.fusion, args)
        else:
            outs = evaluate(seg.fusion, args)
        for o, x in zip(seg.outputs, outs):
            env[id(o)] = x
        if seg.kind == "kernel":
            report.kernels += 1
        else:
            report.eager_segments += 1
        report.segments.append(SegmentRun(seg.kind, seg.scheduler, names, used))
    return [env[id(o)] for o in fusion.outputs], report
