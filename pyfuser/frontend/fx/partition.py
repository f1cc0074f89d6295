"""Partitioning an FX graph into fusible regions (the torch.compile backend's fusion groups).

`partition(nodes, supported) -> list[Region]` walks the graph in its (topological) order once.
A supported node joins the region of one of its operands when that keeps the region *convex*
(no path leaves the region and comes back into it, so the region can run as one call between
the nodes it needs and the nodes that need it); otherwise it starts a region of its own. A
getitem of a node's tuple result follows that node. Convexity is checked with, per node, the
set of regions among its ancestors (a bitset over region ids) and, per region, the regions it
needs (transitively, as a unit): joining region G is valid iff no operand outside G needs G.
Two regions n reads from merge when neither needs the other (a path from one to the other
through other units would make one need the other): siblings become one region. A node's
operands here (and in the sibling joins and the unit order) are its FX inputs and, for an op
that draws random numbers, the random op before it (rng_order.py): random ops, eager or in a
region, keep their graph order, so each draws the numbers eager's would.

After the walk, pointwise siblings that read a common tensor or feed one node join where that
delays no reader (sibling_joins.py). Afterwards each region is trimmed and kept only when worth
a call:
- reshapes and transposes at its output end stay in it, each a Python call fewer in the
  graph: the fusion returns them as host views of its kernel's outputs (the native runner's
  `as_strided`: a weight's cast and its `t()` under autocast, a hidden state's view to 2-D
  before a matmul); so do reshapes of row-major inputs at its input end (a matmul's 2-D
  result viewed back to 3-D: the fusion views it on the host). Other views at its ends
  (slices, selects, unsqueezes, expands; a reshape of an input that is not row-major in FX's
  example values) are left to FX, where eager views any layout and a kernel reading the
  strided view keeps its vectors, as are getitems of nodes left out;
- a region without a compute node (views only) is dissolved: eager views cost nothing;
- so is a region computing CUDA values from no CUDA tensor input (factory ops such as
  `rand(..., device="cuda")` and what follows them): a fusion runs where its inputs are; its
  factory op with no tensor input of fewest elements (a `scalar_tensor`, an `arange`, a
  `full`, also of SymInt sizes under dynamic shapes) is left to eager, and the rest stays a
  region that reads its value on the device (every such factory op, where one is not enough).

Last, regions that read nothing but the graph's inputs and compute only pointwise values (under
autocast: the casts of every weight and bias to the compute dtype, one tiny region per tensor)
are joined into one region per device (`_join_input_regions`): they need no other unit, so the
joined region runs first, as one call; the segmenter hands its independent parts to one
horizontal kernel where a scheduler takes them. Their results then live from the graph's start,
as eager autocast's cast cache keeps its casts for the whole autocast region. Likewise the
pointwise regions whose results only the graph returns (a backward graph's casts of weight
gradients to float32) join into one region, run once its last input is ready.

Invariants: regions are disjoint, convex and in graph order; every node of a region is
supported; the regions and the remaining nodes, topologically ordered as units, are a DAG
(over the operands above, random ops' links included).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .meta import has_format
from .mutations import is_input_copy
from .support import is_compute, is_getitem
from ..lowering.registry import FACTORY, METADATA, POINTWISE
from .support import op_class
from .rng_order import operands, rng_links
from .sibling_joins import absorb, merge_siblings_sharing_inputs


@dataclass
class Region:
    nodes: list                                  # in graph order
    inputs: list = field(default_factory=list)   # FX nodes read from outside, first-use order
    outputs: list = field(default_factory=list)  # region nodes read outside (or returned)

    def boundary(self) -> None:
        members = set(self.nodes)
        ins, seen = [], set()
        for n in self.nodes:
            for a in n.all_input_nodes:
                if a not in members and a not in seen:
                    seen.add(a)
                    ins.append(a)
        self.inputs = ins
        self.outputs = [n for n in self.nodes if any(u not in members for u in n.users)]


def partition(nodes, supported: set) -> list[Region]:
    group: dict = {}                 # node -> region id
    anc: dict = {}                   # node -> bitset of the regions of its strict ancestors
    rdep: dict = {}                  # region id -> bitset of the regions it needs, transitively
    members: dict = {}               # region id -> nodes
    position = {n: i for i, n in enumerate(nodes)}
    links = rng_links(nodes)         # random op -> the one before it (rng_order.py)
    next_id = 0

    def closure(bits: int) -> int:
        out, rest = bits, bits
        while rest:
            low = rest & -rest
            out |= rdep[low.bit_length() - 1]
            rest ^= low
        return out

    def unit_deps(y) -> int:
        """Regions the unit holding y (its region, or y alone) needs, transitively."""
        g = group.get(y)
        return (1 << g) | rdep[g] if g is not None else closure(anc.get(y, 0))

    for n in nodes:
        deps = operands(n, links)    # n's inputs and, for a random op, the one before it
        a = 0
        for x in deps:
            a |= anc.get(x, 0)
            g = group.get(x)
            if g is not None:
                a |= 1 << g
        anc[n] = a
        if n not in supported:
            continue
        ins = n.all_input_nodes
        chosen = None
        if is_getitem(n):
            chosen = group.get(n.args[0])
        else:
            for x in reversed(ins):
                g = group.get(x)
                if g is None or g == chosen:
                    continue
                # joining g keeps the units acyclic: no operand outside g needs g
                if all(group.get(y) == g or not (unit_deps(y) >> g) & 1 for y in deps):
                    chosen = g
                    break
        if chosen is None:
            if is_getitem(n):
                continue
            chosen = next_id
            next_id += 1
            members[chosen] = []
            rdep[chosen] = 0
        group[n] = chosen
        members[chosen].append(n)
        if not is_getitem(n):
            # an operand's region that neither needs nor is needed by the chosen one (siblings
            # n joins) merges into it: one region call, one kernel where the shapes agree
            for x in ins:
                h = group.get(x)
                if h is None or h == chosen or (rdep[chosen] >> h) & 1 or \
                        (rdep[h] >> chosen) & 1 or any((unit_deps(y) >> h) & 1 for y in deps
                                                       if group.get(y) not in (h, chosen)):
                    continue
                absorb(members, group, rdep, chosen, h)
            members[chosen].sort(key=position.__getitem__)
        need = 0
        for y in deps:
            if group.get(y) != chosen:
                need |= unit_deps(y)
        need &= ~(1 << chosen)
        if need & ~rdep[chosen]:
            rdep[chosen] |= need
            bit = 1 << chosen
            for r in rdep:                      # regions needing this one need its needs too
                if rdep[r] & bit:
                    rdep[r] |= rdep[chosen]
    merge_siblings_sharing_inputs(members, group, rdep, position, links)
    regions = []
    for g in sorted(members):
        kept = _trim(sorted(members[g], key=position.__getitem__))
        r = _region_of(kept)
        if r is not None and not _runs_where_it_computes(r):
            r = _anchored(kept)
        if r is not None and _runs_where_it_computes(r):
            regions.append(r)
    return _join_input_regions(regions, position)


def _anchored(kept: list):
    """A region of `kept` (which computes device values from no device tensor) that runs on the
    device: one factory op with no tensor input (the one of fewest elements: HF's masks have
    0-dim `scalar_tensor`s) is left to eager, which makes its value there, and the region reads
    it (a region holding HF Llama's whole mask computation, load-free from its aranges on, had
    its 4 aranges and 8 scalar_tensors run as eager kernels). Where that is not enough, every
    such factory op is left to eager. None when no compute node remains."""
    factories = [n for n in kept if not _reads_tensor(n) and op_class(n) == FACTORY
                 and isinstance(n.meta.get("val"), torch.Tensor)]
    if factories:
        one = min(factories, key=lambda n: _numel_hint(n.meta["val"]))
        r = _region_of(_trim([n for n in kept if n is not one]))
        if r is not None and _runs_where_it_computes(r):
            return r
    return _region_of(_trim([n for n in kept if _reads_tensor(n) or op_class(n) != FACTORY]))


def _region_of(nodes: list):
    """The Region of `nodes` (inputs and outputs found), None when no compute node is there."""
    if not any(is_compute(n) for n in nodes):
        return None
    r = Region(nodes)
    r.boundary()
    return r


def _numel_hint(v: torch.Tensor) -> int:
    """Elements of v; a symbolic count as large as any (`int()` of a SymInt would answer its
    hint but guard on it, specializing a dynamic-shape graph to the example's size)."""
    n = v.numel()
    return n if type(n) is int else 1 << 62


def _reads_tensor(node) -> bool:
    """Whether a node reads a tensor (an `arange` of a SymInt size reads a node, no tensor)."""
    return any(isinstance(x.meta.get("val"), torch.Tensor) for x in node.all_input_nodes)


def _runs_where_it_computes(region: Region) -> bool:
    """A fusion runs on the device of its tensor inputs: a region computing CUDA values from no
    CUDA tensor (`torch.rand(n, device="cuda") * 2`) is left to eager, which makes them there."""
    devices = {v.device for v in (n.meta.get("val") for n in region.nodes)
               if isinstance(v, torch.Tensor) and v.device.type != "cpu"}
    if not devices:
        return True
    ins = {v.device for v in (x.meta.get("val") for x in region.inputs)
           if isinstance(v, torch.Tensor)}
    return devices <= ins


def _pointwise_device(region: Region):
    """The one device of a region that computes only pointwise values, else None (the copy_ of
    a mutated input writes its value: pointwise too)."""
    if not all(is_getitem(n) or is_input_copy(n) or op_class(n) in (POINTWISE, METADATA)
               for n in region.nodes):
        return None
    devices = {v.device for v in (n.meta.get("val") for n in region.nodes)
               if isinstance(v, torch.Tensor)}
    return devices.pop() if len(devices) == 1 else None


def _graph_input(x) -> bool:
    """A graph input, or a view of one (views of views included)."""
    while x.op == "call_function" and op_class(x) == METADATA and x.args and \
            isinstance(x.args[0], torch.fx.Node):
        x = x.args[0]
    return x.op in ("placeholder", "get_attr")


def _join_kind(region: Region):
    """("inputs", device) for a pointwise region that reads only graph inputs (or views of
    them); ("outputs",
    device) for one whose results only the graph returns (in a backward graph under autocast:
    each weight gradient's cast to float32); None for any other."""
    device = _pointwise_device(region)
    if device is None:
        return None
    if all(_graph_input(x) for x in region.inputs):
        return ("inputs", device)
    if all(u.op == "output" for o in region.outputs for u in o.users):
        return ("outputs", device)
    return None


def _join_input_regions(regions: list, position: dict) -> list:
    """One region per device and kind (`_join_kind`) for two or more regions of that kind.
    Convex: nothing outside a joined region reads into it (inputs: it needs no other unit) or
    out of it (outputs: only the graph's output reads it), so the units stay a DAG; the one of
    the inputs runs first, the one of the outputs once its last input is ready."""
    groups: dict = {}
    for r in regions:
        k = _join_kind(r)
        if k is not None:
            groups.setdefault(k, []).append(r)
    joined = {id(r) for rs in groups.values() if len(rs) > 1 for r in rs}
    if not joined:
        return regions
    out = [r for r in regions if id(r) not in joined]
    for rs in groups.values():
        if len(rs) > 1:
            r = Region(sorted((n for x in rs for n in x.nodes), key=position.__getitem__))
            r.boundary()
            out.append(r)
    out.sort(key=lambda r: position[r.nodes[0]])
    return out


# Views that stay in a region at its ends (module docstring): at the output end the pure
# relayouts a host view gives (`as_strided` of the kernel's output), at the input end the
# reshapes of a row-major input (the fusion views it on the host). Other views (slices, selects,
# unsqueezes, expands) at either end stay FX's: inside a kernel their index shifts cost the
# vectors a strided input keeps (a rotary embedding's halves).
_OUTPUT_END_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default",
                               "aten.reshape.default", "aten.t.default", "aten.transpose.int",
                               "aten.permute.default"})
