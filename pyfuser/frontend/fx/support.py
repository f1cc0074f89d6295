"""Which nodes of an aten FX graph may enter a fused region, and why the others may not.

`node_support(node, graph_outputs)` answers (True, "") or (False, reason) from the node alone:
- a call of an aten OpOverload with an entry in the lowering table (the one TorchScript uses,
  through lowering/aten_overloads.py) of a class some scheduler runs (pointwise, metadata,
  reductions, normalizations; random numbers, which pointwise kernels generate);
- not an overload that writes an argument (in-place, out=): the functionalized graphs
  AOTAutograd hands over have none but the `copy_` of each mutated input, which may join the
  region computing its value as an in-place output (mutations.py: `copy_support` says when);
- tensor outputs (a tuple of them, or None where the op leaves an optional one out) and tensor
  operands of dtypes pyfuser has (complex excluded), every tensor on one device (CUDA or CPU);
- other arguments: numbers, None, dtypes, devices, layouts, memory formats, strings, lists of
  them, and SymInts (FX nodes or values): sizes known at run time under dynamic shapes;
- what eager does differently from a kernel writing a fresh tensor in eager's layout stays out:
  `_to_copy` to another device, a copy into a memory format its input is not in (but for
  `clone` into contiguous_format, which the kernel writes row-major, and the `*_like`
  factories, which read no value), a random op
  given its own generator, a max pool (or its gradient) whose result is channels-last (its
  lowering writes row-major: `_ROW_MAJOR_RESULTS`), and a view op whose result the graph
  returns (a view stays a view), and the view ops between a returned view and an input or
  output it views (`returned_views`);
- `operator.getitem` of a fusible node's tuple result goes wherever that node goes.

`is_size_arithmetic(node)`: a SymInt (SymFloat, SymBool) computed on the host under dynamic
shapes, from other sizes (`s0 * s1`) or a tensor's sizes (`sym_size`): no tensor op, so no
candidate for a region (regions read its value as a scalar input) and not reported as unfused.

The lowering can still refuse a node (a handler raising UnsupportedOpError on these particular
arguments): the compiler then marks it unsupported with that reason and partitions again.
"""
from __future__ import annotations

import operator

import torch

from ...ir.dtypes import DataType
from .meta import has_format, meta
from .mutations import copy_support, is_input_copy
from ..lowering.aten_overloads import argument_names, entry_for, is_mutable, schema_args
from ..lowering.registry import (FACTORY, METADATA, NORMALIZATION, POINTWISE, RANDOM, REDUCTION,
                                 SCATTER)

FUSIBLE_CLASSES = frozenset({POINTWISE, METADATA, REDUCTION, NORMALIZATION, RANDOM, FACTORY,
                             SCATTER})
_PLAIN_ARGS = (bool, int, float, str, torch.dtype, torch.device, torch.layout,
               torch.memory_format, type(None))
_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)
# size queries: they read a tensor's metadata, never its values
_SIZE_QUERIES = (torch.ops.aten.sym_size.int, torch.ops.aten.sym_stride.int,
                 torch.ops.aten.sym_numel.default, torch.ops.aten.sym_storage_offset.default)
# copies whose lowering lays a contiguous_format result out row-major (a SetOp marked contiguous)
_CONTIGUOUS_COPIES = (torch.ops.aten.clone.default,)
# factories shaped like a tensor: a fresh row-major value in any memory format (the region hands
# back eager's strides); their input is not read
_FRESH_LIKE = (torch.ops.aten.zeros_like.default, torch.ops.aten.ones_like.default,
               torch.ops.aten.full_like.default, torch.ops.aten.empty_like.default)


