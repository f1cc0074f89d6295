"""The codegen API the runtime calls: signature, can_schedule, plan_kernel, interpret.

    sig = signature(fusion, inputs)          # cache key; sizes are not part of it
    plan = plan_kernel(fusion, inputs)       # a kernel.KernelPlan; SchedulerError when refused
    outs = plan.allocate_outputs(bindings, inputs, device)
    cfg = plan.kernel.launch_config(bindings, tensors)   # grid (0, 1, 1): nothing to launch
    interpret(plan, inputs, outs, bindings)  # CPU run of the kernel IR

`plan_kernel` asks the scheduler registry (schedule/registry.py) which scheduler takes the
fusion for these inputs (from the one the segmenter named in `fusion.kernel_scheduler` on) and
lowers its schedule with that scheduler's lowering (LOWERINGS): every scheduler ends in kernel IR,
printed as CUDA C (cuda.py) and run by the CPU interpreter (interpreter.py).

Segment tensors (Param sources) are the tensor inputs in fusion.inputs order, then the outputs.

Invariants:
- plan_kernel never changes the user's Fusion (schedulers work on deep copies).
- A plan is valid for every input list with the same signature (see schedule/layout.py).
- Kernel params use only the sources documented in kernel.py; scalar sources name the user's
  Scalars, so `bind(user_fusion, inputs)` gives their values.
"""
from __future__ import annotations

from .. import dump as D
from ..errors import SchedulerError
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from ..schedule import layout as L
from ..schedule import registry
from . import kernel_ir_format as KF
from .cuda import full_source, kernel_body
from .kernel import GeneratedKernel, KernelPlan, LaunchConfig
from .lowering import Lowering, kernel_name

MAX_GRID_X = 2 ** 31 - 1
MAX_GRID_Y = 65535


def signature(fusion, inputs) -> tuple:
    """The kernel cache key: layout facts of the inputs (schedule/layout.py), 64-bit indexing,
    view extents' facts, slice / pad / cat output extents' facts, and for schedulers whose plan
    depends on sizes (the reduction family) the scheduler chosen for these inputs and its size
    class."""
    facts = []
    for v, x in zip(fusion.inputs, inputs):
        if isinstance(v, TensorView):
            facts.append(L.tensor_facts(x))
        else:
            facts.append(L.scalar_fact(x))
    out_numel = _ref_numel(fusion, inputs)
    memo: list = []

    def bound():
        """The fusion's bindings for these inputs, made once (view and resize facts and the
        scheduler's choice all read them)."""
        if not memo:
            memo.append(bind(fusion, inputs))
        return memo[0]
    views = L.view_extent_facts(fusion, bound)
    resized = L.resize_extent_facts(fusion, bound)
    sig = (tuple(facts), L.needs_int64(inputs, out_numel)) + ((views,) if views else ()) + \
        ((("resized", resized),) if resized else ())
    if getattr(fusion, "kernel_scheduler", None) not in (None, "pointwise", "transpose") or \
            _has_reduction(fusion):
        inputs = list(inputs)
        try:
            s = registry.select(fusion, inputs, bound(), getattr(fusion, "kernel_scheduler", None))
        except SchedulerError as e:      # no scheduler takes these sizes: plan_kernel says so
            return sig + (("refused", str(e)),)
        if s.size_class is not None:
            sig += ((s.name, s.size_class(fusion, inputs)),)
    return sig


def _has_reduction(fusion) -> bool:
    """Whether the plan may depend on sizes (reductions; an embedding backward's tiles)."""
    from ..ir import exprs as E
    return any(isinstance(e, (E.ReductionOp, E.WelfordOp, E.EmbeddingBackwardOp))
               for e in fusion.exprs)


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
        size = d.known_size()
        if size is not None:
            n *= size
        elif id(d.full_extent) in where:
            n *= where[id(d.full_extent)]
        else:
            return L.numel(bind(fusion, inputs).shape(fusion.outputs[0]))
    return n


def can_schedule(fusion) -> tuple[bool, str]:
    """Whether some kernel scheduler takes `fusion` whole (the registry's compile checks)."""
    name, why = registry.accepting(fusion, ", ".join(e.op_name for e in fusion.used_exprs()))
    return name is not None, why


# ---- pointwise --------------------------------------------------------------------------------
def _pointwise_launch(sched, ref_seg: int):
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


def _alias_pairs(fusion) -> list:
    """(output index, input index) of the fusion's in-place outputs (fusion.aliases)."""
    aliases = getattr(fusion, "aliases", None) or {}
    outs = {id(o): k for k, o in enumerate(fusion.outputs)}
    ins = {id(v): j for j, v in enumerate(fusion.inputs)}
    return [(outs[id(o)], ins[id(i)]) for o, i in aliases.items()
            if id(o) in outs and id(i) in ins]