_INPUT_END_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default",
                              "aten.reshape.default"})


def _trim(nodes: list) -> list:
    """Drop the views at the region's ends that it does not keep (and getitems whose source is
    dropped) until none is left (module docstring, _OUTPUT_END_VIEWS / _INPUT_END_VIEWS). A
    chain of views at the output end stays only if each of them may: one that may not is
    dropped with the views after it."""
    kept = list(nodes)
    while True:
        members = set(kept)
        out_end: set = set()                 # views whose every path out leaves through views
        grew = True
        while grew:
            grew = False
            for n in kept:
                if n not in out_end and op_class(n) == METADATA and \
                        all(u not in members or u in out_end for u in n.users):
                    out_end.add(n)
                    grew = True
        drop = set()
        for n in kept:
            if op_class(n) != METADATA:
                continue
            if n in out_end and str(n.target) not in _OUTPUT_END_VIEWS:
                todo = [n]                   # it and the views after it (reading the region
                while todo:                  # again through FX would make a cycle)
                    m = todo.pop()
                    if m not in drop:
                        drop.add(m)
                        todo.extend(u for u in m.users if u in out_end)
            elif all(a not in members for a in n.all_input_nodes) and not (
                    str(n.target) in _INPUT_END_VIEWS and _row_major_input(n)):
                drop.add(n)
        drop |= {n for n in kept if is_getitem(n) and n.args[0] not in members}
        if not drop:
            return kept
        kept = [n for n in kept if n not in drop]


