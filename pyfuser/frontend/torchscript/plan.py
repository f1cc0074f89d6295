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
"""
from __future__ import annotations

import itertools
import logging

import torch

from ...errors import PyfuserError, RunnerError
from .constants import constant_value
from .group_runner import key_expr
from .ops import call_op, is_device_param, overload
from .passes.aliasing import node_effects
from .passes.groups import GROUP_KIND
from .prim_ops import PRIM_HANDLERS
from .runner import RunContext, node_error
from .scalar_ops import try_python_op
from .types import (BoolType, DeviceType, FloatType, IntType, ListType, NoneType, StringType,
                    TensorType, TupleType)

log = logging.getLogger("pyfuser")

VALUE, FACTS, TYPE, DYN = 3, 2, 1, 0
_STABLE_TYPES = (TensorType, IntType, FloatType, BoolType, StringType, DeviceType, NoneType)
_META_READS = {"aten::size", "aten::dim", "aten::numel", "aten::stride", "aten::len",
               "prim::dtype", "prim::device", "prim::shape", "prim::layout", "prim::is_cuda",
               "prim::requires_grad", "aten::is_contiguous", "aten::is_floating_point"}
_DATA_SCALARS = {"prim::NumToTensor", "aten::Int", "aten::IntImplicit", "aten::Float",
                 "aten::FloatImplicit", "aten::Bool", "aten::ScalarImplicit", "aten::item"}
_STRUCTURAL = {"prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack",
               "prim::TupleUnpack", "prim::TupleIndex"}
_counter = itertools.count()


class Plan:
    """One input signature's compiled call: `fn(*inputs)` returns what the graph returns."""
    __slots__ = ("fn", "stats", "source", "filename", "line_nodes", "sites", "attr_reads",
                 "direct", "native_tried")

    def __init__(self, fn, stats, source, filename, line_nodes, sites, attr_reads=()):
        self.fn, self.stats, self.source = fn, stats, source
        self.filename, self.line_nodes, self.sites = filename, line_nodes, sites
        self.attr_reads = attr_reads       # (getter, name) of the attributes read per call
        # (fusion's _Programs, its key for these inputs) when the whole graph is one bound
        # group taking the graph's inputs in order and giving its outputs: the call is that
        # fusion's recorded program (jit.py hands it to the native runner where built).
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


def input_level(t) -> int:
    """What a plan key fixes of a graph input of declared type `t`."""
    if isinstance(t, TensorType):
        return FACTS
    if isinstance(t, (IntType, BoolType, StringType, NoneType)):
        return VALUE
    if isinstance(t, ListType) and isinstance(t.elem, (IntType, BoolType, FloatType)):
        return VALUE
    return TYPE if _stable(t) else DYN


def _stable(t) -> bool:
    return isinstance(t, _STABLE_TYPES)


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


