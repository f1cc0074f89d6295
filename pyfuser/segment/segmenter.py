"""The segmenter: a Fusion -> the fewest segments that schedulers accept (a SegmentedFusion).

    sf = segment(fusion)        # cached on the Fusion; it depends on the Fusion, not on sizes

1. Metadata ops at the fusion's edges become host segments (host.py): no kernel, views only.
2. The remaining (compute) exprs are offered to the kernel schedulers as one group: the scheduler
   registry (schedule/registry.py) names the first scheduler, in its priority order, whose
   compile check takes it.
3. If none takes the group, it is cut: every expr starts as its own group (kernel-able if some
   scheduler takes it alone, else eager; asked only when the merging below first needs to know),
   then groups joined by the heaviest edges (estimated
   bytes of the tensor between them) are merged first, while the union stays acceptable and the
   group graph stays acyclic; so what remains cut are the lightest edges. Groups of views /
   permutes only join after that (`_only_reshapes`), so a reshape never pulls a compute op
   away from the kernel it would join; one that joined a kernel as its last step leaves it
   again when the rest schedules alone (peel.py). A group no scheduler
   takes alone (a broadcast between two reductions) joins a kernel group when some scheduler
   takes the union; eager groups merge with eager groups. Then kernel groups that read a
   common tensor and do not depend on each other join when one scheduler takes the union
   (merges.py `merge_siblings`); then pointwise groups that do not depend on each other join
   into horizontal kernels (`merge_horizontal`; a fusion of independent pointwise computations of
   different shapes is taken whole by the horizontal scheduler in step 2 already, unless it
   exceeds one kernel's capacity). Before those two, every kernel group that reads a load-free
   value (an iota, a full, cheap ops of them: positions) computes it itself, and a kernel or a
   group of host views that only made it for others disappears (load_free.py): the groups that
   read the positions no longer depend on one kernel, so they can join.
   Last, a tensor a kernel group writes for other kernel groups is recomputed in its readers
   when its producers are cheap pointwise ops of the fusion's inputs and that moves fewer bytes
   (recompute.py: a layer norm backward's x_hat in its dx kernel); then two kernel groups, one
   reading the other, that were kept apart join where a scheduler takes them now
   (merges.py `merge_again`: a path between them through a third group that has since
   recomputed what it read is no cycle any more).
4. A group no scheduler takes that holds only metadata exprs (a view between two kernels: a
   bias gradient's sum over the rows of a reshaped kernel output) runs on the host as views
   (`_views_on_host`), not as an eager segment. Groups are put in a dependency order (Kahn,
   ties by first expr), neighbouring host exprs are joined into one host segment.
5. What was cut is kept for `pyfuser explain`: `sf.split_reason` (why no scheduler took the
   compute exprs as one group) and `sf.cuts`, one `Cut` per tensor between two final groups
   with the reason they stay apart (the last merge pass tried every remaining edge).

`PYFUSER_DUMP=segmenter_logging` prints each scheduler's verdict on each group offered;
`PYFUSER_DUMP=segmented_fusion` prints the result.

Invariants: see segmented_fusion.py (valid run order, every needed expr in one segment). A
Fusion that is one kernel with no host exprs keeps the original Fusion as the kernel's program.
"""
from __future__ import annotations

import weakref

from .. import dump as D
from ..ir import exprs as E
from ..ir.tensor import TensorView
from .extract import extract
from .groups import Groups
from .host import HOST_RUNNERS, host_exprs, host_layout
from .load_free import forward_load_free
from .merges import join, merge_again, merge_horizontal, merge_siblings
from .peel import peel_output_views
from .recompute import recompute_producers
from .segmented_fusion import Cut, Segment, SegmentedFusion
from ..ir.object_cache import ObjectCache

_ATTR = "_pyfuser_segmented"
_segmented: "weakref.WeakSet" = weakref.WeakSet()   # fusions holding a cached segmentation
SYMBOLIC_EXTENT_GUESS = 1024     # an unknown extent counts as this many elements for edge weights


def segment(fusion) -> SegmentedFusion:
    holder = fusion.__dict__.get(_ATTR)
    if holder is None or holder.value is None:
        sf = _segment(fusion)
        fusion.__dict__[_ATTR] = ObjectCache(sf)
        _segmented.add(fusion)
        D.dump("segmented_fusion", "segments", lambda: str(sf))
        return sf
    return holder.value


def adopt(fusion, sf: SegmentedFusion) -> None:
    """Make `sf` the cached segmentation of `fusion` (a SegmentedFusion made for this very
    Fusion by an earlier process and loaded with it: runtime/plan_store.py)."""
    if sf.fusion is not fusion:
        raise ValueError("segmenter.adopt: the segmentation belongs to another Fusion")
    fusion.__dict__[_ATTR] = ObjectCache(sf)
    _segmented.add(fusion)


