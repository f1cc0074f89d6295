"""Alias analysis for the fuser passes: which values may share storage, which nodes write.

`op_effects(kind)` reads PyTorch's operator schemas (union over the non-`out` overloads):
the argument positions an op writes (`Tensor(a!)`) and, per output, the arguments it may
alias (`-> Tensor(a)`; wildcards `(*)` alias every input); an argument that escapes into
the wildcard set (`Tensor(a -> *)`: chunk/split/unbind, list append, dict set-item) is
aliased by every output and joins the written containers. `node_effects(node)` is what the
passes use: the overloads that take the node's argument count (so `torch.add(x, y, out=c)`,
an `out` overload, writes `c`), plus the running-statistics writes that batch_norm /
instance_norm schemas do not declare (RUNNING_STATS). A few ops whose schema claims a
fresh result but which may return their input (dropout in eval mode, type_as, ...) are
listed in MAY_RETURN_SELF. `prim::` kinds are a table; unknown kinds (calls, Python ops) are
treated as writing and aliasing every input ("opaque").

`AliasInfo(graph)` is a union-find over Values: graph inputs (and `%self` attributes) are one
class (any two may alias); an output joins the classes of the inputs it may alias; containers
join what they hold; prim::If/Loop outputs join their block outputs. Invariants: two values
in different classes never share storage; `writes(node)` covers nested blocks; values made
after the analysis (group outputs) join their class through `inherit()`, else are fresh.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..ops import schemas

WILDCARD = "*"
GROUP_KIND = "prim::PyfuserGroup"
# Ops whose schema says "fresh" but whose eager implementation may hand back `self`.
MAY_RETURN_SELF = {"aten::dropout", "aten::feature_dropout", "aten::alpha_dropout",
                   "aten::type_as", "aten::reshape_as", "aten::view_as"}
# prim kinds that neither write nor alias (outputs are fresh or plain scalars).
_PURE_PRIMS = {"prim::Constant", "prim::NumToTensor", "prim::dtype", "prim::device",
               "prim::layout", "prim::is_cuda", "prim::min", "prim::max",
               "prim::PyfuserGroup", "prim::RaiseException", "prim::Print",
               "prim::Uninitialized", "prim::shape", "prim::requires_grad", "prim::AutogradZero"}
# prim kinds whose outputs hold / are taken out of their inputs (alias all inputs, no writes).
_CONTAINER_PRIMS = {"prim::ListConstruct", "prim::TupleConstruct", "prim::ListUnpack",
                    "prim::TupleUnpack", "prim::TupleIndex", "prim::DictConstruct",
                    "prim::GetAttr", "prim::If", "prim::Loop", "prim::unchecked_unwrap_optional"}
# prim kinds whose one output may be their first input (a cast that can be a no-op, a type
# refinement, `add_optional(a, None)` which is `a`).
_SELF_ALIAS_PRIMS = {"prim::inplace_cast", "prim::unchecked_cast", "prim::add_optional"}
# Ops that update running statistics in place although their schema does not say so:
# kind -> (position of the training / use_input_stats flag, positions written when it is set).
RUNNING_STATS = {
    "aten::batch_norm": (5, frozenset({3, 4})),
    "aten::native_batch_norm": (5, frozenset({3, 4})),
    "aten::_batch_norm_impl_index": (5, frozenset({3, 4})),
    "aten::instance_norm": (5, frozenset({3, 4})),
}
# Side effects that must keep their place even though they write no tensor.
SIDE_EFFECTS = {"prim::RaiseException", "prim::Print", "aten::warn", "prim::SetAttr"}


@dataclass(frozen=True)
class Effects:
    writes: frozenset          # argument positions written
    aliases: tuple             # per output: frozenset of argument positions (or WILDCARD)
    opaque: bool = False       # unknown op: writes and aliases everything it touches
    escapes: frozenset = frozenset()   # argument positions stored into the wildcard set


def _all_schemas(kind: str) -> tuple:
    import torch
    try:
        return tuple(torch._C._jit_get_schemas_for_operator(kind))
    except Exception:
        return ()


def _takes(s, tensor_args: tuple) -> bool:
    """Schema `s` accepts these positional IR arguments (the IR passes every argument):
    their count fits, and no argument it writes (`out`) is one that cannot hold a tensor."""
    params, n = s.arguments, len(tensor_args)
    if getattr(s, "is_vararg", False):
        fits = n >= sum(1 for p in params if not p.has_default_value())
    else:
        fits = n <= len(params) and all(p.has_default_value() for p in params[n:])
    return fits and not any(i < n and not tensor_args[i] for i, p in enumerate(params)
                            if p.alias_info is not None and p.alias_info.is_write)


def node_effects(node) -> Effects:
    """Effects of this node: its kind's overloads that fit its argument count (out= ones
    included), plus undeclared running-statistics writes; a fusion group writes the inputs
    its nodes write (a training batch norm's running statistics)."""
    if node.kind == GROUP_KIND:
        return _group_effects(node)
    overload = getattr(node, "overload", None)
    e = op_effects(node.kind, tuple(_may_hold_tensor(v) for v in node.inputs)) \
        if overload is None else overload_effects(node.kind, overload)
    spec = RUNNING_STATS.get(node.kind)
    if spec is not None and not e.opaque:
        flag, written = spec
        written = frozenset(i for i in written            # a None running stat is not written
                            if i >= len(node.inputs) or not _const_none(node.inputs[i]))
        if written and (flag >= len(node.inputs) or not _const_false(node.inputs[flag])):
            e = Effects(e.writes | written, e.aliases, e.opaque, e.escapes)
    return e


def _group_effects(group) -> Effects:
    sg = group.g("Subgraph")
    pos = {v: i for i, v in enumerate(sg.inputs)}
    writes = set()
    for n in sg.nodes():
        e = node_effects(n)
        if e.opaque:
            return Effects(frozenset(), (), opaque=True)
        writes.update(pos[n.inputs[i]] for i in e.writes
                      if i < len(n.inputs) and n.inputs[i] in pos)
    return Effects(frozenset(writes), ())


def _const_none(v) -> bool:
    n = v.node
    return n.kind == "prim::Constant" and not n.has_attr("value")


def _const_false(v) -> bool:
    n = v.node
    return n.kind == "prim::Constant" and n.has_attr("value") and n.attr("value") in (False, 0)


@functools.lru_cache(maxsize=None)
def op_effects(kind: str, tensor_args: tuple | None = None) -> Effects:
    """Effects of `kind`: with `tensor_args` (per IR argument: may it hold a tensor), of the
    overloads (out ones too) that take such arguments (all of them when none does); without,
    of the non-`out` overloads."""
    if kind.endswith("_copy") and kind.startswith("prim::"):
        return Effects(frozenset(), ())
    if kind in _PURE_PRIMS:
        return Effects(frozenset(), ())
    if kind in _CONTAINER_PRIMS:
        return Effects(frozenset(), (WILDCARD,) * 64)
    if kind in _SELF_ALIAS_PRIMS:
        return Effects(frozenset(), (frozenset({0}),))
    found = schemas(kind)
    if tensor_args is not None:
        every = _all_schemas(kind)
        found = tuple(s for s in every if _takes(s, tensor_args)) or every
    return _effects_of(kind, found)


@functools.lru_cache(maxsize=None)
def overload_effects(kind: str, overload: str) -> Effects:
    """Effects of the one overload torch matched (graphs read from torch objects)."""
    if kind.startswith("prim::") or kind == GROUP_KIND:
        return op_effects(kind)
    found = tuple(s for s in _all_schemas(kind) if s.overload_name == overload)
    return _effects_of(kind, found) if found else op_effects(kind)


def _effects_of(kind: str, found: tuple) -> Effects:
    if not found:
        return Effects(frozenset(), (), opaque=True)
    writes, aliases, escapes = set(), {}, set()
    for s in found:
        sets = {}
        for i, a in enumerate(s.arguments):
            if a.alias_info is not None:
                if a.alias_info.is_write:
                    writes.add(i)
                if WILDCARD in a.alias_info.after_set:
                    escapes.add(i)
                for name in a.alias_info.before_set:
                    sets.setdefault(name, set()).add(i)
        for j, r in enumerate(s.returns):
            if r.alias_info is None:
                continue
            names = set(r.alias_info.before_set)
            if WILDCARD in names:
                aliases[j] = WILDCARD
            elif aliases.get(j) != WILDCARD:
                aliases.setdefault(j, set()).update(*(sets.get(n, set()) for n in names))
    if kind in MAY_RETURN_SELF and aliases.get(0) != WILDCARD:
        aliases.setdefault(0, set()).add(0)
    n_out = max(aliases) + 1 if aliases else 0
    if escapes:          # what escapes may be held by (or be) any output
        n_out = max(n_out, max(len(s.returns) for s in found))
    per_out = tuple(WILDCARD if aliases.get(j) == WILDCARD
                    else frozenset(aliases.get(j, set()) | escapes) for j in range(n_out))
    return Effects(frozenset(writes), per_out, escapes=frozenset(escapes))


def is_writer(node) -> bool:
    """The node (or something nested in it) writes a tensor or has a side effect."""
    for n in node.walk():
        e = node_effects(n)
        if e.writes or e.opaque or n.kind in SIDE_EFFECTS:
            return True
    return False


def creates_alias(node, value) -> bool:
    """`node` makes an output that may alias its input `value` (or packs it in a container)."""
    e = node_effects(node)
    if e.opaque:
        return True
    for i, v in enumerate(node.inputs):
        if v is not value:
            continue
        if i in e.escapes:
            return True
        for out_aliases in e.aliases[:len(node.outputs)]:
            if out_aliases == WILDCARD or i in out_aliases:
                return True
    return False


class AliasInfo:
    def __init__(self, graph):
        self._parent: dict = {}
        self._writes_cache: dict = {}
        self._wild = object()          # stands for PyTorch's wildcard set
        inputs = [v for v in graph.inputs]
        for v in inputs[1:]:
            self._union(v, inputs[0])
        self.graph_class = self.find(inputs[0]) if inputs else None
        self._block(graph.block)
        self.mutated = set()
        for n in graph.all_nodes():
            for c in self.writes(n):
                self.mutated.add(c)

    # ----- union-find --------------------------------------------------------------------
    def find(self, v):
        p = self._parent.get(v, v)
        if p is v:
            return v
        root = self.find(p)
        self._parent[v] = root
        return root

    def _union(self, a, b) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra is not rb:
            self._parent[ra] = rb

    def inherit(self, new, old) -> None:
        """A value made later (a group output) stands for `old`: same alias class."""
        self._union(new, old)

    def _block(self, block) -> None:
        for n in block.nodes():
            for b in n.blocks:
                self._block(b)
                carried = b.outputs[1:] if n.kind == "prim::Loop" else b.outputs
                for o, bo in zip(n.outputs, carried):
                    self._union(o, bo)
                if n.kind == "prim::Loop":
                    for bi, init in zip(b.inputs[1:], n.inputs[2:]):
                        self._union(bi, init)
            e = node_effects(n)
            if e.opaque:
                vals = [v for v in n.inputs + n.outputs if _may_hold_tensor(v)]
                for v in vals[1:]:
                    self._union(v, vals[0])
                continue
            for j, o in enumerate(n.outputs):
                al = e.aliases[j] if j < len(e.aliases) else frozenset()
                if al == WILDCARD and not n.kind.startswith("prim::"):
                    self._union(o, self._wild)        # `-> t(*)`: anything in the wildcard set
                for i, v in enumerate(n.inputs):
                    if al == WILDCARD or i in al:
                        self._union(o, v)
            for i in e.escapes:                       # `x(a -> *)`: stored in a container
                if i < len(n.inputs):
                    self._union(n.inputs[i], self._wild)
                    for w in e.writes:
                        if w < len(n.inputs):
                            self._union(n.inputs[i], n.inputs[w])

    # ----- queries -----------------------------------------------------------------------
    def writes(self, node) -> set:
        """Alias classes `node` may write; {WILDCARD} when it may write anything."""
        out = set()
        for n in node.walk():
            e = node_effects(n)
            if e.opaque:
                return {WILDCARD}
            for i in e.writes:
                if i < len(n.inputs):
                    out.add(self.find(n.inputs[i]))
        return out

    def is_mutated(self, v) -> bool:
        return WILDCARD in self.mutated or self.find(v) in self.mutated

    def may_alias(self, a, b) -> bool:
        return self.find(a) is self.find(b)

    def conflicts(self, node, values) -> bool:
        """`node` may write storage that one of `values` may share."""
        w = self.writes(node)
        if not w:
            return False
        if WILDCARD in w:
            return any(_may_hold_tensor(v) for v in values)
        return any(self.find(v) in w for v in values)

    def order_matters(self, moved, other) -> bool:
        """`moved` may not pass `other`: other writes what moved reads, or moved writes what
        other reads or writes (nested blocks included)."""
        if self.conflicts(other, moved.inputs):
            return True
        if not self.writes(moved):
            return False
        return any(self.conflicts(moved, n.inputs + n.outputs) for n in other.walk())


def _may_hold_tensor(v) -> bool:
    from ..types import BoolType, FloatType, IntType, NoneType, StringType, DeviceType
    return not isinstance(v.type, (BoolType, FloatType, IntType, NoneType, StringType, DeviceType))
