"""Parser and printer of TorchScript IR: every printed form, round trips, error reporting."""
from __future__ import annotations

import math
import pathlib
import re

import pytest
import torch

from pyfuser.errors import IRParseError
from pyfuser.frontend.torchscript import (ClassType, DictType, IntType, ListType, OptionalType,
                                          TensorType, TupleType, parse_ir, print_graph)
from pyfuser.frontend.torchscript.constants import constant_value

import ts_corpus

EXAMPLES = sorted((pathlib.Path(__file__).parents[2] / "examples").glob("*.ir"))


def structure(g):
    """A comparable summary of a graph: names, types, kinds, attributes, nesting."""
    def attr(kind, v):
        if kind == "g":
            return structure(v) if v is not None else None
        if isinstance(v, torch.Tensor):
            return (str(v.dtype), tuple(v.shape), v.tolist())
        if isinstance(v, float) and math.isnan(v):
            return "nan"
        return v if not isinstance(v, list) else tuple(attr(kind, e) for e in v)

    def block(b):
        return ([(v.debug_name, str(v.type)) for v in b.inputs],
                [(n.kind, [v.debug_name for v in n.inputs],
                  [(v.debug_name, str(v.type)) for v in n.outputs],
                  sorted((k, kd, repr(attr(kd, v))) for k, (kd, v) in n.attributes.items()),
                  [block(x) for x in n.blocks]) for n in b.nodes()],
                [v.debug_name for v in b.outputs])
    return block(g.block)


def roundtrip(text):
    g = parse_ir(text)
    g.lint()
    p1 = print_graph(g)
    g2 = parse_ir(p1)
    g2.lint()
    assert print_graph(g2) == p1
    assert structure(g2) == structure(g)
    return g


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_roundtrip(path):
    g = roundtrip(path.read_text())
    assert len(g.outputs) == 1
    assert all(isinstance(v.type, (TensorType, IntType)) for v in g.inputs)


def test_example_seed000_exact_reprint():
    text = (EXAMPLES[0].parent / "seed000_mul.ir").read_text()
    g = parse_ir(text)
    assert [n.kind for n in g.nodes()][-4:] == ["aten::_to_copy", "aten::add", "aten::mul",
                                                "aten::to"]
    t = g.inputs[2].type
    assert (t.dtype, t.sizes, t.strides, t.device, t.requires_grad) == (
        torch.int32, (10000, 13000), (13000, 1), "cuda:0", False)
    # printing re-indents but keeps every line's content
    assert [l.strip() for l in print_graph(g).splitlines()] == [l.strip() for l in text.splitlines()]


@pytest.mark.parametrize("entry", ts_corpus.CORPUS, ids=lambda e: e[0])
def test_corpus_roundtrip(entry):
    _, text = ts_corpus.build(entry)
    g = roundtrip(text)
    assert len(g.inputs) >= 1 and sum(1 for _ in g.all_nodes()) >= 1


def test_types_print_like_pytorch():
    T, C = torch._C.TensorType, torch._C
    t = torch.randn(2, 3)
    g = C.Graph()
    for ty in [T.create_from_tensor(t).with_sizes([None, 3]), T.get().with_dtype(torch.float32),
               T.create_from_tensor(t.t()), T.create_from_tensor(t.to(torch.bfloat16)),
               T.create_from_tensor(torch.zeros(2, dtype=torch.uint8)),
               T.create_from_tensor(torch.tensor(5)), T.get().with_sizes([2, None]),
               T.get().with_sizes([]), T.create_from_tensor(t.to(torch.complex64)),
               C.OptionalType(C.TupleType([C.IntType.get(), T.get()])),
               C.ListType(C.OptionalType(T.get())), C.ListType(C.ListType(C.IntType.get())),
               C.TupleType([]), C.NumberType.get(), C.AnyType.get(), C.DeviceObjType.get(),
               C.NoneType.get(), C.StringType.get(), C.DictType(C.StringType.get(), T.get()),
               C.FutureType(T.get())]:
        g.addInput().setType(ty)
    text = str(g)
    header = [re.sub(r"(,|\):)\Z", "", l.strip()) for l in text.splitlines() if " : " in l]
    parsed = parse_ir(text)
    assert [f"%{v.debug_name} : {v.type}" for v in parsed.inputs] == [
        h.replace("graph(", "") for h in header]


