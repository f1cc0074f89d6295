"""Call plans: a fused graph as straight-line Python, one function per input signature.

`build_plan(compiled, variant, args, key)` runs the fused graph once, checked, through the eager
runner (the *recording* run: groups through their GroupRunner, every node dispatched as
runner.RunContext.route decides), and then writes one Python function for the whole graph:

- `prim::Constant`s are evaluated once (tensor constants already on their device) and held by
  the function; `prim::GetAttr` chains from the module (`%self`) are resolved once: submodules
  are held, the leaf tensors and other attributes are read per call from their module through
  the C++ module's `getattr` (about 0.15 us; a parameter replaced by assignment is seen);
- aten ops call the OpOverload chosen by the recording run (`torch.ops.aten.linear.default`)
  with positional and keyword arguments laid out once, where the argument kinds cannot change
  between calls (constants, tensors, ints, floats, bools, strings); other ops go through the
  runner's dispatch; Python-number ops and prim ops call their handlers directly;
- `prim::If` / `prim::Loop` become Python `if` / `while` with their blocks inlined;
- each fusion group at the top level is, by what its inputs are (below):
    * *bound*: its inputs' dtypes, sizes, strides, alignment and devices (and scalars' values)
      follow from the plan's key, so the program the dispatcher recorded for them
      (runtime/dispatch.py) is called directly: no key, no lookup (GroupRunner.entry_source);
      identity groups (views only, sizes and dtypes read on the host) are a few assignments;
    * *fast*: one key over the group's inputs and a lookup (GroupRunner.fast), the checked
      GroupRunner.run on a miss;
    * *checked*: GroupRunner.run every call (grad mode on, a group that ran eagerly when the
      plan was made, CPU tensors, groups inside blocks).

What the key fixes (levels, computed in program order over the top level): VALUE (the value
itself: constants, ints and bools of the key, sizes read from FACTS tensors, arithmetic on
VALUEs), FACTS (a tensor's dtype, sizes, strides, data_ptr % 16 and device: tensor inputs, and
outputs of ops whose inputs are all fixed, unless the op's output shape or data is
data-dependent by its torch tags, or it is a view whose offset comes from a tensor's data),
TYPE (only the Python type, from the declared type) and DYN. Parameters and buffers are TYPE
(read per call; a replaced one may differ). An op that writes an argument in place lowers that
argument to FACTS (its data changed) or, when its own arguments are not fixed, to TYPE.

`Plan.stats` is the RunStats of a call whose fast groups hit (what the recording run counted for
bound and fast groups, plus the pass report's fallbacks); a checked group, or a fast group that
misses, gives that call its own copy. A failing node raises a RunnerError naming it (from the
traceback line of the plan's code, no per-node bookkeeping), as the runner does.

The levels live in plan_levels.py, the source writer in plan_writer.py; this module records the
run, assembles and compiles the plan, and makes its key function.
"""
from __future__ import annotations

import itertools
import logging

import torch

from ...errors import PyfuserError, RunnerError
from .group_runner import key_expr
from .plan_levels import DYN, FACTS, TYPE, VALUE, input_level
from .plan_writer import Writer
from .runner import RunContext, node_error
from .types import BoolType, FloatType, IntType, ListType, NoneType, StringType, TensorType

log = logging.getLogger("pyfuser")

_counter = itertools.count()


class Plan:
    """One input signature's compiled call: `fn(*inputs)` returns what the graph returns."""
    __slots__ = ("fn", "stats", "source", "filename", "line_nodes", "sites", "attr_reads",
                 "direct", "native_tried")

    def __init__(self, fn, stats, source, filename, line_nodes, sites, attr_reads=()):
        self.fn, self.stats, self.source = fn, stats, source
        self.filename, self.line_nodes, self.sites = filename, line_nodes, sites
        self.attr_reads = attr_reads       # (getter, name) of the attributes read per call
        # (fusion's _Programs, its key for these inputs, how the native runner returns the
        # results: 1 the only one, 2 a tuple, and the fusion output each returned value is)
        # when the whole graph is one bound group taking the graph's inputs in order and giving
        # its outputs (or a tuple of them, each once): the call is that fusion's recorded
        # program (jit.py hands it to the native runner where built).
        self.direct = None
        self.native_tried = False

    def error(self, e: BaseException) -> BaseException:
        """The exception to raise for `e` raised inside the plan: a RunnerError naming the node
        of the plan line that raised (PyfuserErrors and named RunnerErrors as they are)."""
        if isinstance(e, PyfuserError) and (not isinstance(e, RunnerError)
                                            or getattr(e, "node_named", False)):
            return e
        tb, node = e.__traceback__, None
        while tb is not None:
            if tb.tb_frame.f_code.co_filename == self.filename:
                node = self.line_nodes.get(tb.tb_lineno, node)
            tb = tb.tb_next
        if node is None:
            return e
        text = str(e).strip()
        first = text.splitlines()[0] if text else type(e).__name__
        return node_error(node, first if isinstance(e, RunnerError) else
                          f"{type(e).__name__}: {first}")


