"""Graphs from torch objects through torch's node API, and the text parser checked against the
installed torch: every constant torch prints parses to the value torch holds."""
from __future__ import annotations

import enum
import math
import warnings
from typing import Dict, List, Optional, Tuple

import pytest
import torch

import pyfuser
from pyfuser.frontend.torchscript import graph_from_function, graph_from_torch, parse_ir, run_graph
from pyfuser.frontend.torchscript.constants import constant_value
from pyfuser.frontend.torchscript.fuse_api import to_graph


def _trace(fn, *args):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.jit.trace(fn, args, check_trace=False)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.device == b.device and a.shape == b.shape and torch.equal(a, b))
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return type(a) is type(b) and a == b


# ----- constants from the node API are exact ------------------------------------------------
def t5_bucket(r):
    return (torch.log(r.float() / 8) / math.log(128 / 8) * 8).to(torch.long)


def scale(x):
    return x * 1.23456789


_BIG = torch.arange(12.0) / 7


def big_constant(x):
    return x + _BIG                      # traced: a 12-element constant (printed `<Tensor>`)


@pytest.mark.parametrize("fn, x", [
    (t5_bucket, torch.arange(8, 128)),
    (scale, torch.full((3,), 1e6)),
    (big_constant, torch.randn(12)),
])
def test_traced_constants_are_exact(fn, x):
    f = pyfuser.jit(_trace(fn, x))
    assert torch.equal(f(x.clone()), fn(x.clone()))


def test_t5_bucket_constant_keeps_every_bit():
    g = graph_from_function(_trace(t5_bucket, torch.arange(8, 128)))
    consts = [constant_value(n) for n in g.nodes() if n.kind == "prim::Constant"
              and isinstance(constant_value(n), torch.Tensor)]
    assert any(c.dtype == torch.float64 and c.item() == math.log(16) for c in consts)


def test_parsed_text_loses_what_torch_prints_short():
    # the reason torch objects are not printed and re-parsed: torch prints 6 digits
    text = str(_trace(t5_bucket, torch.arange(8, 128)).inlined_graph)
    consts = [constant_value(n) for n in parse_ir(text).nodes() if n.kind == "prim::Constant"]
    assert not any(isinstance(c, torch.Tensor) and c.item() == math.log(16) for c in consts)


def test_big_tensor_constant_keeps_its_elements():
    g = graph_from_function(_trace(big_constant, torch.randn(12)))
    t = [constant_value(n) for n in g.nodes() if n.kind == "prim::Constant"
         and isinstance(constant_value(n), torch.Tensor) and constant_value(n).numel() == 12]
    assert len(t) == 1 and torch.equal(t[0], _BIG)


@torch.jit.script
def _helper(x):
    return x * 3


def _calls_helper(x):
    return _helper(x) + 1


def test_function_constant_keeps_the_function():
    sf = torch.jit.script(_calls_helper)
    g = graph_from_torch(sf.graph)            # not inlined: prim::CallFunction stays
    assert any(n.kind == "prim::CallFunction" for n in g.nodes())
    x = torch.randn(4)
    assert torch.equal(run_graph(g, [x])[0], _calls_helper(x))


class Color(enum.Enum):
    RED = 1
    GREEN = 2


def _uses_enum(x, c: Color):
    if c == Color.RED:
        return x + 1
    return x - 1


def test_enum_constants_from_api_and_text():
    sf = torch.jit.script(_uses_enum)
    x = torch.randn(3)
    for g in (graph_from_function(sf), parse_ir(str(sf.inlined_graph))):
        assert torch.equal(run_graph(g, [x, Color.RED])[0], x + 1)
        assert torch.equal(run_graph(g, [x, Color.GREEN])[0], x - 1)


class _Inner(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x)) * 2