def test_header_type_forms():
    text = """graph(%a : Float(*, 3), %b : Tensor, %c : Optional[Tensor], %d : (Tensor, int),
      %e : Dict(str, Tensor), %f : __torch__.Foo, %g : int[], %h : Tensor[], %i : number,
      %j : Scalar, %k : Device, %l : NoneType, %m : str, %n : bool, %o : float,
      %p : Half(2, strides=[1], requires_grad=1, device=cuda:0), %q : List[int],
      %r : Long(), %s : Tensor(requires_grad=0), %t : DoubleTensor, %u : Union(int, str),
      %v : NamedTuple(a : Tensor, b : int), %w : Float(4, 4, strides=[4, 1]) [Undefined]):
  return ()"""
    g = parse_ir(text)
    ty = {v.debug_name: v.type for v in g.inputs}
    assert ty["a"] == TensorType(torch.float32, (None, 3))
    assert ty["c"] == OptionalType(TensorType()) and str(ty["c"]) == "Tensor?"
    assert ty["d"] == TupleType((TensorType(), IntType()))
    assert ty["e"] == DictType(ty["m"], TensorType())
    assert ty["f"] == ClassType("__torch__.Foo")
    assert ty["g"] == ListType(IntType()) == ty["q"]
    assert str(ty["i"]) == str(ty["j"]) == "Scalar"
    assert ty["p"].requires_grad is True and ty["p"].device == "cuda:0"
    assert ty["r"].sizes == () and str(ty["r"]) == "Long()"
    assert str(ty["s"]) == "Tensor(requires_grad=0)" and ty["s"].sizes is None
    assert str(ty["t"]) == "DoubleTensor"
    assert str(ty["v"]) == "NamedTuple(a : Tensor, b : int)"
    assert ty["w"].undefined
    roundtrip(text)


CONSTANTS = r"""graph():
  %0 : int = prim::Constant[value=-5]()
  %1 : float = prim::Constant[value=1.0000000000000001e-05]()
  %2 : float = prim::Constant[value=inf]()
  %3 : float = prim::Constant[value=-inf]()
  %4 : float = prim::Constant[value=nan]()
  %5 : bool = prim::Constant[value=1]()
  %6 : str = prim::Constant[value="he\"llo\n\t\'\001"]()
  %7 : Device = prim::Constant[value="cuda:0"]()
  %8 : NoneType = prim::Constant()
  %9 : int[] = prim::Constant[value=[1, -2]]()
  %10 : float[] = prim::Constant[value=[1., 2.5]]()
  %11 : Tensor = prim::Constant[value=<Tensor>]()
  %12 : Long(requires_grad=0, device=cpu) = prim::Constant[value={2}]()
  %13 : Long(2, 2, strides=[2, 1], requires_grad=0, device=cpu) = prim::Constant[value= 1  2  3  4 [ CPULongType{2,2} ]]()
  %14 : Float(2, strides=[1], requires_grad=0, device=cpu) = prim::Constant[value=1e-05 *  1.0000  2.0000 [ CPUFloatType{2} ]]()
  %15 : Tensor = prim::Constant[value=[ CPUFloatType{0} ]]()
  %16 : complex = prim::Constant[value=1.+2.j]()
  %17 : bool[] = prim::Constant[value=[True, False]]()
  %18 : (int, int) = prim::Constant[value=(1, 2)]()
  %19 : str[] = prim::Constant[value=["a", "b"]]()
  %20 : float = prim::Constant[value=1.]()
  %21 : Function = prim::Constant[name="fallback_function", fallback=1]()
  return (%0)
"""


