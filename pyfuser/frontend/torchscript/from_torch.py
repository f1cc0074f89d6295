"""Graphs built from PyTorch objects through torch's node API, never through printed text.

    graph_from_torch(ts_graph)   # a torch._C.Graph -> Graph (a structural copy)
    graph_from_function(obj)     # ScriptFunction / ScriptModule / traced / torch._C.Graph / fn

`graph_from_torch` walks `nodes()`, `inputs()`, `outputs()`, `blocks()` and reads every
attribute with the accessor its `kindOf()` names (`i`, `f`, `s`, `c`, `t`, `g`, `ty`, their
lists, `ival`), types with `torch_types.from_torch_type`. So constants are exact: tensors of
any size keep every element, their dtype and their device; floats keep every bit (PyTorch's
printer writes tensor constants with 6 significant digits and `<Tensor>` beyond 10 elements).
Subgraph attributes (fusion groups of optimized graphs) are converted the same way.
Values that IR text cannot spell are kept on the node (`Node.value_object`): the function a
`Function` constant names (looked up in torch's Python compilation unit) and script objects.
Value names are torch's debug names. Traced nodes keep their module scope (`node.scope`),
every node the `file:line` torch recorded for it (`node.source`).

`graph_from_function(obj)` inlines calls first (`inlined_graph`, or `_jit_pass_inline` on a
copy of a bare graph: a traced module's `.graph` calls its submodules through
`prim::CallMethod`), so the result has no calls left to resolve at run time. Module graphs
keep `%self` as first input: pass the module object as the first runner input, and
`prim::GetAttr` reads parameters and buffers from it.
"""
from __future__ import annotations

import re

import torch

from .graph import Graph
from .node import Node
from .torch_types import from_torch_type
from .types import ClassType, FunctionType

_LIST_ATTRS = {"is": "is", "fs": "fs", "ss": "ss", "ts": "ts"}
_SCALAR_ATTRS = {"i": "i", "f": "f", "s": "s", "c": "c", "t": "t", "ty": "ty", "ival": "ival"}
_VALID_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.]*\Z")
_SCRIPT_SOURCE = re.compile(r'File "([^"]+)", line (\d+)')
_TRACE_SOURCE = re.compile(r"\A([^\n(]+)\((\d+)\)")


def graph_from_torch(ts_graph) -> Graph:
    """Our Graph for a torch._C.Graph, read through torch's node API (module docstring)."""
    g = Graph()
    env: dict = {}
    for v in ts_graph.inputs():
        env[v.unique()] = g.add_input(_name(v), from_torch_type(v.type()))
    _copy_block(ts_graph, g.block, g, env)
    return g


def _overload(tn):
    """The overload name of the schema torch matched for this node, or None."""
    try:
        s = tn.schema()
    except Exception:  # noqa: BLE001 - nodes without a schema
        return None
    if not s or s.startswith("(no schema)") or "(" not in s:
        return None
    name = s[:s.index("(")].split("::", 1)[-1]
    return name.split(".", 1)[1] if "." in name else ""


def _name(v):
    name = v.debugName()
    return name if _VALID_NAME.match(name) else None


def _copy_block(ts_block, block, g: Graph, env: dict) -> None:
    for tn in ts_block.nodes():
        n = Node(g, tn.kind())
        for v in tn.inputs():
            n.add_input(env[v.unique()])
        for name in tn.attributeNames():
            kind, value = _attribute(tn, name)
            n.set_attr(name, kind, value)
        n.scope = tn.scopeName() or None
        n.source = _source(tn)
        n.overload = _overload(tn)
        block.append_node(n)
        for o in tn.outputs():
            env[o.unique()] = n.add_output(from_torch_type(o.type()), _name(o))
        if tn.kind() == "prim::Constant" and tn.outputsSize() == 1:
            n.value_object = _constant_object(tn)
        for tb in tn.blocks():
            b = n.add_block()
            for v in tb.inputs():
                env[v.unique()] = b.add_input(_name(v), from_torch_type(v.type()))
            _copy_block(tb, b, g, env)
        # outputs registered after the nested blocks: they may return values defined there
    for v in ts_block.outputs():
        block.register_output(env[v.unique()])


