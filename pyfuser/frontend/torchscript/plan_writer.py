"""Writing a call plan's Python source (plan.py's code generation): one statement per node.

`Writer` walks the recorded graph in program order and emits the plan function's lines, the
environment of objects they reference (constants, submodules, overloads, group runners) and per
value its level (plan_levels: what the plan's key fixes of it), from which each top-level fusion
group becomes a bound, fast or checked site (plan.py's module docstring says what each is).
`line_nodes` maps each emitted line to its node, so an error raised by the plan names the node.
Invariant: the source calls exactly what the recording run called, with the same overloads.
"""
from __future__ import annotations

import itertools

import torch

from ...errors import RunnerError
from .constants import constant_value
from .ops import call_op, is_device_param, is_out_variant, overload
from .passes.groups import GROUP_KIND
from .plan_levels import (_DATA_SCALARS, _META_READS, _STRUCTURAL, DYN, FACTS, TYPE, VALUE,
                          _nondeterministic, _shape_determined, _stable, _written)
from .prim_ops import PRIM_HANDLERS
from .runner import RunContext
from .scalar_ops import try_python_op
from .passes.aliasing import node_effects
from .types import TensorType


class Writer:
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
            named = ""                      # an out= variant: resolving at run time never picks it
            if is_out_variant(schema):
                named = ", " + self.bind("SC", schema)
            self.assign(outs, f"{co}({kind!r}, [{', '.join(ins)}], {md}{named})", indent, node,
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
            # fixed by the key (requires_grad included); a fast key does not hold it, so the
            # fast call checks it (GroupRunner.fast) and misses to the checked path.
            if contrib[3] == 0 and on_cuda:
                if source is not None and self.bindable(node, runner):
                    mode = "bound"
                elif runner.key_of is not None:
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



def _is_module(x) -> bool:
    return isinstance(x, (torch.jit.ScriptModule, torch.nn.Module, torch._C.ScriptModule))


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
