"""Lowering of a TailSchedule (schedule/tail.py): a reduction kernel whose last block to finish
reduces the kernel's row results to the fusion's scalars.

The head's and the tail's kernel IR are what the reduction lowering (reduction_launch.py) builds
for each plan on its own sub-Fusion. This module puts them in one kernel:

  the head's body, unchanged: every block runs its rows, writing the head's outputs; a tensor
      it computes only for the tail (`crossing`, e.g. a row's loss) goes to a workspace of its
      size (contiguous), after the fusion's outputs among the kernel's tensors;
  the count: every thread fences its writes, the block syncs, its first thread adds 1 to the
      semaphore (a zeroed workspace word) and the block learns whether it was the last of the
      grid's gridDim.x * gridDim.y blocks (gridDim.z is 1: the head's plan splits over no
      blocks);
  the tail, in that last block only: a fence, then the tail's body under the prefix `tl_`
      (kernel_ir_rename.py) with blockIdx read as 0 and gridDim as 1 (the tail is one block's
      plan: one row of the rows' values) and threadIdx.x as the block's linear thread index
      (its plan has the head's thread count in x); its loads of the crossing tensors go through
      L2 (`cg`: another SM wrote them) and neither pointer is `__restrict__` (the head writes
      and the tail reads the same memory); its first thread then sets the semaphore back to 0
      for the next launch on the stream.

The order of the tail's sum is its plan's, the same every run: no float atomics. The CPU
interpreter runs this kernel IR (its blocks in one array, the atomics in block order); CUDA C
is printed from it.
"""
from __future__ import annotations

import dataclasses

import torch

from ..errors import SchedulerError
from ..ir.dtypes import DataType
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import kernel_ir as K
from .cuda import full_source, kernel_body
from .horizontal_lowering import param_source, scalar_map
from .kernel import GeneratedKernel, KernelPlan, Param
from .kernel_ir_rename import Rename
from .lowering import kernel_name
from .reduction_launch import plan_reduction_kernel

PREFIX = "tl_"
WHAT = "tail lowering"


def _names(kir) -> set:
    out = {q.name for q in kir.params} | set(kir.tensors)
    for st in kir.walk():
        for attr in ("name", "var", "dst"):
            n = getattr(st, attr, None)
            if isinstance(n, str):
                out.add(n)
    return out


class _Segments:
    """Segment tensor numbering of the merged kernel: the fusion's tensor inputs, its outputs,
    then one workspace per crossing tensor that is no fusion output, then the semaphore."""

    def __init__(self, ts):
        f, sp = ts.fusion, ts.split
        self.fusion = f
        self.tensor_pos = {id(v): i for i, v in enumerate(f.tensor_inputs())}
        self.nin = len(f.tensor_inputs())
        self.out_pos = {id(o): self.nin + k for k, o in enumerate(f.outputs)}
        base = self.nin + len(f.outputs)
        self.scratch = [v for v in sp.crossing if id(v) not in self.out_pos]
        self.scratch_pos = {id(v): base + k for k, v in enumerate(self.scratch)}
        self.semaphore = base + len(self.scratch)

    def of(self, orig) -> int:
        for table in (self.tensor_pos, self.out_pos, self.scratch_pos):
            if id(orig) in table:
                return table[id(orig)]
        raise SchedulerError(f"{WHAT}: tensor {orig.name} is neither an input, an output nor "
                             "a tensor the head computes for the tail")

    def seg_map(self, ex) -> list:
        """Sub-Fusion `ex`'s segment tensor index -> the merged kernel's."""
        tensors = [orig for v, orig in zip(ex.fusion.inputs, ex.inputs)
                   if isinstance(v, TensorView)]
        return [self.of(v) for v in tensors + list(ex.outputs)]