# ---- code generation -------------------------------------------------------------------------
class _Writer:
    """Emits the plan's source: names, the environment of bound objects, levels."""

    def __init__(self, compiled, variant, recorder, runners, module, cpu_mode):
        self.compiled, self.variant, self.rec = compiled, variant, recorder
        self.runners, self.module, self.cpu_mode = runners, module, cpu_mode
        self.names = recorder.names
        self.env: dict = {"_RunnerError": RunnerError}
        self.lines: list = []
        self.line_nodes: dict = {}
        self.level: dict = {}
        self.resolved: dict = {}          # Value -> object (modules, known at build time)
        self.sites: dict = {}             # group node -> "bound" / "fast" / "checked"
        self.attr_reads: list = []        # (getter, name) read per call
        self.contrib: dict = {}           # group node -> what it counts (bound / fast sites)
        self.tmp = itertools.count()
        from .jit import eager_handler
        self.ctx = RunContext(None, eager_handler)
        self.env.update(C=self.ctx, CM=cpu_mode, _own=_own, _miss=_miss)

    # -- names and the environment
    def bind(self, prefix, obj) -> str:
        name = f"{prefix}{len(self.env)}"
        self.env[name] = obj
        return name

    def ref(self, v) -> str:
        return self.names[v]

    def lvl(self, v) -> int:
        return self.level.get(v, TYPE if _stable(v.type) else DYN)

    def emit(self, line, indent, node=None):
        self.lines.append("    " * indent + line)
        if node is not None:
            self.line_nodes[len(self.lines) + 1] = node      # +1: the `def` line comes first

    # -- levels
    def fixed(self, v) -> bool:
        lv = self.lvl(v)
        if lv == VALUE:
            return True
        return lv == FACTS

    def out_level(self, node, top: bool) -> int:
        """Level of a node's (tensor) outputs from its inputs' levels."""
        if not top:
            return DYN
        ins = node.inputs
        if all(self.lvl(v) == VALUE for v in ins):
            return VALUE
        if all(self.fixed(v) for v in ins):
            return FACTS
        return DYN

    def set_out_levels(self, node, top: bool, how=None) -> None:
        kind = node.kind
        if not top:
            for o in node.outputs:
                self.level[o] = TYPE if _stable(o.type) else DYN
            return
        ins = node.inputs
        all_value = all(self.lvl(v) == VALUE for v in ins)
        if kind in _META_READS and ins and self.fixed(ins[0]) and all(
                self.lvl(v) == VALUE for v in ins[1:]):
            lv = VALUE
        elif kind in _DATA_SCALARS or kind in _STRUCTURAL:
            lv = min((self.lvl(v) for v in ins), default=VALUE)
            if kind in _DATA_SCALARS and lv == FACTS:
                lv = TYPE
        elif all_value and not _nondeterministic(how):
            lv = VALUE
        elif all(self.fixed(v) for v in ins) and _shape_determined(node, how, self):
            lv = FACTS
        else:
            lv = DYN
        for o in node.outputs:
            if lv == FACTS and not isinstance(o.type, TensorType):
                self.level[o] = TYPE if _stable(o.type) else DYN
            elif lv == DYN:
                self.level[o] = TYPE if _stable(o.type) else DYN
            else:
                self.level[o] = lv

    def note_writes(self, node, top: bool) -> None:
        """An op writing an argument: its data changed (VALUE -> FACTS); with arguments the key
        does not fix, or inside a block (it may or may not run), its facts may have changed
        too (-> TYPE)."""
        if node.kind in _STRUCTURAL or node.kind in ("prim::Constant", "prim::GetAttr",
                                                     GROUP_KIND):
            return
        e = node_effects(node)
        written = range(len(node.inputs)) if e.opaque else e.writes
        all_fixed = top and all(self.fixed(v) for v in node.inputs)
        for i in written:
            if i < len(node.inputs):
                v = node.inputs[i]
                if self.lvl(v) >= FACTS:
                    self.level[v] = FACTS if all_fixed else (TYPE if _stable(v.type) else DYN)

    # -- blocks
    def block(self, block, indent, top: bool) -> None:
        for node in block.nodes():
            self.node(node, indent, top)
        if not any(True for _ in block.nodes()):
            self.emit("pass", indent)

    def node(self, node, indent, top):
        kind = node.kind
        if kind == "prim::Constant":
            self.constant(node)
            return
        if kind == "prim::GetAttr" and node.inputs[0] in self.resolved:
            self.get_attr(node, indent)
            return
        if kind == GROUP_KIND:
            self.group(node, indent, top)
            return
        if kind == "prim::If":
            self.if_(node, indent, top)
            return
        if kind == "prim::Loop":
            self.loop(node, indent, top)
            return
        how = self.rec.how.get(node)
        path = how if isinstance(how, str) else ("op" if how is not None else None)
        ins = [self.ref(v) for v in node.inputs]
        outs = [self.ref(v) for v in node.outputs]
        if kind in _STRUCTURAL and path == "prim":
            self.structural(node, ins, outs, indent)
        elif path == "python":
            self.call_list(self.bind("PY", _python_op(node)), ins, outs, indent, node)
        elif path == "prim":
            h = self.bind("PH", PRIM_HANDLERS[kind])
            self.assign(outs, f"{h}(C, {self.bind('N', node)}, [{', '.join(ins)}])", indent,
                        node, is_list=True)
        elif path == "handler" and kind == "prim::add_optional":
            a, b = ins
            add = self.bind("ADD", torch.add)
            self.emit(f"{outs[0]} = {a} if {b} is None else {add}({a}, {b})", indent, node)
        elif path == "op":
            self.aten(node, how, ins, outs, indent, top)
        else:                              # not run when the plan was made, or rare: dispatch
            d = self.bind("D", self.ctx._dispatch)
            self.assign(outs, f"{d}({self.bind('N', node)}, [{', '.join(ins)}])", indent, node,
                        is_list=True)
        self.set_out_levels(node, top, how)
        self.note_writes(node, top)

    def assign(self, outs, expr, indent, node, is_list=False):
        if not is_list:
            self.emit(f"{outs[0]} = {expr}" if outs else expr, indent, node)
        elif not outs:
            self.emit(expr, indent, node)
        else:
            self.emit(f"{', '.join(outs)}, = {expr}", indent, node)

    def call_list(self, fn, ins, outs, indent, node):
        self.assign(outs, f"{fn}([{', '.join(ins)}])", indent, node, is_list=True)

    def constant(self, node):
        v = node.output()
        value = constant_value(node, self.ctx.map_device)
        self.env[self.names[v]] = value             # a global of the plan's code
        if isinstance(value, torch.Tensor):
            self.level[v] = VALUE if value.dim() == 0 and not _written(v) else FACTS
        else:
            self.level[v] = VALUE

    def get_attr(self, node, indent):
        obj = self.resolved[node.inputs[0]]
        name = node.s("name")
        out = node.output()
        value = getattr(obj, name)
        if _is_module(value):
            self.resolved[out] = value
            self.env[self.names[out]] = value
            self.level[out] = VALUE
            return
        c = getattr(obj, "_c", None)
        getter = c.getattr if isinstance(c, torch._C.ScriptModule) else \
            (lambda n, _o=obj: getattr(_o, n))
        g = self.bind("GA", getter)
        self.attr_reads.append((getter, name))
        self.emit(f"{self.ref(out)} = {g}({name!r})", indent, node)
        self.level[out] = TYPE if _stable(out.type) else DYN

    def structural(self, node, ins, outs, indent):
        kind = node.kind
        if kind == "prim::ListConstruct":
            self.emit(f"{outs[0]} = [{', '.join(ins)}]", indent, node)
        elif kind == "prim::TupleConstruct":
            self.emit(f"{outs[0]} = ({''.join(i + ', ' for i in ins)})", indent, node)
        elif kind == "prim::TupleIndex":
            self.emit(f"{outs[0]} = {ins[0]}[{ins[1]}]", indent, node)
        elif outs:                      # List/TupleUnpack: Python checks the count
            self.emit(f"{', '.join(outs)}, = {ins[0]}", indent, node)
        else:
            self.emit(f"() = {ins[0]}", indent, node)

    def aten(self, node, schema, ins, outs, indent, top):
        kind = node.kind
        if not all(self.lvl(v) >= FACTS or _stable(v.type) for v in node.inputs):
            md = self.bind("MD", self.ctx.map_device)
            co = self.bind("CO", call_op)
            self.assign(outs, f"{co}({kind!r}, [{', '.join(ins)}], {md})", indent, node,
                        is_list=True)
            return
        if kind == "aten::size" and schema.overload_name == "int" and len(ins) == 2:
            self.emit(f"{outs[0]} = {ins[0]}.size({ins[1]})", indent, node)
            return
        op = self.bind("OP", overload(kind, schema))
        pos, kw = [], []
        for v, name, p in zip(node.inputs, ins, schema.arguments):
            if is_device_param(p.type):
                name = self.device_arg(v, name)
            if p.kwarg_only:
                kw.append(f"{p.name}={name}")
            else:
                pos.append(name)
        call = f"{op}({', '.join(pos + kw)})"
        n_ret = len(schema.returns)
        if n_ret == 1:
            self.emit(f"{outs[0]} = {call}" if outs else call, indent, node)
        elif n_ret == 0:
            self.emit(call, indent, node)
            for o in outs:                  # a None result for a declared output
                self.emit(f"{self.ref(o)} = None", indent)
        else:
            self.emit(f"{', '.join(outs)}, = {call}", indent, node)

    def device_arg(self, v, name):
        if self.lvl(v) == VALUE and v.node.kind == "prim::Constant":
            value = self.env[name]
            return name if value is None else self.bind("DV", self.ctx.map_device(
                torch.device(value)))
        dv = self.bind("DVF", _device_or_none)
        return f"{dv}({name})"

    def if_(self, node, indent, top):
        cond = self.ref(node.inputs[0])
        self.emit(f"if {cond}:", indent, node)
        for b, blk in enumerate(node.blocks):
            if b == 1:
                self.emit("else:", indent)
            self.block(blk, indent + 1, False)
            for o, bo in zip(node.outputs, blk.outputs):
                self.emit(f"{self.ref(o)} = {self.ref(bo)}", indent + 1)
        self.set_out_levels(node, False)

    def loop(self, node, indent, top):
        k = next(self.tmp)
        trips, cond, *init = [self.ref(v) for v in node.inputs]
        body = node.blocks[0]
        carried = [f"_c{k}_{j}" for j in range(len(init))]
        self.emit(f"_t{k} = {trips}", indent, node)
        self.emit(f"_k{k} = {cond}", indent)
        for c, i in zip(carried, init):
            self.emit(f"{c} = {i}", indent)
        self.emit(f"_i{k} = 0", indent)
        self.emit(f"while _k{k} and _i{k} < _t{k}:", indent, node)
        bins = list(body.inputs)
        self.emit(f"{self.ref(bins[0])} = _i{k}", indent + 1)
        for v, c in zip(bins[1:], carried):
            self.emit(f"{self.ref(v)} = {c}", indent + 1)
        self.block(body, indent + 1, False)
        bouts = [self.ref(v) for v in body.outputs]
        self.emit(f"_k{k} = {bouts[0]}", indent + 1)
        for c, b in zip(carried, bouts[1:]):
            self.emit(f"{c} = {b}", indent + 1)
        self.emit(f"_i{k} += 1", indent + 1)
        for o, c in zip(node.outputs, carried):
            self.emit(f"{self.ref(o)} = {c}", indent)
        self.set_out_levels(node, False)

    # -- fusion groups
    def group(self, node, indent, top):
        runner = self.runners[node]
        ins = [self.ref(v) for v in node.inputs]
        outs = [self.ref(v) for v in node.outputs]
        site = self.rec.sites.get(node) if top else None
        r = self.bind("G", runner)
        mode = "checked"
        if site is not None:
            contrib, source, on_cuda = site
            # Under grad mode a group fuses only when no input requires grad: bound inputs are
            # fixed by the key (requires_grad included); a fast key does not hold it.
            if contrib[3] == 0 and on_cuda:
                if source is not None and self.bindable(node, runner):
                    mode = "bound"
                elif runner.key_of is not None and not torch.is_grad_enabled():
                    mode = "fast"
        self.sites[node] = mode
        args = f"[{', '.join(ins)}]"
        if mode == "bound":
            lines, env, exprs = site[1]
            self.env.update(env)
            for line in lines:
                self.emit(line, indent, node)
            for o, e in zip(outs, exprs):
                self.emit(f"{o} = {e}", indent, node)
        elif mode == "fast":
            self.emit(f"_outs = {r}.fast({args})", indent, node)
            self.emit("if _outs is None:", indent, node)
            self.emit(f"    st = _miss(st, S, {self.bind('CB', site[0])})", indent, node)
            self.emit(f"    _outs = {r}.run({args}, st, CM, C)", indent, node)
        else:
            self.emit("st = _own(st, S)", indent, node)
            self.emit(f"_outs = {r}.run({args}, st, CM, C)", indent, node)
        if mode != "checked":
            self.contrib[node] = site[0]
        if outs and mode != "bound":
            self.emit(f"{', '.join(outs)}, = _outs", indent, node)
        if top and mode == "bound":
            lv = FACTS
            if all(self.lvl(v) == VALUE for v in node.inputs):
                lv = VALUE
            for o in node.outputs:
                self.level[o] = lv if isinstance(o.type, TensorType) or lv == VALUE else VALUE
        else:
            self.set_out_levels(node, False)

    def bindable(self, node, runner) -> bool:
        """Every input fixed by the key: tensors' facts (a by-value one's value too), other
        inputs' values."""
        lowered_by_value = runner._by_value_seen
        for i, v in enumerate(node.inputs):
            lv = self.lvl(v)
            if isinstance(v.type, TensorType) and i not in lowered_by_value:
                if lv < FACTS:
                    return False
            elif lv != VALUE:
                return False
        return True