def forget_all() -> None:
    """Drop every cached segmentation (and with it the segments' executors)."""
    for fusion in list(_segmented):
        fusion.__dict__.pop(_ATTR, None)
    _segmented.clear()


def _offer(fusion, groups: Groups, exprs, orders, copies=frozenset()):
    """(scheduler, Extracted) of the first scheduler taking `exprs` (`copies`: the ids of those
    that are recomputed copies, see Groups.boundary), or (None, reasons)."""
    from ..schedule import registry
    ins, outs = groups.boundary(exprs, copies)
    ex = extract(fusion, exprs, ins, outs, orders, groups.index)
    what = (f"{', '.join(e.op_name for e in exprs)} "
            f"({', '.join(v.name for v in ins)} -> {', '.join(v.name for v in outs)})")
    from ..schedule.tail import NAME as TAIL
    exclude = excluded(fusion)
    if lookups_apart(fusion) and holds_lookup(exprs):
        exclude = exclude + registry.REDUCTION_NAMES + (TAIL,)
    if PICKS_APART in exclude:
        exclude = exclude + (TAIL,)         # (its head would be planned without the exclusion)
        from ..schedule.reduction import pure_by_picks
        if pure_by_picks(ex.fusion):
            exclude = exclude + ("reduction",)
    name, why = registry.accepting(ex.fusion, what, exclude)
    return (name, ex) if name is not None else (None, why)


EXCLUDE_ATTR = "_pyfuser_exclude_schedulers"
# an entry of EXCLUDE_ATTR: the reduction scheduler takes no group that is a pure reduction only
# through its picks (split.py: one it refused at plan time, laid out by columns)
PICKS_APART = "reduction of picks"
LOOKUPS_APART_ATTR = "_pyfuser_lookups_apart"


def excluded(fusion) -> tuple:
    """Schedulers this Fusion's segmentation must not use (split.py: a copy of a segment whose
    scheduler refused the segment's sizes at plan time)."""
    return fusion.__dict__.get(EXCLUDE_ATTR, ())


def lookups_apart(fusion) -> bool:
    """Whether no reduction scheduler may take a group of this Fusion that holds a lookup
    (split.py: a copy of a reduction segment whose lookup the run check refused; the lookups
    then run as pointwise kernels of their own)."""
    return bool(fusion.__dict__.get(LOOKUPS_APART_ATTR))


def holds_lookup(exprs) -> bool:
    """Whether `exprs` hold a lookup (gather, index_select / embedding)."""
    return any(isinstance(e, (E.GatherOp, E.IndexSelectOp)) for e in exprs)


def _bytes(tv) -> int:
    n = tv.dtype.itemsize
    for d in tv.logical:
        size = d.known_size()
        n *= (SYMBOLIC_EXTENT_GUESS if size is None else size) if not d.is_broadcast or \
            d.expanded_extent is not None else 1
    return n


def _only_reshapes(members) -> bool:
    """A group of views / permutes only: joined after the compute groups are (a reshape between
    a kernel and a reduction over the reshaped axes would otherwise join the kernel first and
    keep it from its neighbours; left alone it runs as a host view between them)."""
    return all(isinstance(e, (E.ViewOp, E.PermuteOp)) for e in members)


CYCLE_REASON = "joining them would make a cycle (a path between them runs through another segment)"