def build(ts, segs: _Segments, name: str):
    """(kernel IR, head launch_config) of the merged kernel (module docstring)."""
    sp = ts.split
    head_kir, head_launch, head_ws = plan_reduction_kernel(ts.head, "head")
    tail_kir, _, tail_ws = plan_reduction_kernel(ts.tail, "tail")
    if head_ws or tail_ws:
        raise SchedulerError(f"{WHAT}: a plan that reduces across blocks")
    if head_kir.index_type != tail_kir.index_type:
        raise SchedulerError(f"{WHAT}: index types {head_kir.index_type} and "
                             f"{tail_kir.index_type}")
    if any(n.startswith(PREFIX) for n in _names(head_kir)):
        raise SchedulerError(f"{WHAT}: the head's kernel IR uses the prefix {PREFIX}")
    bx = head_kir.block[0]
    tid = K.add(K.Special("threadIdx.x"), K.mul(K.Special("threadIdx.y"), K.Const(bx, "nidx_t")))
    zero = K.Const(0, "nidx_t")
    rel = Rename(lambda n: PREFIX + n, {"threadIdx.x": tid, "threadIdx.y": K.Const(0, "nidx_t"),
                                        "blockIdx.x": zero, "blockIdx.y": zero,
                                        "blockIdx.z": zero, "gridDim.x": K.Const(1, "nidx_t"),
                                        "gridDim.y": K.Const(1, "nidx_t")},
                 strict=True, what=WHAT)
    head_seg, tail_seg = segs.seg_map(sp.head), segs.seg_map(sp.tail)
    crossing_segs = {segs.of(v) for v in sp.crossing}
    params, tensors = [], {}
    head_scalars, tail_scalars = scalar_map(sp.head), scalar_map(sp.tail)
    for q in head_kir.params:
        params.append(Param(q.name, q.ctype, param_source(q.source, head_seg, head_scalars, WHAT)))
    for tname, t in head_kir.tensors.items():
        seg = head_seg[t.seg]
        tensors[tname] = dataclasses.replace(t, seg=seg, restrict=t.restrict and
                                             seg not in crossing_segs)
    for q in tail_kir.params:
        params.append(Param(rel.name(q.name), q.ctype,
                            param_source(q.source, tail_seg, tail_scalars, WHAT)))
    cross_ptrs = set()
    for tname, t in tail_kir.tensors.items():
        seg = tail_seg[t.seg]
        tensors[rel.name(tname)] = dataclasses.replace(
            t, name=rel.name(tname), seg=seg, restrict=t.restrict and seg not in crossing_segs)
        if seg in crossing_segs:
            cross_ptrs.add(rel.name(tname))
    sem = PREFIX + "semaphore"
    tensors[sem] = K.TensorParam(sem, DataType.Int32, segs.semaphore, True)
    params.append(Param(sem, "void*", ("ptr", segs.semaphore)))
    tail_body = [_through_l2(st, cross_ptrs) for st in rel.block(tail_kir.body)]
    shared = [st for st in tail_body if isinstance(st, K.Alloc) and st.space == "shared"]
    tail_body = [st for st in tail_body if not (isinstance(st, K.Alloc) and st.space == "shared")]
    first = K.Bin("==", tid, K.Const(0, "nidx_t"))
    last, arrived = PREFIX + "last", PREFIX + "arrived"
    blocks = K.mul(K.Special("gridDim.x"), K.Special("gridDim.y"))
    reset = [K.Alloc(PREFIX + "zero", DataType.Int32, (1,)),
             K.Assign(PREFIX + "zero", (K.Const(0, "nidx_t"),), K.Const(0, "nidx_t")),
             K.Store(sem, K.Const(0, "nidx_t"), PREFIX + "zero", (), 1)]
    body = shared + [K.Alloc(last, DataType.Bool, (), "shared")] + head_kir.body + [
        K.Comment("the tail: the last block to finish reduces the rows' results"),
        K.Fence(), K.Sync(),
        K.If(first, [K.AtomicAdd(arrived, sem, K.Const(0, "nidx_t"), K.Const(1, "nidx_t")),
                     K.Assign(last, (), K.Bin("==", K.Var(arrived),
                                              K.Bin("-", blocks, K.Const(1, "nidx_t"))))]),
        K.Sync(),
        K.If(K.ArrayRef(last, ()), [K.Fence(), *tail_body, K.If(first, reset)])]
    kir = K.Kernel(name, params, tensors, head_kir.index_type, head_kir.block, body,
                   head_kir.min_blocks, head_kir.cluster)
    return kir, head_launch