def _row_major_input(n) -> bool:
    """Whether the tensor a view reads (its first argument; sizes may be SymInt nodes) is
    row-major in FX's example values (size hints: no guard is added)."""
    x = n.args[0] if n.args else None
    v = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    return isinstance(v, torch.Tensor) and has_format(v, torch.contiguous_format)


def unit_order(nodes, regions) -> list:
    """Graph nodes and regions in one topological order (each region as one unit, placed
    where its last input is available; ties keep graph order). A random op's operands include
    the random op before it (rng_order.py): random ops, eager or fused, draw in graph order."""
    owner = {n: r for r in regions for n in r.nodes}
    pos = {n: i for i, n in enumerate(nodes)}
    units, key = [], {}
    for n in nodes:
        r = owner.get(n)
        u = n if r is None else r
        if id(u) not in key:
            key[id(u)] = len(units)
            units.append(u)
    deps = []
    links = rng_links(nodes)
    for u in units:
        inner = u.nodes if not isinstance(u, torch.fx.Node) else [u]
        d = set()
        for n in inner:
            for x in operands(n, links):
                ux = owner.get(x, x)
                if ux is not u:
                    d.add(key[id(ux)])
        deps.append(d)
    first = [min(pos[n] for n in (u.nodes if not isinstance(u, torch.fx.Node) else [u]))
             for u in units]
    import heapq
    indeg = [len(d) for d in deps]
    users: list = [[] for _ in units]
    for k, d in enumerate(deps):
        for j in d:
            users[j].append(k)
    ready = [(first[k], k) for k in range(len(units)) if indeg[k] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, k = heapq.heappop(ready)
        out.append(units[k])
        for j in users[k]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(ready, (first[j], j))
    assert len(out) == len(units), "the regions make the graph cyclic"
    return out