def _written(v) -> bool:
    """Some node may write `v` in place."""
    for u in v.uses:
        n = u.user
        if n.kind == "prim::Return":
            continue
        e = node_effects(n)
        if e.opaque or u.offset in e.writes:
            return True
    return False


def _is_module(x) -> bool:
    return isinstance(x, (torch.jit.ScriptModule, torch.nn.Module, torch._C.ScriptModule))


def _nondeterministic(how) -> bool:
    if how is None or isinstance(how, str):
        return isinstance(how, str) and how not in ("python", "prim")
    tags = _tags(how)
    return torch.Tag.nondeterministic_seeded in tags


def _tags(schema):
    try:
        return overload("aten::" + schema.name.split("::", 1)[-1], schema).tags \
            if schema.name.startswith("aten::") else ()
    except Exception:  # noqa: BLE001
        return ()


def _shape_determined(node, how, writer) -> bool:
    """Whether a node with fixed inputs gives outputs whose facts the inputs fix."""
    if node.kind == "prim::add_optional" or node.kind == "prim::inplace_cast":
        return True
    if how is None or isinstance(how, str) or not node.kind.startswith("aten::"):
        return False
    tags = _tags(how)
    if torch.Tag.data_dependent_output in tags:
        return False
    if torch.Tag.dynamic_output_shape in tags:
        # aten::index with integer index tensors has a static shape
        return node.kind == "aten::index" and writer.rec.extra.get(node) is False
    # a view at an offset read from a tensor's data: its alignment is not fixed
    rets = how.returns
    if rets and rets[0].alias_info is not None and not rets[0].alias_info.is_write:
        return all(writer.lvl(v) == VALUE for v in node.inputs[1:]
                   if isinstance(v.type, TensorType))
    return True