class _Outer(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _Inner(), _Inner()

    def forward(self, x):
        return self.b(self.a(x)) + x


def test_traced_module_graph_with_call_method_is_inlined():
    torch.manual_seed(0)
    m = _Outer().eval()
    x = torch.randn(2, 4)
    tm = _trace(m, x)
    assert any(n.kind() == "prim::CallMethod" for n in tm.graph.nodes())
    g, _ = to_graph(tm.graph)
    assert not any(n.kind == "prim::CallMethod" for n in g.all_nodes())
    f = pyfuser.jit(tm.graph)
    torch.testing.assert_close(f(tm, x), m(x), rtol=0, atol=0)


def test_values_keep_names_types_and_blocks():
    def fn(x, n: int):
        if n > 2:
            y = x.relu()
        else:
            y = x.sigmoid()
        return y * n
    sf = torch.jit.script(fn)
    ours, parsed = graph_from_function(sf), parse_ir(str(sf.inlined_graph))
    assert str(ours) == str(parsed)


# ----- the text parser against what the installed torch prints ------------------------------
def _insert_constants():
    g = torch._C.Graph()
    values = [
        0, -7, 2 ** 62, True, False, None, 0.1, -0.0, 1e-300, 5e-324, 1.7976931348623157e308,
        math.inf, -math.inf, math.nan, 1 / 3, 1 + 2j, -0.5j,
        "", "plain", "".join(chr(c) for c in range(128)), "é中😀\x7f\x80\xff", 'q"\\\'',
        [1, -2], [[1], [2, 3]], [1.5, math.inf], ["a", "b\n"], [True, False], [None],
        [1 + 2j], (1,), (), (None, 1), (1, (2.5, "x")), {"a": 1, "b": 2}, {1: "x"},
        torch.device("cpu"), torch.device("cuda:1"), torch.float16, torch.strided,
        torch.tensor(3.5), torch.tensor(7), torch.tensor(True), torch.tensor([1, 2], dtype=torch.uint8),
        torch.tensor([[0.5, -1.25], [2.0, 4.0]]), torch.zeros(2, 3, dtype=torch.bfloat16),
        torch.empty(0), torch.tensor([1 + 1j, 2j]), torch.arange(11.0), [torch.ones(2)],
    ]
    for v in values:
        g.insertConstant(v)
    return g


class _Mode(enum.Enum):
    FAST = "fast"
    SLOW = "slow"


def _scripted_constants(x, m: _Mode):
    a: List[int] = []
    b: Dict[str, int] = {}
    c: Optional[int] = None
    d0: List[int] = []
    d: Tuple[List[int], int] = (d0, 1)
    e: List[Optional[int]] = [None, 1]
    f = torch.empty([0], dtype=torch.float64, layout=torch.strided, device=torch.device("cpu"))
    g = x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x
    fast = m == _Mode.FAST
    return g, a, b, c, d, e, f, fast, [torch.float16, torch.int32], math.pi, float("nan")


def _traced_constants(x):
    return x.new_zeros([]) + x.sum(dim=[]) + x.new_ones([2, 3]).sum(dim=[0, 1]) * 0.1


def _torch_graphs():
    g1 = _insert_constants()
    g2 = torch.jit.script(_scripted_constants).graph.copy()
    g3 = _trace(_traced_constants, torch.randn(3)).graph.copy()
    for g in (g2, g3):
        torch._C._jit_pass_constant_propagation(g)
    return [g1, g2, g3]


def _printed_value_matches(parsed, ref) -> bool:
    if isinstance(ref, torch.Tensor):
        if parsed is None:
            return ref.numel() > 10             # printed `<Tensor>`
        if ref.is_complex():                    # torch prints only the real parts
            return parsed.shape == ref.shape and torch.equal(parsed.real, ref.real)
        return (parsed.dtype == ref.dtype and parsed.shape == ref.shape
                and torch.allclose(parsed.to(ref.dtype), ref, rtol=1e-4, atol=1e-4))
    if isinstance(ref, list) and ref and isinstance(ref[0], torch.Tensor):
        return parsed is None                   # printed `[<Tensors>]`
    return _same(parsed, ref)


@pytest.mark.parametrize("index", range(3))
def test_parser_reads_every_constant_torch_prints(index):
    tg = _torch_graphs()[index]
    text = str(tg)
    g = parse_ir(text)
    api = graph_from_torch(tg)
    ours = [n for n in g.all_nodes() if n.kind == "prim::Constant"]
    from_api = [n for n in api.all_nodes() if n.kind == "prim::Constant"]
    refs = [n for n in tg.findAllNodes("prim::Constant")]
    assert len(ours) == len(refs) == len(from_api) >= 3
    checked = 0
    for tn, n, a in zip(refs, ours, from_api):
        out_type = tn.output().type()
        if out_type.kind() in ("FunctionType", "ClassType"):
            continue
        ref = tn.t("value") if tn.hasAttribute("value") and tn.kindOf("value") == "t" \
            else tn.output().toIValue()
        if isinstance(ref, torch.dtype) or isinstance(ref, torch.layout):
            continue                            # torch holds these as ints in graphs
        try:
            parsed = constant_value(n)
        except ValueError:
            parsed = None                       # `<Tensor>` / `[<Tensors>]`: not printed
        assert _printed_value_matches(parsed, ref), (str(tn).strip(), parsed, ref)
        assert _same(constant_value(a), ref), (str(tn).strip(), constant_value(a), ref)
        checked += 1
    assert checked >= 3
    assert str(parse_ir(str(g))) == str(g)      # our printer's text parses back the same


def test_annotate_constants_in_a_traced_transformer_style_graph():
    text = """graph(%x : Float(3, strides=[1], requires_grad=0, device=cpu)):
  %13 : int[] = prim::Constant[value=annotate(List[int], [])]()
  %14 : Dict(str, Tensor) = prim::Constant[value=annotate(Dict[str, Tensor], {})]()
  %15 : int? = prim::Constant[value=annotate(Optional[int], None)]()
  %16 : Tensor[] = prim::Constant[value=[<Tensors>]]()
  %b : bool = prim::Constant[value=0]()
  %n : NoneType = prim::Constant()
  %s : Float(requires_grad=0, device=cpu) = aten::sum(%x, %13, %b, %n)
  return (%s)
"""
    g = parse_ir(text)
    nodes = list(g.nodes())
    assert constant_value(nodes[0]) == [] and constant_value(nodes[1]) == {}
    assert constant_value(nodes[2]) is None
    with pytest.raises(ValueError, match="not printed"):
        constant_value(nodes[3])
    nodes[3].destroy()                          # not printed: cannot run
    x = torch.randn(3)
    torch.testing.assert_close(run_graph(g, [x])[0], x.sum())
    assert str(parse_ir(str(g))) == str(g)


import ts_corpus  # noqa: E402


@pytest.mark.parametrize("entry", ts_corpus.CORPUS, ids=lambda e: e[0])
def test_api_graph_agrees_with_parsed_text(entry):
    """Same nodes, names, types and (to the digits torch prints) constants either way."""
    obj, text = ts_corpus.build(entry)
    api, parsed = graph_from_torch(obj.inlined_graph), parse_ir(text)
    api.lint()
    a, b = list(api.all_nodes()), list(parsed.all_nodes())
    assert [(n.kind, [str(o.type) for o in n.outputs], [v.debug_name for v in n.inputs])
            for n in a] == [(n.kind, [str(o.type) for o in n.outputs],
                             [v.debug_name for v in n.inputs]) for n in b]
    assert [str(v.type) for v in api.inputs] == [str(v.type) for v in parsed.inputs]
    for x, y in zip(a, b):
        if x.kind != "prim::Constant":
            continue
        try:
            vy = constant_value(y)
        except ValueError:
            continue                            # `<Tensor>`: torch did not print it
        vx = constant_value(x)
        if str(x.output().type) == "Function":
            assert callable(vx) and vy is None  # kept from the object; text cannot spell it
        elif isinstance(vx, torch.Tensor):
            assert torch.allclose(vx, vy.to(vx.dtype), rtol=1e-4, atol=1e-4)
        else:
            assert _same(vx, vy) or vx == vy, (x, vx, vy)