def key_function(graph, skip: int):
    """Generate `key_of(inputs) -> key` over the graph's inputs after the first `skip` (the
    module): grad mode, then per tensor input dtype, sizes, strides, data_ptr % 16, device and
    requires_grad; ints, bools, strings, None and lists of numbers by value; floats and other
    values by type (their values are not fixed by a plan). Raises on inputs of another kind
    than declared (the caller then runs checked)."""
    parts = ["_grad()"]
    for i, v in enumerate(graph.inputs[skip:]):
        parts.append(_input_key(f"a[{i}]", v.type))
    src = "def key_of(a):\n    return (" + "".join(f"{p}, " for p in parts) + ")\n"
    env = {"_grad": torch.is_grad_enabled, "_freeze": _freeze_numbers}
    exec(compile(src, "<pyfuser plan key>", "exec"), env)  # noqa: S102
    return env["key_of"]


def _input_key(name, t) -> str:
    if isinstance(t, TensorType):
        return f"{key_expr(name, t)}, {name}.requires_grad"
    if isinstance(t, (IntType, BoolType, StringType, NoneType)):
        return f"{name}.__class__, {name}"
    if isinstance(t, ListType) and isinstance(t.elem, (IntType, BoolType, FloatType)):
        return f"_freeze({name})"
    return f"{name}.__class__"


def _freeze_numbers(x):
    return tuple(_freeze_numbers(e) if isinstance(e, (list, tuple)) else (e.__class__, e)
                 for e in x)

# ---- the recording run -----------------------------------------------------------------------
class Recorder(RunContext):
    """The checked run that a plan is made from: notes how each node ran the first time, and
    for each group at the top level what GroupRunner.entry_source gives and what it counted."""

    def __init__(self, handler, names, top_groups, stats):
        super().__init__(None, handler)
        self.how: dict = {}
        self.extra: dict = {}
        self.names, self.top_groups, self.stats = names, top_groups, stats
        self.sites: dict = {}
        self.direct: dict = {}

    def route(self, node, args):
        runner = self.top_groups.get(node)
        if runner is not None and node not in self.sites:
            before = _snapshot(self.stats)
            how, outs = super().route(node, args)
            contrib = _contribution(before, self.stats)
            source = None
            if contrib[3] == 0:
                source = runner.entry_source(args, [self.names[v] for v in node.inputs])
            on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
            self.sites[node] = (contrib, source, on_cuda)
            self.direct[node] = _direct_key(runner, args)
        else:
            how, outs = super().route(node, args)
        if node not in self.how:
            self.how[node] = how
            if node.kind == "aten::index" and len(args) > 1 and isinstance(args[1], (list, tuple)):
                self.extra[node] = any(isinstance(t, torch.Tensor) and t.dtype in
                                       (torch.bool, torch.uint8) for t in args[1])
        return how, outs


def _direct_key(runner, args):
    """(the fusion's _Programs, its key for these inputs) when the group's fusion takes exactly
    the group's inputs (no specialised or by-value ones, no host-answered outputs)."""
    hit = runner._passed.get(runner._passed_key(args))
    if hit is None or isinstance(hit, str):
        return None
    lowered = hit[0]
    if lowered.specialised or lowered.by_value or lowered.host_values or \
            lowered.input_indices != list(range(len(args))) or not lowered.fusion.outputs:
        return None
    from ...runtime import dispatch
    progs = lowered.fusion.__dict__.get(dispatch._PROGS)
    if progs is None:
        return None
    try:
        return progs, progs.key_of(args)[0], list(lowered.output_map)
    except Exception:  # noqa: BLE001
        return None


def _snapshot(st):
    return (st.kernels, st.host_segments, st.eager_segments, st.eager_groups,
            len(st.fallbacks))


def _contribution(before, st):
    k, h, e, g, n = before
    return (st.kernels - k, st.host_segments - h, st.eager_segments - e, st.eager_groups - g,
            list(st.fallbacks[n:]))