def _plan_pointwise(fusion, inputs, sched) -> KernelPlan:
    from ..schedule.pointwise_inplace import pointwise_inplace
    name = kernel_name(sched.fusion)
    inplace = pointwise_inplace(sched, _alias_pairs(fusion))
    kir = Lowering(sched).build(name)
    header = f"// pyfuser pointwise kernel: {sched.params.as_dict()}\n"
    ref_seg = len(sched.fusion.tensor_inputs())
    kernel = GeneratedKernel(name, full_source(kir, header), list(kir.params),
                             _pointwise_launch(sched, ref_seg), sched.params.as_dict())
    plan = KernelPlan(fusion, "pointwise", sched.params, kernel, kir, kernel_body(kir),
                      sched.out_orders)
    plan.schedule = sched
    plan.inplace = inplace
    return plan


# ---- transpose --------------------------------------------------------------------------------
def _plan_transpose(fusion, inputs, params) -> KernelPlan:
    from .transpose_lowering import build, launch_fn
    name = f"pf_transpose_{params.kind}_kernel"
    kir = build(params, fusion, name)
    header = f"// pyfuser transpose kernel: {params.as_dict()}\n"
    kernel = GeneratedKernel(name, full_source(kir, header), list(kir.params),
                             launch_fn(params), params.as_dict())
    return KernelPlan(fusion, "transpose", params, kernel, kir, kernel_body(kir),
                      [tuple(range(fusion.outputs[0].ndim))])


# ---- reductions and normalizations ----------------------------------------------------------
def _reduction_family_plan(fusion, sched, lower) -> KernelPlan:
    """The KernelPlan of a reduction-family schedule, its kernel IR from `lower(sched, name)`."""
    name = kernel_name(fusion)
    kir, launch, workspaces = lower(sched, name)
    header = f"// pyfuser {sched.scheduler} kernel: {sched.params.as_dict()}\n"
    kernel = GeneratedKernel(name, full_source(kir, header), list(kir.params), launch,
                             sched.params.as_dict())
    plan = KernelPlan(fusion, sched.scheduler, sched.params, kernel, kir, kernel_body(kir),
                      sched.out_orders, workspaces)
    plan.schedule = sched
    return plan


def _plan_reduction(fusion, inputs, sched) -> KernelPlan:
    from .reduction_launch import plan_reduction_kernel
    plan = _reduction_family_plan(fusion, sched, plan_reduction_kernel)
    outs = {id(o): k for k, o in enumerate(fusion.outputs)}
    ins = {id(v): j for j, v in enumerate(fusion.inputs)}
    plan.inplace = {outs[o]: ins[i] for o, i in sched.inplace_pairs}
    return plan


def _plan_inner_outer(fusion, inputs, sched) -> KernelPlan:
    from .inner_outer_lowering import plan_inner_outer_kernel
    return _reduction_family_plan(fusion, sched, plan_inner_outer_kernel)


def _plan_embedding_backward(fusion, inputs, params) -> KernelPlan:
    from .embedding_backward_lowering import build, launch_fn
    name = "pf_embedding_backward_kernel"
    kir = build(params, fusion, name)
    header = f"// pyfuser embedding_backward kernel: {params.as_dict()}\n"
    kernel = GeneratedKernel(name, full_source(kir, header), list(kir.params), launch_fn(params),
                             params.as_dict())
    return KernelPlan(fusion, "embedding_backward", params, kernel, kir, kernel_body(kir),
                      [(0, 1)])


def _plan_horizontal(fusion, inputs, sched) -> KernelPlan:
    from .horizontal_lowering import plan_horizontal
    return plan_horizontal(fusion, inputs, sched)


def _plan_tail(fusion, inputs, ts) -> KernelPlan:
    from .tail_lowering import plan_tail
    return plan_tail(fusion, inputs, ts)


LOWERINGS = {"pointwise": _plan_pointwise, "transpose": _plan_transpose,
             "reduction": _plan_reduction, "inner_persistent": _plan_reduction,
             "outer_persistent": _plan_reduction, "horizontal": _plan_horizontal,
             "inner_outer_persistent": _plan_inner_outer,
             "embedding_backward": _plan_embedding_backward, "tail": _plan_tail}


def plan_kernel(fusion, inputs) -> KernelPlan:
    inputs = list(inputs)
    sched = registry.select(fusion, inputs, bind(fusion, inputs),
                            getattr(fusion, "kernel_scheduler", None))
    plan = LOWERINGS[sched.name](fusion, inputs, sched.plan(fusion, inputs))
    D.dump("kernel_ir", plan.kernel.name, lambda: KF.format_kernel_ir(plan.kernel_ir))
    # cuda_kernel / cuda_to_file are dumped where every kernel is compiled (runtime).
    return plan


def interpret(plan: KernelPlan, inputs, outputs, bindings, params=None, workspaces=None) -> None:
    """Run the plan's kernel IR on the CPU. `params`: the launch's packed parameter values (the
    runtime's; random-number seeds and offsets come from there), `workspaces`: the buffers
    they point to (made here when not given)."""
    from .interpreter import run
    run(plan, list(inputs), list(outputs), bindings, params, workspaces)