def _attribute(tn, name: str) -> tuple:
    kind = tn.kindOf(name)
    if kind == "g":
        return "g", graph_from_torch(tn.g(name))
    if kind == "gs":
        return "gs", [graph_from_torch(x) for x in tn.gs(name)]
    if kind == "ty":
        return "ty", from_torch_type(tn.ty(name))
    if kind == "tys":
        return "tys", [from_torch_type(x) for x in tn.tys(name)]
    if kind in ("c", "cs"):
        return "c", complex(tn.c(name))      # torch names a complex scalar's kind `cs`
    accessor = _SCALAR_ATTRS.get(kind) or _LIST_ATTRS.get(kind)
    if accessor is None:
        raise ValueError(f"{tn.kind()}: attribute {name!r} of unknown kind {kind!r}")
    value = getattr(tn, accessor)(name)
    if kind in _LIST_ATTRS:
        value = list(value)
    return kind, value


def _constant_object(tn):
    """The Python object behind a constant IR text cannot spell (function, script object)."""
    out = tn.output()
    ty = from_torch_type(out.type())
    if isinstance(ty, FunctionType) or out.type().kind() == "FunctionType":
        qual = out.type().annotation_str
        try:
            return torch.jit._state._python_cu.find_function(qual)
        except Exception:      # noqa: BLE001 - unknown function: the runner says so if called
            return None
    if isinstance(ty, ClassType):
        try:
            return out.toIValue()
        except Exception:      # noqa: BLE001
            return None
    return None


def _source(tn):
    try:
        text = tn.sourceRange()
    except Exception:          # noqa: BLE001 - source is only for messages
        return None
    m = _SCRIPT_SOURCE.search(text) or _TRACE_SOURCE.match(text)
    return f"{m.group(1)}:{m.group(2)}" if m else None


_ACCEPTED = ("a scripted or traced function or module (torch.jit.script / torch.jit.trace), "
             "an nn.Module or def function to script, a torch._C.Graph, a pyfuser Graph, IR "
             "text or the path of a .ir file")


def _describe(obj) -> str:
    text = repr(obj)
    return f"{type(obj).__name__} {text[:40] + '...' if len(text) > 40 else text}"


def _script(obj, api: str):
    """A scripted object for `obj`, or a PyfuserError saying why it cannot be one."""
    from ...errors import PyfuserError
    name = getattr(obj, "__qualname__", None) or type(obj).__name__
    if getattr(obj, "__name__", "") == "<lambda>":
        raise PyfuserError(f"{api}: cannot script a lambda ({name}); TorchScript compiles a def "
                           "from its source: pass torch.jit.trace(fn, example_inputs) or a def "
                           "function")
    try:
        return torch.jit.script(obj)
    except Exception as e:     # noqa: BLE001 - torch raises many kinds; one line names it
        first = next((ln.strip() for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        raise PyfuserError(
            f"{api}: cannot script {name}: {type(e).__name__}: {first} (pass "
            "torch.jit.trace(fn, example_inputs) instead)") from None


def torch_graph_of(obj, api: str = "pyfuser.jit"):
    """(inlined torch._C.Graph copy, module or None, name) for a PyTorch object; a
    PyfuserError naming what was given when it is none of what `_ACCEPTED` lists."""
    from ...errors import PyfuserError
    module = None
    if isinstance(obj, torch._C.Graph):
        g = obj.copy()
        torch._C._jit_pass_inline(g)
        return g, None, "graph"
    if isinstance(obj, torch.nn.Module) and not isinstance(obj, torch.jit.ScriptModule):
        obj = _script(obj, api)
    elif isinstance(obj, (torch.jit.ScriptFunction, torch.jit.ScriptModule)):
        pass
    elif callable(obj) and not isinstance(obj, type):
        obj = _script(obj, api)
    else:
        raise PyfuserError(f"{api}: expected {_ACCEPTED}; got {_describe(obj)}")
    if isinstance(obj, torch.jit.ScriptModule):
        module = obj
        if not hasattr(obj, "forward"):
            raise PyfuserError(f"{api}: module {obj.original_name} has no forward method")
    name = getattr(obj, "__name__", None) or getattr(obj, "original_name", "graph")
    return obj.inlined_graph.copy(), module, name


def graph_from_function(obj) -> Graph:
    """Our Graph of a ScriptFunction/ScriptModule/traced object/torch._C.Graph/function."""
    g, _, _ = torch_graph_of(obj)
    return graph_from_torch(g)


__all__ = ["graph_from_torch", "graph_from_function", "torch_graph_of"]