# ---- building ----------------------------------------------------------------------------------
def build_plan(compiled, variant, args, stats, stats_factory):
    """Run the graph on `args` (checked, recording; `stats` counts it) and make its Plan.
    Returns (outputs as a list, Plan or None when no plan could be made: logged)."""
    graph = variant.graph
    names: dict = {}
    for i, v in enumerate(graph.inputs):
        names[v] = f"x{i}"
    n = itertools.count()
    for node in graph.all_nodes():
        for v in node.outputs:
            names[v] = f"v{next(n)}"
        for b in node.blocks:
            for v in b.inputs:
                names[v] = f"v{next(n)}"
    top_groups = {node: r for node, r in variant.runners.items() if node.owning_block is graph.block}
    rec = Recorder(compiled._handler(stats), names, top_groups, stats)
    inputs = ([compiled.module] if compiled.module is not None else []) + list(args)
    outs = rec.run_graph(graph, inputs)
    try:
        plan = _write(compiled, variant, rec, stats_factory, names)
    except Exception as e:  # noqa: BLE001 - a plan is an optimisation: the checked path stays
        log.warning("pyfuser: no call plan for this input signature (calls run checked): "
                    "%s: %s", type(e).__name__, e)
        plan = None
    return outs, plan


def _write(compiled, variant, rec, stats_factory, names) -> Plan:
    graph = variant.graph
    w = Writer(compiled, variant, rec, variant.runners, compiled.module, compiled.cpu_mode)
    skip = 1 if compiled.module is not None else 0
    for i, v in enumerate(graph.inputs):
        if i < skip:
            w.resolved[v] = compiled.module
            w.env[w.names[v]] = compiled.module
            w.level[v] = VALUE
        else:
            w.level[v] = input_level(v.type)
    w.block(graph.block, 1, True)
    ret = [w.ref(v) for v in graph.outputs]
    w.emit("CG.last_run = st", 1)
    if len(ret) == 1:
        w.emit(f"return {ret[0]}", 1)
    else:
        w.emit(f"return ({''.join(r + ', ' for r in ret)})", 1)
    S = stats_factory()
    for contrib in w.contrib.values():
        k, h, e, g, fb = contrib
        S.kernels += k
        S.host_segments += h
        S.eager_segments += e
        S.eager_groups += g
        S.fallbacks.extend(fb)
    params = [f"x{i}" for i in range(skip, len(graph.inputs))]
    head = f"def plan({', '.join(params)}):\n    st = S\n"
    src = head + "\n".join(w.lines) + "\n"
    w.line_nodes = {k + 1: v for k, v in w.line_nodes.items()}    # the `st = S` line
    filename = f"<pyfuser plan {next(_counter)}>"
    w.env.update(S=S, CG=compiled)
    exec(compile(src, filename, "exec"), w.env)  # noqa: S102
    plan = Plan(w.env["plan"], S, src, filename, w.line_nodes, dict(w.sites),
                tuple(w.attr_reads))
    plan.direct = _direct(graph, w, rec, skip)
    return plan


def _direct(graph, w, rec, skip):
    """Plan.direct for a graph that is one bound group on the graph's inputs (see Plan). A
    module's graph qualifies when nothing reads `%self` (the attributes it used were folded
    into constants, as `__constants__` are): the call is then the group's alone."""
    inputs = list(graph.inputs)
    if any(v.uses for v in inputs[:skip]):
        return None
    nodes = [n for n in graph.nodes() if n.kind != "prim::Constant"]
    if not nodes or w.sites.get(nodes[0]) != "bound":
        return None
    g, outs, produced = nodes[0], list(graph.outputs), list(nodes[0].outputs)
    if len(nodes) == 2:              # the group's outputs returned as one tuple, in any order
        t = nodes[1]
        if t.kind != "prim::TupleConstruct" or outs != list(t.outputs) or \
                sorted(map(id, t.inputs)) != sorted(map(id, produced)):
            return None
        order, unpack = [produced.index(v) for v in t.inputs], 2
    elif len(nodes) == 1 and produced == outs:
        order, unpack = list(range(len(outs))), 1 if len(outs) == 1 else 2
    else:
        return None
    if list(g.inputs) != inputs[skip:]:
        return None
    found = rec.direct.get(g)
    if found is None or found[2] != list(range(len(g.outputs))):
        return None
    return found[0], found[1], unpack, order


__all__ = ["Plan", "build_plan", "key_function", "VALUE", "FACTS", "TYPE", "DYN"]