def _python_op(node):
    kind = node.kind

    def run(args, _ctx=RunContext()):
        res = try_python_op(_ctx, kind, args)
        if res is NotImplemented:
            return _ctx._dispatch(node, args)
        return [] if not node.outputs and res is None else [res]
    return run


def _device_or_none(v):
    return None if v is None else torch.device(v)


def _own(st, S):
    """The call's own RunStats (a copy of the plan's, once)."""
    return st.copy() if st is S else st


def _miss(st, S, contrib):
    """A fast group missed: the call's own stats, without what the plan counted for it."""
    st = _own(st, S)
    k, h, e, g, fb = contrib
    st.kernels -= k
    st.host_segments -= h
    st.eager_segments -= e
    st.eager_groups -= g
    for f in fb:
        if f in st.fallbacks:
            st.fallbacks.remove(f)
    return st


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
    w = _Writer(compiled, variant, rec, variant.runners, compiled.module, compiled.cpu_mode)
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
    """Plan.direct for a graph that is one bound group on the graph's inputs (see Plan)."""
    if skip:
        return None
    nodes = [n for n in graph.nodes() if n.kind != "prim::Constant"]
    if len(nodes) != 1 or w.sites.get(nodes[0]) != "bound":
        return None
    g = nodes[0]
    if list(g.inputs) != list(graph.inputs) or list(g.outputs) != list(graph.outputs):
        return None
    found = rec.direct.get(g)
    if found is None or found[2] != list(range(len(g.outputs))):
        return None
    return found[0], found[1]


__all__ = ["Plan", "build_plan", "key_function", "VALUE", "FACTS", "TYPE", "DYN"]