def _partition(fusion, compute, all_exprs, orders, notes: dict) -> list:
    """[(exprs, scheduler or None, Extracted or reason)] covering `compute`; `notes` gets
    "split_reason" and "cuts" (see the module docstring) when the exprs are cut."""
    groups = Groups(fusion, compute, all_exprs)
    sched, res = _offer(fusion, groups, compute, orders)
    if sched is not None:
        return [(compute, sched, res, [])]
    notes["split_reason"] = res
    # each group's verdict alone, offered when first needed: an expr whose neighbour is a kernel
    # joins it through the union's offer, its own is never made (a third of the singles of
    # Llama's training graphs). A single's verdict depends on its expr alone, so when it is made
    # does not change it; the ones not needed in the loop are made after it.
    verdict = {}

    def alone(g):
        v = verdict.get(g)
        if v is None:
            v = verdict[g] = _offer(fusion, groups, groups.members[g], orders)
        return v
    changed, reshapes = True, False
    # unions no scheduler took (the ids of their exprs) -> why: the verdict of a union depends on
    # its exprs alone, so one refused is not offered again
    refused: dict = {}
    while changed or not reshapes:
        if not changed:                   # compute groups are joined: now the reshapes too
            reshapes = True
        changed = False
        edges, apart = [], {}             # apart: (a, b) -> why they stayed apart in this pass
        for g in list(groups.members):
            for e in groups.members[g]:
                for o in e.outputs:
                    for u in getattr(o, "uses", []):
                        h = groups.of.get(id(u))
                        if h is not None and h != g:
                            edges.append((-_bytes(o), g, h, o))
        for _, a, b, _ in sorted(edges, key=lambda t: (t[0], t[1], t[2])):
            if a not in groups.members or b not in groups.members:
                continue
            if not reshapes and (_only_reshapes(groups.members[a]) or
                                 _only_reshapes(groups.members[b])):
                continue
            if groups.reaches(a, b, True) or groups.reaches(b, a, True):
                apart[(a, b)] = CYCLE_REASON
                continue
            union = groups.sorted_exprs(groups.members[a] + groups.members[b])
            if alone(a)[0] is not None or alone(b)[0] is not None:
                # a kernel takes what it can: the union must schedule
                key = frozenset(id(e) for e in union)
                if key in refused:        # offered before (another tensor between the same
                    apart[(a, b)] = refused[key]     # groups, or an earlier pass): refused
                    continue
                result = _offer(fusion, groups, union, orders)
                if result[0] is None:
                    apart[(a, b)] = refused[key] = "no scheduler takes them together: " + \
                        result[1]
                    continue
            else:                         # eager joins eager
                result = (None, verdict[a][1])
            join(groups, verdict, a, b, result)
            changed = True
    for g in groups.members:
        alone(g)
    peel_output_views(groups, verdict, orders,
                      lambda exprs: _offer(fusion, groups, exprs, orders))
    first = {g: members[0] for g, members in groups.members.items()}
    offer = lambda exprs, copies: _offer(fusion, groups, exprs, orders, copies)  # noqa: E731
    forward_load_free(fusion, groups, verdict, offer)
    merge_siblings(groups, verdict, offer, _bytes)
    merge_horizontal(groups, verdict, offer)
    recompute_producers(fusion, groups, verdict, orders, offer, _bytes)
    merge_again(groups, verdict, offer, _bytes, refused)
    seen = set()                          # the last pass merged nothing: its edges are the cuts
    for nb, a, b, o in edges:
        why = apart.get((a, b), "")
        # siblings joined since: a group is found again through its first expr
        a, b = groups.of[id(first[a])], groups.of[id(first[b])]
        if a == b or groups.of.get(id(o.definition)) != a or \
                id(o.definition) in groups.extra_ids(b):
            continue                      # joined since, or recomputed by the reader: no cut
        if (id(o), a, b) not in seen:
            seen.add((id(o), a, b))
            notes["cuts"].append(Cut(o, groups.members[a], groups.members[b], -nb, why))
    out = []
    for g, members in groups.members.items():
        sched, res = verdict[g]
        if sched is None:
            ins, outs = groups.boundary(members)
            res = (extract(fusion, members, ins, outs, orders, groups.index), res)
        out.append((groups.exprs_of(g), sched, res, groups.extra.get(g, [])))
    return out


# ---- the whole pass ---------------------------------------------------------------------------
def _segment(fusion) -> SegmentedFusion:
    all_exprs = [e for e in fusion.used_exprs()
                 if any(isinstance(o, TensorView) for o in e.outputs)]
    host = host_exprs(fusion, all_exprs)
    orders = host_layout(fusion, all_exprs, host)
    compute = [e for e in all_exprs if id(e) not in host]
    # units: (kind, exprs, scheduler, Extracted or (Extracted, reason), recomputed copies)
    units = [("host", [e], None, None, []) for e in all_exprs if id(e) in host]
    notes = {"split_reason": "", "cuts": []}
    if compute:
        for members, sched, res, extra in _partition(fusion, compute, all_exprs, orders, notes):
            if _views_on_host(sched, members):
                units += [("host", [e], None, None, []) for e in members]
                continue
            units.append(("kernel" if sched else "eager", members, sched, res, extra))
    from ..runtime.executor import note_fallback
    segments = []
    for kind, members, sched, res, extra in _run_order(units, all_exprs):
        if kind == "host" and segments and segments[-1].kind == "host":
            last = segments[-1]
            last.exprs.append(members[0])
            _host_boundary(last, fusion)
            continue
        if kind == "host":
            seg = Segment("host", list(members), [], [])
            _host_boundary(seg, fusion)
        elif kind == "kernel":
            seg = Segment("kernel", members, list(res.inputs), list(res.outputs), sched,
                          res.fusion, list(res.inputs),
                          recomputed=[e for e in members if any(e is x for x in extra)])
            res.fusion.kernel_scheduler = sched
        else:
            ex, reason = res
            seg = Segment("eager", members, list(ex.inputs), list(ex.outputs), None, ex.fusion,
                          list(ex.inputs), reason)
            note_fallback(reason, "segment " + ", ".join(e.op_name for e in members))
        segments.append(seg)
    kernels = [s for s in segments if s.kind != "host"]
    if len(kernels) == 1 and len(segments) == 1 and kernels[0].kind == "kernel" and \
            len(kernels[0].outputs) == len(fusion.outputs) and \
            all(a is b for a, b in zip(kernels[0].outputs, fusion.outputs)):
        # the whole fusion is one kernel: run the user's Fusion itself (no copy, same executor)
        kernels[0].fusion, kernels[0].sub_inputs = fusion, list(fusion.inputs)
        kernels[0].inputs = list(fusion.inputs)
        fusion.kernel_scheduler = kernels[0].scheduler
    elif getattr(fusion, "aliases", None):
        _kernel_aliases(fusion, segments)
    return SegmentedFusion(fusion, segments, notes["cuts"], notes["split_reason"])