def test_every_constant_kind():
    g = roundtrip(CONSTANTS)
    nodes = list(g.nodes())
    vals = {}
    for n in nodes:
        if n.output().debug_name not in ("11", "21"):
            vals[int(n.output().debug_name)] = constant_value(n)
    assert vals[0] == -5 and vals[1] == 1e-05 and vals[2] == math.inf and vals[3] == -math.inf
    assert math.isnan(vals[4]) and vals[5] is True
    assert vals[6] == "he\"llo\n\t'\x01"
    assert vals[7] == torch.device("cuda:0") and vals[8] is None
    assert vals[9] == [1, -2] and vals[10] == [1.0, 2.5]
    assert vals[12].dtype == torch.int64 and vals[12].shape == () and vals[12].item() == 2
    assert vals[13].tolist() == [[1, 2], [3, 4]]
    assert torch.allclose(vals[14], torch.tensor([1e-5, 2e-5]))
    assert vals[15].numel() == 0
    assert vals[16] == 1 + 2j and vals[17] == [True, False] and vals[18] == (1, 2)
    assert vals[19] == ["a", "b"] and vals[20] == 1.0 and isinstance(vals[20], float)
    assert nodes[11].attributes["value"] == ("t", None)
    assert nodes[21].attributes == {"name": ("s", "fallback_function"), "fallback": ("i", 1)}


def test_comments_scopes_and_log_prefixes():
    text = """[DUMP graph_fuser.cpp:2538] Before Fusion:
[DUMP graph_fuser.cpp:2538] graph(%x : Tensor): # a header comment
[DUMP graph_fuser.cpp:2538]   %1 : int = prim::Constant[value=1](), scope: __module.bn # f.py:3:4
[DUMP graph_fuser.cpp:2538]   %y : Tensor = aten::add(%x, %x, %1) # f.py:5:11
[DUMP graph_fuser.cpp:2538]     return x + x
[DUMP graph_fuser.cpp:2538]            ~~~~~ <--- HERE
[DUMP graph_fuser.cpp:2538]   return (%y)
"""
    g = parse_ir(text)
    n1, n2 = list(g.nodes())
    assert n1.scope == "__module.bn" and n2.source == "f.py:5:11"
    assert (n2.src_line, n2.src_col) == (4, 31)
    assert "# f.py:5:11" in print_graph(g, with_source=True)
    assert "#" not in print_graph(g)


def test_real_fusion_groups_and_nested_with():
    texts = ts_corpus.optimized_graph_texts()
    te = roundtrip(texts["te"][0])
    groups = [n for n in te.all_nodes() if n.subgraph is not None]
    assert [n.kind for n in groups] == ["prim::TensorExprGroup"]
    assert "aten::sigmoid" in [n.kind for n in groups[0].subgraph.nodes()]
    ad = roundtrip(texts["autodiff"][0])
    assert [n.kind for n in ad.all_nodes() if n.subgraph is not None] == ["prim::DifferentiableGraph"]
    nested = """graph(%a : Tensor):
  %b : Tensor = prim::DifferentiableGraph_0(%a)
  %c : Tensor = prim::FusionGroup_1(%b)
  return (%c)
with prim::DifferentiableGraph_0 = graph(%x : Tensor):
  %y : Tensor = prim::DifferentiableGraph_0(%x)
  return (%y)
with prim::DifferentiableGraph_0 = graph(%p : Tensor):
  %q : Tensor = aten::relu(%p)
  return (%q)
with prim::FusionGroup_1 = graph(%u : Tensor):
  %v : Tensor = aten::neg(%u)
  return (%v)
"""
    g = roundtrip(nested)
    outer, fg = list(g.nodes())
    inner = next(outer.subgraph.nodes())
    assert inner.kind == "prim::DifferentiableGraph"
    assert [n.kind for n in inner.subgraph.nodes()] == ["aten::relu"]
    assert fg.kind == "prim::FusionGroup" and [n.kind for n in fg.subgraph.nodes()] == ["aten::neg"]
    opaque = parse_ir("graph(%a : Tensor):\n  %b : Tensor = prim::CudaFusionGroup[Subgraph=<Graph>](%a)\n  return (%b)\n")
    assert next(opaque.nodes()).attributes["Subgraph"] == ("g", None)
    assert "[Subgraph=<Graph>]" in print_graph(opaque)


