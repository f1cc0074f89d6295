"""Input mutations of an aten FX graph written by the region that computes the new value.

AOTAutograd's graphs are functional: every input the program mutates (batch norm's running
statistics and `num_batches_tracked`, an accumulator's `acc.mul_(0.9)`) is written back by an
`aten.copy_.default(placeholder, new_value)` node at the graph's end. Left to FX, each is one
aten call and one copy kernel (a ResNet-18 training forward: 60). Here such a copy_ joins the
region computing `new_value`, as an *in-place output* of its Fusion (`Fusion.aliases`, output ->
input, the form TorchScript's batch norm uses): the kernel computing the value writes it into the
input's storage where the kernel plan finds that safe (`KernelPlan.inplace`), else the runtime
copies it in after the region's last kernel (segment/runtime.apply_aliases). Either way the
region returns the input itself in the copy_'s place, which is what copy_ returns.

`copy_support(node)`: "" when the copy_ may fuse, else why not, from the node alone:
- it writes a graph input (a placeholder), the only copy_ into that input;
- source and destination have one dtype (copy_ would cast), one shape (it would broadcast;
  SymInt sizes must be the same symbols) and one device, and no `non_blocking`;
- the destination is dense and non-overlapping in its example value (an expanded input's
  elements share memory: which write wins is eager's kernel's business).

`placement_problem(node, region_of)`: "" when the copy_ sits in the region of its source and
every other reader of its destination is in that region too (those reads must see the old
value: inside the region the kernels order them before the write; a reader outside could run
after the region and see the new value, where the graph's copy_ comes last), and so is every
reader of a view of the input taken in the region (the region returns such a view as a host
view of the input itself, which the kernel writes). The graph's output node may return the
input or a view of it (it sees the written tensor, as after eager's copy_).

`lower_copy(node, env)`: the in-place output, a `set` of the source's value (a distinct output:
the source may also be a region output of its own, which must keep its value when the input is
written again later) aliased to the destination's fusion input.

AOTAutograd gives mutated inputs that alias other inputs a synthetic base (the graph then views
the base), so a mutated placeholder shares no memory with another placeholder; graphs compiled
directly (`compile_graph`) must keep to that too.
"""
from __future__ import annotations

import operator

import torch

from ...ir import builder as B
from ...ir.fusion import Fusion
from ...ir.tensor import TensorView
from ..lowering.aten_overloads import schema_args
from .meta import layout, meta

COPY = torch.ops.aten.copy_.default


def is_input_copy(node) -> bool:
    return node.op == "call_function" and node.target is COPY


def _same_size(a, b) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a == b
    ea, eb = (getattr(getattr(x, "node", None), "expr", None) for x in (a, b))
    return ea is not None and ea == eb


def copy_support(node) -> str:
    try:
        dst, src, non_blocking = schema_args(COPY, node.args, node.kwargs)
    except ValueError as e:
        return str(e)
    if not isinstance(dst, torch.fx.Node) or not isinstance(src, torch.fx.Node):
        return "copy_: not a copy of one tensor into another"
    if non_blocking:
        return "copy_: non_blocking"
    if dst.op != "placeholder":
        return "copy_ into a value the graph computes (not an input)"
    d, s = meta(dst), meta(src)
    if not isinstance(d, torch.Tensor) or not isinstance(s, torch.Tensor):
        return "copy_: not a copy of one tensor into another"
    if d.dtype != s.dtype:
        return f"copy_ casts {s.dtype} to {d.dtype}"
    if d.dim() != s.dim() or not all(_same_size(a, b) for a, b in zip(d.shape, s.shape)):
        return f"copy_ broadcasts {list(s.shape)} to {list(d.shape)}"
    if d.device != s.device:
        return "copy_ to another device"
    if not layout(d)[1]:
        return "copy_ into an input that is not dense"
    if sum(is_input_copy(u) for u in dst.users) != 1:
        return "copy_: several copies into one input"
    return ""


def _returns_a_view(n) -> bool:
    """Whether node n's value may share memory with an argument: an op whose schema returns an
    alias (a view, split's list of views) or a getitem of such a list."""
    if n.op != "call_function":
        return False
    if n.target is operator.getitem:
        return True
    schema = getattr(n.target, "_schema", None)
    return schema is None or any(r.alias_info is not None and not r.alias_info.is_write
                                 for r in schema.returns)


def placement_problem(node, region_of) -> str:
    """Why a supported copy_ cannot stay where the partition put it ("" when it can):
    `region_of(n)` is the region holding node n, or None. A view of the input the region takes
    (a reshape at its input end, returned as a host view of the input) is the input too: a
    reader of it outside the region would see the written value."""
    dst, src = node.args[0], node.args[1]
    r = region_of(node)
    if r is None or region_of(src) is not r:
        return "copy_ whose source no fused region computes"
    if any(u is not node and u.op != "output" and region_of(u) is not r for u in dst.users):
        return "copy_ into an input read outside its region"
    views = [u for u in dst.users if u is not node and _returns_a_view(u)]
    seen = set(views)
    while views:
        v = views.pop()
        for u in v.users:
            if u.op != "output" and region_of(u) is not r:
                return "copy_ into an input a view of which is read outside its region"
            if u not in seen and _returns_a_view(u):
                seen.add(u)
                views.append(u)
    return ""


class CopyLoweringError(ValueError):
    pass


def lower_copy(node, env) -> TensorView:
    fusion = Fusion.current()
    dst, src = env.get(node.args[0]), env.get(node.args[1])
    if not isinstance(dst, TensorView) or not any(dst is v for v in fusion.inputs):
        raise CopyLoweringError("copy_ into an input the region does not take as a tensor "
                                "(a 0-dim CPU tensor a CUDA region reads by value)")
    if not isinstance(src, TensorView) or src.dtype is not dst.dtype or src.ndim != dst.ndim:
        raise CopyLoweringError("copy_ of a value the region does not compute as a tensor "
                                "of its destination's dtype and rank")
    out = B.set_(src)
    fusion.add_output(out)
    fusion.aliases[out] = dst
    return out
