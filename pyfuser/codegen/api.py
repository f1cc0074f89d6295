"""The codegen API the runtime calls: signature, can_schedule, plan_kernel, KernelPlan, interpret.

    sig = signature(fusion, inputs)          # cache key; sizes are not part of it
    plan = plan_kernel(fusion, inputs)       # SchedulerError when the pointwise scheduler refuses
                                             # (fusion.kernel_scheduler == "transpose": TransposePlan)
    outs = plan.allocate_outputs(bindings, inputs, device)
    cfg = plan.kernel.launch_config(bindings, tensors)   # grid (0, 1, 1): nothing to launch
    interpret(plan, inputs, outs, bindings)  # CPU run of the kernel's logic

Segment tensors (Param sources) are the tensor inputs in fusion.inputs order, then the outputs.

Invariants:
- plan_kernel never changes the user's Fusion (it schedules a deep copy).
- A plan is valid for every input list with the same signature (see schedule/layout.py).
- Kernel params use only the sources documented in kernel.py; scalar sources name the user's
  Scalars, so `bind(user_fusion, inputs)` gives their values.
"""
from __future__ import annotations

from .. import dump as D
from ..ir.tensor import TensorView
from ..schedule import layout as L
from ..schedule import pointwise as PW
from . import kernel_ir as K
from .cuda import full_source, kernel_body
from .kernel import GeneratedKernel, LaunchConfig
from .lowering import Lowering, kernel_name

MAX_GRID_X = 2 ** 31 - 1
MAX_GRID_Y = 65535


def signature(fusion, inputs) -> tuple:
    facts = []
    out_numel = None
    for v, x in zip(fusion.inputs, inputs):
        if isinstance(v, TensorView):
            facts.append(L.tensor_facts(x))
        else:
            facts.append(L.scalar_fact(x))
    out_numel = _ref_numel(fusion, inputs)
    views = L.view_extent_facts(fusion, inputs)
    return (tuple(facts), L.needs_int64(inputs, out_numel)) + ((views,) if views else ())


def _ref_numel(fusion, inputs) -> int:
    """Elements of output 0, from the input sizes when its extents are input extents."""
    if not fusion.outputs:
        return 0
    where = {}
    for v, x in zip(fusion.inputs, inputs):
        if isinstance(v, TensorView):
            for d, n in zip(v.logical, x.shape):
                where[id(d.extent)] = int(n)
    n = 1
    for d in fusion.outputs[0].logical:
        s = d.expanded_extent if d.expanded_extent is not None else d.extent
        if s.is_const:
            n *= int(s.value)
        elif id(s) in where:
            n *= where[id(s)]
        else:
            from ..ir.shapes import bind
            return L.numel(bind(fusion, inputs).shape(fusion.outputs[0]))
    return n


def can_schedule(fusion) -> tuple[bool, str]:
    return PW.can_schedule(fusion)


class KernelPlan:
    def __init__(self, sched, kernel: GeneratedKernel, kir: K.Kernel, body: str):
        self.schedule = sched
        self.kernel = kernel
        self.kernel_ir = kir
        self.index_type = kir.index_type
        self.body = body             # the __global__ function alone (no prelude)
        self._outputs = list(sched.orig.outputs)
        self._orders = sched.out_orders

    def allocate_outputs(self, bindings, inputs, device) -> list:
        import torch
        outs = []
        for o, order in zip(self._outputs, self._orders):
            sizes = bindings.shape(o)
            outs.append(torch.empty_strided(sizes, L.strides_for(sizes, order), dtype=o.dtype.torch,
                                            device=device))
        return outs

    def __repr__(self) -> str:
        return f"KernelPlan({self.kernel.name}, {self.schedule.params.as_dict()})"


def _launch_fn(sched, ref_seg: int):
    p = sched.params
    groups = p.groups

    def launch_config(bindings, tensors) -> LaunchConfig:
        shape = tuple(tensors[ref_seg].shape)
        ext = [L.numel(shape[k] for k in g) for g in groups]
        total = L.numel(ext)
        if total == 0:
            return LaunchConfig((0, 1, 1), (p.block, 1, 1))
        cap = p.max_blocks or MAX_GRID_X       # the kernel grid-strides: any grid is correct
        if p.kind == "1d":
            chunk = p.unroll * p.block * p.vec
            return LaunchConfig((min(-(-total // chunk), MAX_GRID_X, cap), 1, 1), (p.block, 1, 1))
        rows = total // ext[-1]
        gx = min(-(-ext[-1] // (p.block * p.vec)), MAX_GRID_X)
        gy = min(-(-rows // p.unroll), MAX_GRID_Y, max(1, cap // gx))
        return LaunchConfig((gx, gy, 1), (p.block, 1, 1))
    return launch_config


def plan_kernel(fusion, inputs) -> KernelPlan:
    if getattr(fusion, "kernel_scheduler", None) == "transpose":   # set by the segmenter
        from ..schedule import transpose
        return transpose.plan_kernel(fusion, inputs)
    sched = PW.schedule(fusion, list(inputs))
    name = kernel_name(sched.fusion)
    low = Lowering(sched)
    kir = low.build(name)
    body = kernel_body(kir)
    header = f"// pyfuser pointwise kernel: {sched.params.as_dict()}\n"
    source = full_source(kir, header)
    ref_seg = len(sched.fusion.tensor_inputs())
    kernel = GeneratedKernel(name, source, list(kir.params), _launch_fn(sched, ref_seg),
                             sched.params.as_dict())
    D.dump("kernel_ir", name, lambda: K.format_kernel_ir(kir))
    # cuda_kernel / cuda_to_file are dumped where every kernel is compiled (runtime).
    return KernelPlan(sched, kernel, kir, body)


def interpret(plan: KernelPlan, inputs, outputs, bindings) -> None:
    if hasattr(plan, "interpret"):                 # plans of other schedulers (transpose)
        plan.interpret(inputs, outputs, bindings)
        return
    from .interpreter import run
    run(plan, list(inputs), list(outputs), bindings)