def tensor_metas(value) -> list | None:
    """The tensors of a node's value (a tensor or a tuple/list of tensors and Nones); None when
    it holds anything else."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)) and all(isinstance(v, torch.Tensor) or v is None
                                                for v in value):
        return [v for v in value if v is not None]
    return None


def is_getitem(node) -> bool:
    return node.op == "call_function" and node.target is operator.getitem


def op_class(node) -> str | None:
    if node.op != "call_function":
        return None
    entry = entry_for(node.target)
    return entry.op_class if entry is not None else None


def is_compute(node) -> bool:
    """A fusible node that computes values (not a view and not a getitem)."""
    cls = op_class(node)
    return cls is not None and cls != METADATA


def is_size_arithmetic(node) -> bool:
    """A host size computation under dynamic shapes (see the module docstring)."""
    if node.op != "call_function" or not isinstance(meta(node), _SYM):
        return False
    return node.target in _SIZE_QUERIES or all(isinstance(meta(a), _SYM)
                                               for a in node.all_input_nodes)


def _dtype_ok(t: torch.Tensor) -> bool:
    if t.dtype.is_complex:
        return False
    try:
        DataType.from_torch(t.dtype)
    except ValueError:
        return False
    return True


def _arg_ok(a) -> bool:
    if isinstance(a, torch.fx.Node):
        v = meta(a)
        return isinstance(v, (torch.Tensor,) + _SYM)
    if isinstance(a, (list, tuple)):
        return all(_arg_ok(x) for x in a)
    return isinstance(a, _PLAIN_ARGS + _SYM)


def _tensor_args(args) -> list:
    out = []
    for a in args:
        if isinstance(a, torch.fx.Node) and isinstance(meta(a), torch.Tensor):
            out.append(meta(a))
        elif isinstance(a, (list, tuple)):                    # a tensor list (cat)
            out += [meta(x) for x in a if isinstance(x, torch.fx.Node) and
                    isinstance(meta(x), torch.Tensor)]
    return out


def returned_views(graph, out_node) -> tuple[set, bool]:
    """(the returned views that alias a graph input or another output, with the view ops between
    each and that base; whether the graph changed). AOTAutograd rebuilds such an output from
    its base and the view the compiled graph returned (its sizes, strides and storage offset:
    under dynamic shapes it cannot replay the view ops), so the chain must be eager's views, none
    a region's copy: `v = x.view(n, 1, n)[..., :-1]`, read by a mul and returned sliced again
    (`v[..., 1:]`), got the copy's strides and offset applied to x (FX dynamic seed 918100); of
    `b = x.exp()` returned beside `b.view(...)[..., :-1][..., 1:]`, other values in grad mode,
    else a copy that aliased nothing. Such views stay out of regions (`node_support`); a node
    outside them that reads one (the mul) reads a copy of the chain instead, which a region may
    take in (no kernel more). A returned view of a value nothing else returned keeps its views in
    the region (a view at the region's end is a host view of the kernel's output)."""
    returned = set(out_node.all_input_nodes)
    chains = set()
    for n in returned:
        walk, m = [], n
        while _is_view(m) and m.args and isinstance(m.args[0], torch.fx.Node):
            m = m.args[0]
            walk.append(m)
        anchors = [i for i, a in enumerate(walk) if a in returned or a.op == "placeholder"]
        if anchors:
            chains.add(n)
            chains.update(a for a in walk[:anchors[-1]])
    copies: dict = {}

    def copy_of(c):
        if c not in chains:
            return c
        if c not in copies:
            base, old = copy_of(c.args[0]), c.args[0]
            with graph.inserting_after(c):
                copies[c] = graph.node_copy(c, lambda a: base if a is old else a)
        return copies[c]

    for c in [n for n in graph.nodes if n in chains]:
        for u in list(c.users):
            if u is not out_node and u not in chains:
                u.replace_input_with(c, copy_of(c))
    return chains, bool(copies)


def _is_view(node) -> bool:
    return op_class(node) == METADATA or (node.op == "call_function" and
                                          node.target is torch.ops.aten.alias.default)


def node_support(node, graph_outputs=frozenset()) -> tuple[bool, str]:
    if node.op != "call_function":
        return False, f"{node.op} node"
    target = node.target
    if is_input_copy(node):
        why = copy_support(node)
        if not why and not all(_dtype_ok(t) for t in _tensor_args(node.args)):
            why = f"{target}: a dtype pyfuser does not have"
        return not why, why
    entry = entry_for(target)
    if entry is None:
        return False, f"{target} has no lowering"
    if entry.op_class not in FUSIBLE_CLASSES:
        return False, f"{entry.op_class} ops are not fused"
    if is_mutable(target):
        return False, f"{target} writes an argument"
    try:
        args = schema_args(target, node.args, node.kwargs)
    except ValueError as e:
        return False, str(e)
    if entry.n_args and len(args) not in entry.n_args:
        return False, f"{target} with {len(args)} arguments is not lowered"
    if not all(_arg_ok(a) for a in args):
        return False, f"{target}: an argument is neither a tensor, a number nor a size"
    outs = tensor_metas(meta(node))
    if not outs:
        return False, f"{target}: its result is not a tensor (or a tuple of tensors)"
    ins = _tensor_args(args)
    tensors = ins + outs
    if not all(_dtype_ok(t) for t in tensors):
        return False, f"{target}: a dtype pyfuser does not have ({sorted({str(t.dtype) for t in tensors})})"
    devices = {t.device for t in tensors if t.dim() > 0 or t.device.type != "cpu"}
    devices = devices or {t.device for t in tensors}
    if len(devices) != 1 or next(iter(devices)).type not in ("cuda", "cpu"):
        return False, f"{target}: tensors on {sorted(map(str, devices))} (one CUDA or CPU device)"
    if entry.op_class == METADATA and node in graph_outputs:
        return False, "a view the graph returns stays a view"
    why = _special(target, dict(zip(argument_names(target), args)), ins, outs)
    if why:
        return False, why
    return True, ""


def _special(target, named, ins, outs) -> str:
    """Reasons particular to an op's arguments (see the module docstring)."""
    # (the inputs' devices against the result's, not the argument: `device="cuda"` names
    # cuda:0 when that is current; a 0-dim CPU tensor is read as a scalar wherever it is)
    if named.get("device") is not None and any(
            t.device != outs[0].device and (t.dim() > 0 or t.device.type != "cpu") for t in ins):
        return f"{target}: a copy to another device"
    fmt = named.get("memory_format")
    contiguous_copy = (fmt is torch.contiguous_format and target in _CONTIGUOUS_COPIES) or \
        target in _FRESH_LIKE
    if fmt is not None and fmt is not torch.preserve_format and ins and not contiguous_copy \
            and not has_format(ins[0], fmt):
        return f"{target}: a copy into {fmt}, which its input is not in"
    if named.get("generator") is not None:
        return f"{target}: a random op with its own generator"
    if target in _ROW_MAJOR_RESULTS and not all(t.is_contiguous() for t in outs):
        return (f"{target}: a result in other strides than row-major (channels-last), which its "
                "kernel does not write")
    return ""


# ops whose lowering writes row-major results only (aten_pooling.py's views of [..., H * W])
_ROW_MAJOR_RESULTS = {torch.ops.aten.max_pool2d_with_indices.default,
                      torch.ops.aten.max_pool2d_with_indices_backward.default}
