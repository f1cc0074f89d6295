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
of host segments are views of the tensors they come from (torch decides, as eager would); an
in-place output (fusion.aliases) is its input, written after every segment has run (or by the
kernel that computes it, when the plan allows) and returned.

`record` (a dict, from dispatch) asks for what a cached replay needs: "kernels" = [(the kernel
executor's _Fast, env slots of its tensor inputs, executor)], "outputs" = [(slot, None or
(size, stride) of a view of that slot)], "ok" = whether every segment can be replayed so (slots:
fusion inputs in order, then kernel outputs in run order; host values resolve to their base),
which needs every in-place output written by its kernel (a replay makes no copy after them).
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
    """The original fusion's Bindings, cached by input shapes when there are no scalar inputs.

    Whether there are is the Fusion's declaration, not the values' types: a scalar input may be
    given as a 0-dim tensor, whose value a shape key does not see."""
    if any(not isinstance(v, TensorView) for v in sf.fusion.inputs) or \
            any(not isinstance(x, torch.Tensor) for x in inputs):
        return bind(sf.fusion, inputs)
    key = tuple((x.shape, x.dtype) for x in inputs)
    cache = sf.__dict__.setdefault("_bindings", {})
    b = cache.get(key)
    if b is None:
        if len(cache) >= _MAX_BINDINGS:
            cache.clear()
        b = cache[key] = bind(sf.fusion, inputs)
    return b


def run_segments(sf, inputs, backend: str, executor_for, record=None):
    fusion = sf.fusion
    report = RunReport()
    b = _bindings(sf, inputs)
    env = {id(v): x for v, x in zip(fusion.inputs, inputs)}
    slot = {id(v): k for k, v in enumerate(fusion.inputs)}   # replay slots (see `record`)
    base: dict = {}                                          # host value -> the slot it views
    ok = record is not None
    kernels: list = []
    device = next((x.device for x in inputs if isinstance(x, torch.Tensor)), None)
    for seg in sf.segments:
        names = [e.op_name for e in seg.exprs]
        if seg.kind == "host":
            for e in seg.exprs:
                x = env[id(e.inputs[0])]
                env[id(e.output)] = run_host(e, x, b)
                if ok:
                    base[id(e.output)] = base.get(id(e.inputs[0]), id(e.inputs[0]))
            report.host_segments += 1
            report.segments.append(SegmentRun("host", None, names, None))
            continue
        args = [env[id(v)] if isinstance(v, TensorView) else
                (env[id(v)] if id(v) in env else b.value(v)) for v in seg.sub_inputs]
        used = "evaluator"
        ex = None
        if seg.kind == "kernel" and backend != "evaluator" and not _split_devices(seg, args):
            ex = executor_for(seg.fusion, backend)
            if ex is not None:
                outs = ex.run(args)
                used = backend
                report.launched += int(ex.last_run.get("kernels", 0))
                if ex.last_run.get("fallback"):
                    used = "evaluator"
            else:
                outs = evaluate(seg.fusion, args, device)
        else:
            outs = evaluate(seg.fusion, args, device)
        if ok:
            ok = used == "cuda" and _record_kernel(kernels, ex, seg, args, env, slot, base)
        for o, x in zip(seg.outputs, outs):
            env[id(o)] = x
            slot[id(o)] = len(slot)
        if seg.kind == "kernel":     # a segment split at plan time ran several (split.py)
            report.kernels += ex.last_run.get("kernel_segments", 1) if ex is not None else 1
        else:
            report.eager_segments += 1
        report.segments.append(SegmentRun(seg.kind, seg.scheduler, names, used))
    results = apply_aliases(fusion, inputs, [env[id(o)] for o in fusion.outputs], report)
    ok = ok and not report.copies       # a copy after the kernels: no replay program
    if ok:
        outputs = []
        for o, t in zip(fusion.outputs, results):
            spec = _view_spec(o, t, env, slot, base)
            if spec is None:
                ok = False
                break
            outputs.append(spec)
        record.update(kernels=kernels, outputs=outputs)
    if record is not None:
        record["ok"] = ok
    return results, report


def _split_devices(seg, args) -> bool:
    """A horizontal kernel's independent computations whose tensors are on several devices:
    they never share a kernel; the segment runs on the evaluator (eager ops, each on its
    tensor's device), as eager would run them."""
    if seg.scheduler != "horizontal":
        return False
    return len({x.device for x in args if isinstance(x, torch.Tensor) and x.dim()}) > 1


def apply_aliases(fusion, inputs, outs, report=None) -> list:
    """In-place outputs (fusion.aliases): an output a kernel did not write into its input itself
    is copied into it now, after every segment has read the input (counted in the report's
    `copies`); the input is returned."""
    if not fusion.aliases:
        return outs
    outs = list(outs)
    for k, o in enumerate(fusion.outputs):
        target = fusion.aliases.get(o)
        if target is None:
            continue
        x = inputs[fusion.inputs.index(target)]
        if outs[k] is not x:
            x.copy_(outs[k])
            outs[k] = x
            if report is not None:
                report.copies += 1
    return outs


def _root(v, env, slot, base):
    """(slot, tensor) that value v is (or is a host view of)."""
    r = base.get(id(v), id(v))
    return slot.get(r), env.get(r)


def _same_start(t, root) -> bool:
    return t.data_ptr() == root.data_ptr() and t.storage_offset() == root.storage_offset() and \
        t.untyped_storage().data_ptr() == root.untyped_storage().data_ptr()


def _record_kernel(kernels, ex, seg, args, env, slot, base) -> bool:
    fast = ex.fast_entry(args)
    if fast is None:
        return False
    slots = []
    for v, x in zip(seg.sub_inputs, args):
        if isinstance(v, TensorView):
            k, root = _root(v, env, slot, base)
            if k is None or not isinstance(root, torch.Tensor) or not _same_start(x, root):
                return False
            slots.append(k)
    kernels.append((fast, slots, ex))
    return True


def _view_spec(o, t, env, slot, base):
    """(slot, None) or (slot, (size, stride)) giving output `t` at replay; None: cannot."""
    k, root = _root(o, env, slot, base)
    if k is None or not isinstance(root, torch.Tensor) or not isinstance(t, torch.Tensor):
        return None
    if t is root:
        return (k, None)
    if not _same_start(t, root):
        return None
    return (k, (tuple(t.shape), tuple(t.stride())))