def test_blocks_and_zero_output_nodes():
    text = """graph(%n : int, %x : Tensor):
  %t : bool = prim::Constant[value=1]()
  %s : str = prim::Constant[value="boom"]()
  %r : Tensor = prim::Loop(%n, %t, %x)
    block0(%i : int, %acc : Tensor):
      %c : bool = aten::gt(%i, %n)
       = prim::If(%c)
        block0():
           = prim::RaiseException(%s)
          -> ()
        block1():
          -> ()
      %acc2 : Tensor = aten::mul(%acc, %acc)
      -> (%t, %acc2)
  return (%r)
"""
    g = roundtrip(text)
    loop = list(g.nodes())[2]
    assert loop.kind == "prim::Loop" and [v.debug_name for v in loop.blocks[0].inputs] == ["i", "acc"]
    inner_if = list(loop.blocks[0].nodes())[1]
    assert inner_if.outputs == () and len(inner_if.blocks) == 2
    assert next(inner_if.blocks[0].nodes()).kind == "prim::RaiseException"


@pytest.mark.parametrize("text, line, col, words", [
    ("graph(%x : Tensor):\n  %y : Tensor = aten::relu(%z)\n  return (%y)\n", 2, 28, "undefined value %z"),
    ("graph(%x : Tensor):\n  %x : Tensor = aten::relu(%x)\n  return (%x)\n", 2, 3, "defined twice"),
    ("graph(%x : Tensor):\n  %y : Tensor = aten::relu(%x\n  return (%y)\n", 3, 3, "expected `,` or `)`"),
    ("graph(%x : Tensr):\n  return (%x)\n", 1, 12, "unknown type `Tensr`"),
    ("graph(%x : Tensor):\n  %y : Tensor = relu(%x)\n  return (%y)\n", 2, 17, "operator name"),
    ("graph(%c : bool):\n  %y : int = prim::If(%c)\n    block0():\n      %a : int = prim::Constant[value=1]()\n      -> (%a)\n    block1():\n      -> ()\n  return (%y)\n", 7, 7, "block returns 0 values"),
    ("graph(%c : bool):\n  %y : int = prim::If(%c)\n    block0():\n      %a : int = prim::Constant[value=1]()\n      -> (%a)\n    block1():\n      -> (%a)\n  return (%y)\n", 7, 11, "outside the block"),
    ("graph(%x : Tensor):\n  return (%x)\nwith prim::FusionGroup_0 = graph(%a : Tensor):\n  return (%a)\n", 3, 1, "names no group"),
    ("graph(%x : Tensor):\n  %y : int = prim::Constant[value=1 2]()\n  return (%y)\n", 2, 35, "expected `,` or `]`"),
    ("", 1, 1, "expected `graph(`"),
    ("graph(%x : Tensor):\n  %y : Tensor = aten::relu(%x)\n", 3, 1, "found end of input"),
])
def test_parse_errors_name_line_column(text, line, col, words):
    with pytest.raises(IRParseError) as ei:
        parse_ir(text)
    e = ei.value
    assert (e.line, e.column) == (line, col), str(e)
    assert words in str(e)
    lines = text.splitlines()
    assert e.source_line == (lines[line - 1] if line <= len(lines) else "")