def _views_on_host(sched, members) -> bool:
    """A group no scheduler took whose exprs are all metadata (views, permutes, broadcasts,
    squeezes, expands): torch runs them as views of the kernel output they read, as the
    evaluator would, and a host segment keeps the fusion's calls replayable."""
    return sched is None and all(type(e) in HOST_RUNNERS for e in members)


def _kernel_aliases(fusion, segments) -> None:
    """In-place outputs (fusion.aliases, output -> input) a kernel segment may write into their
    input itself: the segment computes the output and is the only segment that reads the input.
    They become aliases of the segment's own Fusion, which its kernel plan may honour
    (codegen.api: KernelPlan.inplace); every other one, and any the plan declines, is copied into
    its input after the last segment (segment/runtime.apply_aliases). An input no segment reads
    (a mutated input the new value does not depend on: `buf.copy_(x * 2)`) becomes an unread
    input of the writer's Fusion, so that its kernel can be handed it as the output."""
    for out, inp in fusion.aliases.items():
        writer = next((s for s in segments if s.kind == "kernel" and
                       any(o is out for o in s.outputs)), None)
        if writer is None or any(s is not writer and any(v is inp for v in s.inputs)
                                 for s in segments):
            continue
        k = next((i for i, v in enumerate(writer.inputs) if v is inp), None)
        if k is None:
            k = _add_unread_input(writer, inp)
            if k is None:
                continue
        j = next(i for i, o in enumerate(writer.outputs) if o is out)
        writer.fusion.aliases[writer.fusion.outputs[j]] = writer.fusion.inputs[k]


def _add_unread_input(seg, inp):
    """Add a tensor input like `inp` (dtype, broadcast axes, contiguity, stride order) to the
    kernel segment's Fusion, fed by `inp`, after its other tensor inputs (a sub-Fusion lists its
    tensor inputs first); its index, or None for an input with expanded axes (never handed out
    as an output)."""
    from ..ir import builder as B
    if any(d.expanded_extent is not None for d in inp.logical) or \
            len(seg.inputs) != len(seg.fusion.inputs):
        return None
    with seg.fusion:
        tv = B.define_tensor([1 if d.is_broadcast else -1 for d in inp.logical], inp.dtype,
                             getattr(inp, "contiguity", None), getattr(inp, "stride_order", None),
                             is_input=False)
    k = sum(isinstance(v, TensorView) for v in seg.fusion.inputs)
    seg.fusion.add_input(tv)
    seg.fusion.inputs.insert(k, seg.fusion.inputs.pop())
    seg.inputs.insert(k, inp)
    if seg.sub_inputs is not seg.inputs:
        seg.sub_inputs.insert(k, inp)
    return k


def _host_boundary(seg: Segment, fusion) -> None:
    produced = {id(o) for e in seg.exprs for o in e.outputs}
    seg.inputs = [e.inputs[0] for e in seg.exprs if id(e.inputs[0]) not in produced]
    seg.outputs = [e.output for e in seg.exprs]


def _run_order(units, all_exprs) -> list:
    """Units in dependency order (Kahn); ties go to the unit whose first expr comes first. A
    value belongs to the unit that computes it other than as a recomputed copy (a unit's last
    item)."""
    pos = {id(e): i for i, e in enumerate(all_exprs)}
    owner = {}
    for k, u in enumerate(units):
        copied = {id(e) for e in u[4]}
        owner.update((id(o), k) for e in u[1] if id(e) not in copied for o in e.outputs)
    deps = [set() for _ in units]
    for k, u in enumerate(units):
        made = {id(o) for e in u[1] for o in e.outputs}
        for e in u[1]:
            for v in e.inputs:
                j = owner.get(id(v)) if id(v) not in made else None
                if j is not None and j != k:
                    deps[k].add(j)
    done, order = set(), []
    while len(order) < len(units):
        ready = [k for k in range(len(units)) if k not in done and deps[k] <= done]
        assert ready, "segment graph has a cycle"
        k = min(ready, key=lambda k: min(pos[id(e)] for e in units[k][1]))
        done.add(k)
        order.append(units[k])
    return order
