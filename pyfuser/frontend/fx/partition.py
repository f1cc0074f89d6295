"""Partitioning an FX graph into fusible regions (the torch.compile backend's fusion groups).

`partition(nodes, supported) -> list[Region]` walks the graph in its (topological) order once.
A supported node joins the region of one of its operands when that keeps the region *convex*
(no path leaves the region and comes back into it, so the region can run as one call between
the nodes it needs and the nodes that need it); otherwise it starts a region of its own. A
getitem of a node's tuple result follows that node. Convexity is checked with, per node, the
set of regions among its ancestors (a bitset over region ids) and, per region, the regions it
needs (transitively, as a unit): joining region G is valid iff no operand outside G needs G.
Two regions n reads from merge when neither needs the other (a path from one to the other
through other units would make one need the other): siblings become one region.

Afterwards each region is trimmed and kept only when worth a call:
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
supported; the regions and the remaining nodes, topologically ordered as units, are a DAG.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .meta import has_format
from .mutations import is_input_copy
from .support import is_compute, is_getitem
from ..lowering.registry import FACTORY, METADATA, POINTWISE
from .support import op_class


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
        a = 0
        for x in n.all_input_nodes:
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
                if all(group.get(y) == g or not (unit_deps(y) >> g) & 1 for y in ins):
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
                        (rdep[h] >> chosen) & 1 or any(
                            (unit_deps(y) >> h) & 1 for y in ins if group.get(y) not in (h, chosen)):
                    continue
                _absorb(members, group, rdep, chosen, h)
            members[chosen].sort(key=position.__getitem__)
        need = 0
        for y in ins:
            if group.get(y) != chosen:
                need |= unit_deps(y)
        need &= ~(1 << chosen)
        if need & ~rdep[chosen]:
            rdep[chosen] |= need
            bit = 1 << chosen
            for r in rdep:                      # regions needing this one need its needs too
                if rdep[r] & bit:
                    rdep[r] |= rdep[chosen]
    _merge_siblings_sharing_inputs(members, group, rdep, position)
    regions = []
    for g in sorted(members):
        kept = _trim(sorted(members[g], key=position.__getitem__))
        if any(is_compute(n) for n in kept):
            r = Region(kept)
            r.boundary()
            if not _runs_where_it_computes(r):
                r = _anchored(kept)
                if r is None:
                    continue
            if _runs_where_it_computes(r):
                regions.append(r)
    return _join_input_regions(regions, position)


def _absorb(members: dict, group: dict, rdep: dict, keep: int, gone: int) -> None:
    """Region `gone` joins region `keep` (neither needs the other): its nodes move, `keep` needs
    what either needed, and every region that needed either now needs `keep` and its needs
    (`gone`'s bit stays in the maps as an alias: its rdep is keep's and keep's own bit)."""
    for m in members.pop(gone):
        group[m] = keep
        members[keep].append(m)
    rdep[keep] |= rdep[gone]
    rdep[gone] = rdep[keep] | (1 << keep)
    for r in rdep:
        if (rdep[r] >> gone) & 1 or (rdep[r] >> keep) & 1:
            rdep[r] |= (1 << keep) | rdep[keep]


def _pointwise_unit(nodes) -> bool:
    return all(is_getitem(n) or (op_class(n) in (POINTWISE, METADATA, FACTORY)
                                 and not is_input_copy(n)) for n in nodes)


def _merge_siblings_sharing_inputs(members: dict, group: dict, rdep: dict, position: dict) -> None:
    """Join pointwise regions on one device that read a common tensor no region of theirs
    computes, or whose results one node reads, where neither needs the other and the join delays
    no reader: each region's first reader outside it comes after the other's last input is
    ready (`_ready_positions`: when the unit computing it can run). The walk joins
    siblings only through a node reading both; Llama's rotary embeddings of q and k (separate
    matmuls' results, both read the cos / sin a first layer computed) were two regions, two
    kernels, in every layer but the first, where the cos / sin computation's region held both;
    the copy of v for grouped-query attention (repeat_kv) a third, all three read by the
    attention. Joined, the segmenter hands the
    components to one horizontal kernel (or keeps them apart where no scheduler takes them
    together: one region call either way). In place on the walk's maps."""
    inf = len(position)

    def outside_inputs(g) -> set:
        ms = set(members[g])
        return {x for n in members[g] for x in n.all_input_nodes if x not in ms}

    def first_reader(g) -> int:
        ms = set(members[g])
        return min((position.get(u, inf) for n in members[g] for u in n.users if u not in ms),
                   default=inf)

    ready = _ready_positions(members, position)

    def last_input(g) -> int:
        """When g's inputs exist in a unit order: an input's position, or later where it waits
        for a region (one whose last input comes later) through its producers."""
        return max((ready.get(x, -1) for x in outside_inputs(g)), default=-1)

    def readers(g) -> set:
        """The call nodes outside g that read it (not the graph's output)."""
        ms = set(members[g])
        return {u for n in members[g] for u in n.users if u not in ms and u.op == "call_function"}

    def shared(x) -> bool:
        v = x.meta.get("val")
        return isinstance(v, torch.Tensor) and v.ndim > 0

    def devices(g) -> set:
        return {v.device for v in (n.meta.get("val") for n in members[g])
                if isinstance(v, torch.Tensor)}

    order = sorted(members, key=lambda g: min(position[n] for n in members[g]))
    rank = {g: k for k, g in enumerate(order)}
    facts: dict = {}                 # region id -> (pointwise, inputs, readers, devices)

    def fact(g):
        if g not in facts:
            facts[g] = (_pointwise_unit(members[g]), outside_inputs(g), readers(g), devices(g))
        return facts[g]

    # candidates through the indexes (a pair passing the sharing test has a shared input or
    # a reader in common): regions by the shared inputs and by the readers they have
    by_input: dict = {}
    by_reader: dict = {}
    for g in order:
        pw, ins, rds, _ = fact(g)
        if not pw:
            continue
        for x in ins:
            if shared(x):
                by_input.setdefault(x, set()).add(g)
        for u in rds:
            by_reader.setdefault(u, set()).add(g)

    def partners(g, after: int) -> list:
        _, ins, rds, _ = fact(g)
        c = {h for x in ins if shared(x) for h in by_input.get(x, ())}
        c.update(h for u in rds for h in by_reader.get(u, ()))
        return sorted((h for h in c if h in members and rank[h] > after), key=rank.__getitem__)

    for g in order:
        if g not in members or not fact(g)[0]:
            continue
        after = rank[g]
        todo = partners(g, after)
        while todo:
            h = todo.pop(0)
            after = rank[h]
            if h not in members or not fact(h)[0] or (rdep[g] >> h) & 1 or (rdep[h] >> g) & 1:
                continue
            if fact(g)[3] != fact(h)[3]:       # a fusion runs on one device (one node reading
                continue                       # a CPU index and a CUDA tensor reads both)
            if first_reader(g) < last_input(h) or first_reader(h) < last_input(g):
                continue
            _, ins_h, rds_h, _ = fact(h)
            _absorb(members, group, rdep, g, h)
            members[g].sort(key=position.__getitem__)
            # the joined region runs once both halves' inputs exist (no later than any reader
            # of either: the check above), so only its own nodes' ready positions move
            at = max(ready[m] for m in members[g])
            for m in members[g]:
                ready[m] = at
            for x in ins_h:
                by_input.get(x, set()).discard(h)
            for u in rds_h:
                by_reader.get(u, set()).discard(h)
            facts.pop(h)
            facts.pop(g)
            for x in fact(g)[1]:
                if shared(x):
                    by_input.setdefault(x, set()).add(g)
            for u in fact(g)[2]:
                by_reader.setdefault(u, set()).add(g)
            todo = partners(g, after)


def _ready_positions(members: dict, position: dict) -> dict:
    """node -> the position from which its value exists in a unit order: an eager node's own
    position, raised to its inputs'; a region's nodes', the latest of the region's outside
    inputs' (a region runs as one unit, once its last input exists). One post-order walk over
    the units (they form a DAG)."""
    owner = {m: g for g, ms in members.items() for m in ms}

    def unit(n):
        g = owner.get(n)
        return ("r", g) if g is not None else ("n", n)

    def inputs(u):
        if u[0] == "n":
            return u[1].all_input_nodes
        ms = members[u[1]]
        return [x for m in ms for x in m.all_input_nodes if owner.get(x) != u[1]]

    at: dict = {}
    for n in sorted(position, key=position.__getitem__):
        root = unit(n)
        if root in at:
            continue
        stack = [(root, False)]
        while stack:
            u, expanded = stack.pop()
            if u in at:
                continue
            if not expanded:
                stack.append((u, True))
                stack.extend((unit(x), False) for x in inputs(u)
                             if x in position and unit(x) not in at)
                continue
            base = position[u[1]] if u[0] == "n" else -1
            at[u] = max([base] + [at[unit(x)] for x in inputs(u) if x in position])
    return {n: at[unit(n)] for n in position}


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
    where its last input is available; ties keep graph order)."""
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
    for u in units:
        inner = u.nodes if not isinstance(u, torch.fx.Node) else [u]
        d = set()
        for n in inner:
            for x in n.all_input_nodes:
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