def _through_l2(st, ptrs):
    """`st` with its loads of `ptrs` (and those in its nested bodies) made `cg` loads."""
    if isinstance(st, K.Load) and st.ptr in ptrs:
        return dataclasses.replace(st, cache="cg")
    if isinstance(st, (K.Loop, K.If)):
        return dataclasses.replace(st, body=[_through_l2(x, ptrs) for x in st.body])
    return st


def launch_fn(ts, head_launch):
    """The head's launch configuration, from the head's own bindings (its sub-Fusion's inputs
    taken from the fusion's tensors and bindings). The closure holds positions and values, no
    map keyed by object ids (a plan is stored on disk and loaded in another process)."""
    f, sp = ts.fusion, ts.split
    nin = len(f.tensor_inputs())
    tensors_in = [k for k, v in enumerate(f.inputs) if isinstance(v, TensorView)]
    sources = []                        # per head input: ("tensor", k) or ("value", Scalar)
    for v, orig in zip(sp.head.fusion.inputs, sp.head.inputs):
        i = next((i for i, x in enumerate(f.inputs) if x is orig), None)
        if isinstance(v, TensorView):
            if i is None:
                raise SchedulerError(f"{WHAT}: the head reads {orig.name}, not a fusion input")
            sources.append(("tensor", tensors_in.index(i)))
        else:
            sources.append(("value", orig))
    outs = []                           # per head output: ("tensor", k) or ("meta", TensorView)
    for o in sp.head.outputs:
        k = next((k for k, x in enumerate(f.outputs) if x is o), None)
        outs.append(("tensor", nin + k) if k is not None else ("meta", o))

    def config(bindings, tensors):
        head_inputs = [tensors[x] if kind == "tensor" else bindings.value(x)
                       for kind, x in sources]
        hb = bind(sp.head.fusion, head_inputs)
        head_tensors = [x for (kind, _), x in zip(sources, head_inputs) if kind == "tensor"]
        for kind, x in outs:
            head_tensors.append(tensors[x] if kind == "tensor" else
                                torch.empty(bindings.shape(x), dtype=x.dtype.torch,
                                            device="meta"))
        return head_launch(hb, head_tensors)
    return config


def workspace_fn(segs: _Segments):
    """(bindings, tensors) -> the crossing tensors' workspaces (their shapes, contiguous) and the
    semaphore (one int32 word, zero before a launch and after it)."""
    scratch = segs.scratch

    def sizes(bindings, tensors):
        return [(tuple(bindings.shape(v)), v.dtype.torch, "partials") for v in scratch] + \
            [(1, torch.int32, "semaphores")]
    return sizes


def plan_tail(fusion, inputs, ts) -> KernelPlan:
    name = kernel_name(fusion)
    segs = _Segments(ts)
    kir, head_launch = build(ts, segs, name)
    header = f"// pyfuser tail kernel: {ts.params.as_dict()}\n"
    kernel = GeneratedKernel(name, full_source(kir, header), list(kir.params),
                             launch_fn(ts, head_launch), ts.params.as_dict())
    orders = [None] * len(fusion.outputs)
    for ex, sched in ((ts.split.head, ts.head), (ts.split.tail, ts.tail)):
        for o, order in zip(ex.outputs, sched.out_orders):
            for k, fo in enumerate(fusion.outputs):
                if fo is o:
                    orders[k] = order
    plan = KernelPlan(fusion, "tail", ts.params, kernel, kir, kernel_body(kir), orders,
                      workspace_fn(segs))
    plan.schedule = ts
    return plan
