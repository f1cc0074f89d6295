"""One Fusion on its example inputs -> its segments, schedulers' verdicts, cuts and kernels.

    info = explain_group(source, bench=False)      # a GroupSource (frontends.py) -> GroupInfo

The Fusion is segmented as `execute` would (segment/segmenter.py, cached on the Fusion), then its
segments are run once to learn what each kernel segment receives (segment/runtime.run_segments
with executors that record their arguments: on CUDA the real ones, on the CPU the reference
evaluator, which is faster than the interpreter and gives the same values). Per kernel segment:
- every scheduler's compile check (registry.verdicts) and, where it passed, its run check for
  these inputs; the scheduler is `registry.select`'s, the one that plans the kernel at run time;
- the plan (codegen.api.plan_kernel): the kernel's name, `params.as_dict()`, the launch
  configuration for these sizes, the CUDA source, and the bytes it must move (distinct elements
  of each input: a broadcast input counts once; every output);
- with `bench` on CUDA, its time and the time of a copy of the same bytes (timing.py).
Cuts come from the segmenter (`sf.cuts`), their bytes at these inputs' sizes.

Nothing here changes how the Fusion runs: plans are made on the segment programs the executors
use, and the Fusion's own caches are those a normal `execute` fills.
"""
from __future__ import annotations

import torch

from ..errors import PyfuserError, SchedulerError
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from .model import CutInfo, GroupInfo, KernelInfo, SegmentInfo, Verdict

PRELUDE_NOTE = "// (pyfuser's CUDA prelude: shared helpers, the same in every kernel)\n"


class _Recorder:
    """Stands in for a kernel segment's executor: keeps the arguments and outputs of its call."""

    def __init__(self, fusion, real):
        self.fusion, self.real = fusion, real
        self.args = self.outs = None
        self.last_run = {"kernels": 1}

    def run(self, args):
        self.args = list(args)
        if self.real is not None:
            outs = self.real.run(args)
            self.last_run = self.real.last_run
        else:
            from ..ir.evaluator import evaluate
            outs = evaluate(self.fusion, self.args)
        self.outs = list(outs)
        return outs


def _segment_calls(sf, args, on_cuda: bool) -> dict:
    """id(kernel segment's fusion) -> its _Recorder after one run of the segments."""
    from ..runtime.dispatch import get_executor
    from ..segment.runtime import run_segments
    recorders: dict = {}

    def executor_for(fusion, mode):
        rec = recorders.get(id(fusion))
        if rec is None:
            rec = recorders[id(fusion)] = _Recorder(
                fusion, get_executor(fusion, "cuda") if on_cuda else None)
        return rec

    run_segments(sf, list(args), "cuda" if on_cuda else "interpret", executor_for)
    return recorders


def _name(v) -> str:
    return getattr(v, "name", str(v))


def expr_text(e) -> str:
    ins = ", ".join(_name(v) for v in e.inputs)
    outs = ", ".join(_name(v) for v in e.outputs)
    return f"{outs} = {e.op_name}({ins})"


def distinct_bytes(x) -> int:
    """Bytes of the distinct elements a tensor view reaches (stride-0 axes count once)."""
    if not isinstance(x, torch.Tensor):
        return 0
    n = 1
    for size, stride in zip(x.shape, x.stride()):
        if size == 0:
            return 0
        if stride != 0:
            n *= size
    return n * x.element_size()


def verdicts(fusion, args, bindings) -> list:
    """Every scheduler of the registry, in priority order: its compile check and, where that
    passed, its run check for these inputs."""
    from ..schedule import registry
    out = []
    for name, ok, why in registry.verdicts(fusion, stop_at_first=False):
        v = Verdict(name, ok, why)
        if ok:
            try:
                v.run_ok, v.run_reason = registry.get(name).run_check(fusion, args, bindings)
            except Exception as e:  # noqa: BLE001 - report the check's failure as its answer
                v.run_ok, v.run_reason = False, f"run check raised {type(e).__name__}: {e}"
        out.append(v)
    return out


