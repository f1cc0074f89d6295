"""The horizontal scheduler: several independent pointwise computations in one kernel launch.

A Fusion whose exprs form K >= 2 disjoint connected components (exprs joined by the tensors they
read or write; scalars do not join them), each a pointwise computation of its own shape (a bf16
autocast's casts of every weight and bias), would be K pointwise kernels, K launches. This
scheduler makes it one: the kernel's blocks are split into consecutive ranges, one per component
(block b < B0 runs component 0, B0 <= b < B0 + B1 component 1 with block b - B0, ...), each range
running that component's pointwise body (codegen/horizontal_lowering.py).

`can_schedule(fusion)` (a function of the Fusion alone, cached on it): at least 2 components, at
most MAX_COMPONENTS, an upper bound of the kernel's parameter bytes within MAX_PARAM_BYTES
(CUDA's 4 KB limit; refusals for these two start with CAPACITY, the segmenter then packs the
components into several horizontal kernels), every fusion output computed by some expr, and each
component, seen as a Fusion of its own (its exprs, the tensors it reads, the outputs it computes:
no copy), taken by the pointwise scheduler alone, refused by the transpose scheduler, with no
view, permute or random op. Components are cut out as Fusions (segment/extract.py) once per
Fusion, when the first plan is made.

`schedule(fusion, inputs)`: each component is planned by the pointwise scheduler
(schedule/pointwise.py, its vector width, collapsing, heuristics) on its own sub-Fusion, as a
1-D schedule (one block size for every component; the 1-D / 2-D choice is speed only) with no
grid cap (a block per chunk: the block counts are computed from the sizes, in the kernel and in
the launch configuration). One index type for the kernel: 64-bit when any component needs it
(`size_class`, part of the kernel signature, since the outputs' sizes are not).

Invariant: every decision reads the facts of the layout signature (each component's decisions
are the pointwise scheduler's, on a subset of the inputs) plus `size_class`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import dump as D
from ..errors import SchedulerError
from ..ir import exprs as E
from ..ir.base import Scalar
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import layout as L
from ..ir.object_cache import cached_on

MAX_COMPONENTS = 128
MAX_PARAM_BYTES = 4096 - 256      # CUDA's classic kernel-parameter limit, less some slack
CAPACITY = "capacity: "           # prefix of the refusals that more kernels would fix
MAX_GRID_X = 2 ** 31 - 1
_CACHE = "_pyfuser_horizontal"    # Fusion attribute: dropped by any edit (ir/fusion.py)


@dataclass
class Component:
    exprs: list                 # the fusion's exprs of this component, topological order
    outputs: list               # indices into fusion.outputs of the outputs it computes
    inputs: list                # the fusion's tensors it reads (its tensor inputs), in order
    sub: object = None          # segment.extract.Extracted: its own Fusion (made at plan time)


class _View:
    """A component seen as a Fusion by the schedulers' compile checks (exprs, inputs, outputs
    of the fusion itself: no copy). Only for checks that read the graph, never for planning."""

    def __init__(self, exprs, inputs, outputs):
        self.exprs, self.inputs, self.outputs = exprs, inputs, outputs

    def used_exprs(self):
        return self.exprs

    def tensor_inputs(self):
        return self.inputs


# ---- components ------------------------------------------------------------------------------
def connected_components(fusion) -> list[list]:
    """The used exprs of `fusion` grouped into components, each in topological order, ordered
    by their first expr. Exprs are joined by a tensor one computes and another reads (a fusion
    input read by several joins nothing: each component reads it). A load-free value
    (segment/load_free.py: iotas, fulls and cheap ops of them) that the fusion does not return
    joins nothing either: each component reading it computes it, so components may share such
    exprs (Llama's positions, read by its masks and its rotary cos / sin). Scalar exprs (a
    slice's bounds) belong to none: the host computes them when the sizes are bound."""
    exprs = [e for e in fusion.used_exprs() if any(isinstance(o, TensorView) for o in e.outputs)]
    pos = {id(e): i for i, e in enumerate(exprs)}
    shared = _shared(exprs, {id(o) for o in fusion.outputs})
    joins = {id(o) for e in exprs if id(e) not in shared for o in e.outputs}
    parent = list(range(len(exprs)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict = {}
    for i, e in enumerate(exprs):
        if id(e) in shared:
            continue
        for v in list(e.inputs) + list(e.outputs):
            if not isinstance(v, TensorView) or id(v) not in joins:
                continue
            j = owner.setdefault(id(v), i)
            a, b = find(i), find(j)
            if a != b:
                parent[max(a, b)] = min(a, b)
    groups: dict = {}
    for i, e in enumerate(exprs):
        if id(e) not in shared:
            groups.setdefault(find(i), []).append(e)
    out = []
    for k in sorted(groups):
        found, stack = {}, [v for e in groups[k] for v in e.inputs]
        while stack:                      # the shared values this component reads, and theirs
            d = getattr(stack.pop(), "definition", None)
            if d is not None and id(d) in shared and id(d) not in found:
                found[id(d)] = d
                stack.extend(d.inputs)
        out.append(sorted(groups[k] + list(found.values()), key=lambda e: pos[id(e)]))
    return out


def _shared(exprs, returned) -> set:
    """ids of the exprs (topological order) computing load-free values the fusion does not
    return from load-free values of such exprs only (what a component may compute itself)."""
    from ..segment.load_free import load_free
    free, shared = load_free(exprs), set()
    for e in exprs:
        if id(e) in free and not any(id(o) in returned for o in e.outputs) and all(
                id(v.definition) in shared for v in e.inputs if isinstance(v, TensorView)):
            shared.add(id(e))
    return shared


def param_bytes_bound(inputs, outputs, n_scalars: int = 0) -> int:
    """An upper bound of the bytes of a component's kernel parameters: a pointer and a stride
    per axis of every tensor, a size per axis of the reference output, every scalar it reads;
    all 8 bytes (64-bit indexing)."""
    tensors = list(inputs) + list(outputs)
    return 8 * (sum(1 + t.ndim for t in tensors) + outputs[0].ndim + n_scalars)


def scalars_read(exprs) -> int:
    """How many non-constant scalars the exprs read (kernel parameters)."""
    return len({id(v) for e in exprs for v in e.inputs
                if isinstance(v, Scalar) and not v.is_const})


EXCLUDED = (E.ViewOp, E.PermuteOp, E.PhiloxUniformOp)


def excluded(exprs):
    """The first expr the horizontal scheduler never takes in a component, or None."""
    return next((e for e in exprs if isinstance(e, EXCLUDED)), None)


def _analyse(fusion):
    """(components, "") or (None, why not); a function of the Fusion's graph alone."""
    from . import pointwise, transpose
    if not fusion.outputs:
        return None, "the fusion has no outputs"
    groups = connected_components(fusion)
    if len(groups) < 2:
        return None, "one connected component (a pointwise or other single kernel)"
    if len(groups) > MAX_COMPONENTS:
        return None, f"{CAPACITY}{len(groups)} components, more than {MAX_COMPONENTS} in one kernel"
    of = {id(o): k for k, g in enumerate(groups) for e in g for o in e.outputs}
    comps = [Component(g, [], []) for g in groups]
    for oi, o in enumerate(fusion.outputs):
        k = of.get(id(o))
        if k is None:
            return None, f"output {o.name} is not computed in the fusion"
        comps[k].outputs.append(oi)
    total = 0
    for k, c in enumerate(comps):
        bad = excluded(c.exprs)
        if bad is not None:
            return None, f"component {k}: {bad.op_name} ({type(bad).__name__}) is not taken " \
                         "(views, permutes and random numbers stay in their own kernels)"
        produced = {id(o) for e in c.exprs for o in e.outputs}
        seen = set()
        for e in c.exprs:
            for v in e.inputs:
                if isinstance(v, TensorView) and id(v) not in produced and id(v) not in seen:
                    seen.add(id(v))
                    c.inputs.append(v)
        view = _View(c.exprs, c.inputs, [fusion.outputs[i] for i in c.outputs])
        ok, why = pointwise.can_schedule(view)
        if not ok:
            return None, f"component {k}: pointwise refuses it: {why}"
        if transpose.can_schedule(view)[0]:
            return None, f"component {k} is a transpose (the transpose scheduler's)"
        total += param_bytes_bound(view.inputs, view.outputs, scalars_read(c.exprs))
    if total > MAX_PARAM_BYTES:
        return None, f"{CAPACITY}kernel parameters may take {total} bytes, more than " \
                     f"{MAX_PARAM_BYTES}"
    return comps, ""


def components(fusion):
    """(components, "") or (None, reason), cached on the Fusion object."""
    return cached_on(fusion, _CACHE, _analyse)


def _extracted(fusion, comps) -> None:
    """Each component cut out as its own Fusion (segment/extract.py), once per Fusion."""
    from ..segment.extract import extract
    for c in comps:
        if c.sub is None:
            c.sub = extract(fusion, c.exprs, c.inputs, [fusion.outputs[i] for i in c.outputs])


def can_schedule(fusion) -> tuple[bool, str]:
    if len(fusion.exprs) < 2:
        return False, "one connected component (a pointwise or other single kernel)"
    comps, why = components(fusion)
    return comps is not None, why


# ---- checks at run time ----------------------------------------------------------------------
def _output_numels(fusion, inputs, bindings=None):
    b = bindings or bind(fusion, list(inputs))
    return [L.numel(b.shape(o)) for o in fusion.outputs]


def size_class(fusion, inputs) -> str:
    """The kernel's index type: 64-bit when any input's span or any output's size needs it (the
    base signature only sees output 0's)."""
    inputs = list(inputs)
    return "int64_t" if L.needs_int64(inputs, max(_output_numels(fusion, inputs))) else "int"


def run_check(fusion, inputs, bindings) -> tuple[bool, str]:
    blocks = sum(-(-n // 32) for n in _output_numels(fusion, inputs, bindings))
    if blocks > MAX_GRID_X:
        return False, f"{blocks} blocks of 32 threads exceed the grid's x limit"
    return True, ""


# ---- the schedule ----------------------------------------------------------------------------
@dataclass
class HorizontalParams:
    block: int = 128
    index_type: str = "int"
    min_blocks: int = 0
    components: list = field(default_factory=list)   # per component: its pointwise params dict

    def as_dict(self) -> dict:
        return {"components": len(self.components), "block": self.block,
                "index_type": self.index_type, "min_blocks": self.min_blocks,
                "per_component": self.components}


@dataclass
class HorizontalSchedule:
    fusion: object              # the user's fusion
    components: list            # Component
    schedules: list             # per component: its PointwiseSchedule (of the component's Fusion)
    params: HorizontalParams
    seg_of: list                # per component: its segment tensor index -> the fusion's
    inplace: dict = field(default_factory=dict)   # fusion output -> input index written in
                                                  # place (set by the lowering)


def _segment_map(fusion, comp) -> list:
    tensor_pos = {id(v): i for i, v in enumerate(fusion.tensor_inputs())}
    nin = len(fusion.tensor_inputs())
    sub_tensors = [orig for v, orig in zip(comp.sub.fusion.inputs, comp.sub.inputs)
                   if isinstance(v, TensorView)]
    return [tensor_pos[id(v)] for v in sub_tensors] + [nin + oi for oi in comp.outputs]


def schedule(fusion, inputs) -> HorizontalSchedule:
    from ..segment.extract import input_values
    from . import pointwise
    comps, why = components(fusion)
    if comps is None:
        raise SchedulerError(f"horizontal scheduler: {why}")
    inputs = list(inputs)
    b = bind(fusion, inputs)
    _extracted(fusion, comps)
    scheds = [pointwise.schedule(c.sub.fusion, input_values(fusion, c.sub, inputs, b), kind="1d")
              for c in comps]
    blocks = {s.params.block for s in scheds}
    if len(blocks) != 1:
        raise SchedulerError(f"horizontal scheduler: components want blocks {sorted(blocks)}")
    it = size_class(fusion, inputs)
    for s in scheds:
        s.params.index_type = it
        s.params.max_blocks = 0         # a block per chunk: the ranges are counted from sizes
    p0 = scheds[0].params
    params = HorizontalParams(p0.block, it, max(s.params.min_blocks for s in scheds),
                              [s.params.as_dict() for s in scheds])
    hs = HorizontalSchedule(fusion, comps, scheds, params, [_segment_map(fusion, c) for c in comps])
    D.dump("scheduler_params", "horizontal", lambda: describe(hs))
    return hs


def describe(hs: HorizontalSchedule) -> str:
    p = hs.params
    lines = [f"components={len(hs.components)} block={p.block} index={p.index_type}"]
    for k, (c, s) in enumerate(zip(hs.components, hs.schedules)):
        q = s.params
        outs = ", ".join(hs.fusion.outputs[i].name for i in c.outputs)
        lines.append(f"  [{k}] {', '.join(e.op_name for e in c.exprs)} -> {outs}: vec={q.vec} "
                     f"unroll={q.unroll} groups={q.groups} dropped={q.dropped}")
    return "\n".join(lines)