def _kernel_info(seg_fusion, args, bindings, device, bench: bool, real) -> KernelInfo:
    from ..codegen.api import plan_kernel
    from ..codegen.prelude import PRELUDE
    plan = plan_kernel(seg_fusion, args)
    outs = plan.allocate_outputs(bindings, args, device)
    tensors = plan.kernel_tensors(args, outs)
    cfg = plan.kernel.launch_config(bindings, tensors)
    params = plan.params.as_dict() if hasattr(plan.params, "as_dict") else dict(plan.params)
    src = plan.kernel.source.replace(PRELUDE + "\n", PRELUDE_NOTE, 1)
    info = KernelInfo(
        name=plan.kernel.name, scheduler=plan.scheduler, params=params,
        launch={"grid": list(cfg.grid), "block": list(cfg.block), "shared_mem": cfg.shared_mem},
        index_type=plan.index_type,
        bytes_in=sum(distinct_bytes(x) for v, x in zip(seg_fusion.inputs, args)
                     if isinstance(v, TensorView)),
        bytes_out=sum(o.numel() * o.element_size() for o in outs), cuda=src)
    if bench and real is not None:
        from .timing import kernel_bench
        info.bench = kernel_bench(lambda: real.run(args), info.bytes_moved)
    return info


def _segment_info(i, seg, rec, device, bench) -> SegmentInfo:
    info = SegmentInfo(i, seg.kind, [expr_text(e) for e in seg.exprs],
                       [_name(v) for v in seg.inputs], [_name(v) for v in seg.outputs],
                       reason=seg.reason)
    if seg.kind != "kernel":
        return info
    info.segmenter_scheduler = seg.scheduler
    if rec is None or rec.args is None:
        info.error = "this kernel segment did not run"
        return info
    from ..schedule import registry
    args = rec.args
    try:
        b = bind(seg.fusion, args)
        info.verdicts = verdicts(seg.fusion, args, b)
        chosen = registry.select(seg.fusion, args, b, seg.scheduler)
    except (SchedulerError, PyfuserError) as e:
        info.error = f"{type(e).__name__}: {e} (this segment runs on the reference evaluator)"
        return info
    info.scheduler = chosen.name
    for v in info.verdicts:
        v.chosen = v.scheduler == chosen.name
    try:
        info.kernel = _kernel_info(seg.fusion, args, b, device, bench, rec.real)
    except PyfuserError as e:
        info.error = f"planning failed: {type(e).__name__}: {e}"
    return info


def _device(args):
    """Where the group runs: CUDA when any tensor argument is (0-dim CPU tensors beside CUDA
    ones are host scalars, moved as dispatch moves them)."""
    tensors = [x for x in args if isinstance(x, torch.Tensor)]
    return next((x.device for x in tensors if x.is_cuda),
                tensors[0].device if tensors else torch.device("cpu"))


def explain_group(src, bench: bool = False) -> GroupInfo:
    """GroupInfo of a frontends.GroupSource (its fusion explained on its arguments)."""
    g = GroupInfo(src.index, src.name, list(src.ops), list(src.inputs), list(src.outputs))
    if src.eager_reason:
        g.status, g.eager_reason = "eager", src.eager_reason
    fusion = src.fusion
    if fusion is None or not fusion.outputs:
        if fusion is not None:
            g.fusion_ir = str(fusion)
        return g
    from ..segment.segmenter import segment
    g.fusion_ir = str(fusion)
    args = list(src.args)
    sf = segment(fusion)
    g.split_reason = sf.split_reason
    device = _device(args)
    on_cuda = device.type == "cuda"
    if on_cuda:
        from ..runtime.dispatch import _scalars_to_device
        args = _scalars_to_device(fusion, args)
    recorders = _segment_calls(sf, args, on_cuda)
    for i, seg in enumerate(sf.segments):
        rec = recorders.get(id(seg.fusion)) if seg.kind == "kernel" else None
        g.segments.append(_segment_info(i, seg, rec, device, bench and on_cuda))
    g.cuts = _cuts(sf, fusion, args)
    return g


def _cuts(sf, fusion, args) -> list:
    seg_of = {id(e): i for i, s in enumerate(sf.segments) for e in s.exprs}
    try:
        b = bind(fusion, args)
    except PyfuserError:
        b = None
    out = []
    for c in sf.cuts:
        nbytes = c.nbytes
        if b is not None:
            try:
                n = 1
                for s in b.shape(c.tensor):
                    n *= s
                nbytes = n * c.tensor.dtype.itemsize
            except (KeyError, PyfuserError):
                pass
        out.append(CutInfo(c.tensor.name, seg_of.get(id(c.producer[0]), -1),
                           seg_of.get(id(c.consumer[0]), -1), nbytes, c.reason))
    return out
