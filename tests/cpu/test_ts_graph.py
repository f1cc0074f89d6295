"""Graph/Block/Node/Value API: mutation keeps the invariants that lint() checks."""
from __future__ import annotations

import pytest
import torch

from pyfuser.frontend.torchscript import (FloatType, Graph, IntType, LintError, TensorType,
                                          parse_ir, print_graph, run_graph)

TEXT = """graph(%x : Float(2, 3), %y : Float(2, 3)):
  %one : int = prim::Constant[value=1]()
  %a : Tensor = aten::add(%x, %y, %one)
  %b : Tensor = aten::mul(%a, %y)
  %c : Tensor = aten::relu(%b)
  %d : Tensor = aten::add(%c, %a, %one)
  return (%d)
"""


def nodes_by_name(g):
    return {n.output().debug_name: n for n in g.all_nodes() if n.outputs}


def test_values_uses_and_defining_nodes():
    g = parse_ir(TEXT)
    n = nodes_by_name(g)
    a = n["a"].output()
    assert a.node is n["a"] and a.offset == 0 and a.type == TensorType()
    assert sorted((u.user.kind, u.offset) for u in a.uses) == [("aten::add", 1), ("aten::mul", 0)]
    assert g.inputs[0].node is g.param_node
    assert g.outputs[0].uses == [(g.return_node, 0)]
    assert n["d"].owning_block is g.block and n["d"].graph is g
    assert n["a"].is_before(n["d"]) and n["d"].is_after(n["b"]) and not n["c"].is_before(n["b"])


def test_create_insert_point_and_constants():
    g = parse_ir(TEXT)
    n = nodes_by_name(g)
    with g.insert_point(n["c"]):
        k = g.insert_constant(2.0)
        neg = g.insert("aten::mul", [n["b"].output(), k])
    assert k.type == FloatType() and k.node.attributes["value"] == ("f", 2.0)
    assert neg.next is n["c"] and k.node.next is neg
    n["c"].replace_input(0, neg.output())
    assert n["b"].output().uses == [(neg, 0)]
    appended = g.insert("aten::neg", [n["d"].output()])    # default point: the end
    assert appended.next is g.return_node
    g.return_node.replace_input(0, appended.output())
    g.lint()
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    a = x + y
    expect = -(torch.relu(a * y * 2.0) + a)
    torch.testing.assert_close(run_graph(g, [x, y])[0], expect)


def test_replace_all_uses_and_after_node():
    g = parse_ir(TEXT)
    n = nodes_by_name(g)
    a = n["a"].output()
    with g.insert_point(n["b"]):
        a2 = g.insert("aten::neg", [a]).output()
    a.replace_all_uses_after_node_with(a2.node, a2)
    assert [u.user.kind for u in a.uses] == ["aten::neg"]
    assert {u.user.output().debug_name for u in a2.uses} == {"b", "d"}
    g.lint()
    a2.replace_all_uses_with(a)
    a2.node.destroy()
    g.lint()
    assert print_graph(g) == print_graph(parse_ir(TEXT))


def test_move_destroy_and_use_guard():
    g = parse_ir(TEXT)
    n = nodes_by_name(g)
    with pytest.raises(AssertionError):
        n["a"].destroy()                      # still used
    n["c"].move_after(n["d"])                 # now %d uses %c before it is defined
    with pytest.raises(LintError, match="before or outside"):
        g.lint()
    n["c"].move_before(n["d"])
    g.lint()
    n["d"].output().replace_all_uses_with(n["c"].output())
    n["d"].destroy()
    g.lint()
    assert [x.kind for x in g.nodes()] == ["prim::Constant", "aten::add", "aten::mul", "aten::relu"]
    assert "d" not in g._names


def test_inputs_outputs_editing():
    g = parse_ir(TEXT)
    z = g.insert_input(1, "z", IntType())
    assert [v.debug_name for v in g.inputs] == ["x", "z", "y"] and z.offset == 1
    assert g.inputs[2].offset == 2
    g.erase_input(1)
    idx = g.register_output(g.inputs[0])
    assert idx == 1 and len(g.outputs) == 2
    g.erase_output(0)
    assert [v.debug_name for v in g.outputs] == ["x"]
    n = nodes_by_name(g)
    n["a"].insert_input(0, g.inputs[1])
    assert [u.offset for u in g.inputs[0].uses if u.user is n["a"]] == [1]
    n["a"].remove_input(0)
    extra = n["a"].add_output(TensorType(), "extra")
    assert extra.offset == 1 and n["a"].outputs[1] is extra
    n["a"].erase_output(1)
    g.lint()


def test_names_unique_and_renaming():
    g = Graph()
    x = g.add_input("x")
    n1 = g.insert("aten::relu", [x])
    n2 = g.insert("aten::relu", [x])
    n1.output().set_debug_name("h")
    n2.output().set_debug_name("h")
    assert n1.output().debug_name == "h" and n2.output().debug_name == "h.1"
    fresh = g.insert("aten::neg", [x]).output()
    assert fresh.debug_name.isdigit()
    assert len({v.debug_name for v in [x, n1.output(), n2.output(), fresh]}) == 4
    g.register_output(n2.output())
    g.lint()


def test_positions_survive_many_inserts():
    g = parse_ir(TEXT)
    n = nodes_by_name(g)
    anchor = n["b"]
    made = []
    for _ in range(60):                        # always squeeze in just before %b
        m = g.create("prim::Constant")
        m.set_attr("value", "i", 1).output().type = IntType()
        m.insert_before(anchor)
        made.append(m)
    order = list(g.nodes())
    for i, a in enumerate(order):
        for b in order[i + 1:]:
            assert a.is_before(b) and b.is_after(a)
    g.lint()


def test_nested_blocks_is_before_and_copy():
    text = """graph(%c : bool, %x : Tensor):
  %y : Tensor = prim::If(%c)
    block0():
      %p : Tensor = aten::relu(%x)
      -> (%p)
    block1():
      %q : Tensor = aten::neg(%x)
      -> (%q)
  %z : Tensor = aten::mul(%y, %x)
  return (%z)
"""
    g = parse_ir(text)
    n = nodes_by_name(g)
    assert n["p"].is_before(n["z"]) and n["z"].is_after(n["q"])
    assert not n["p"].is_before(n["y"]) and not n["p"].is_after(n["y"])
    g2 = g.copy()
    g2.lint()
    assert print_graph(g2) == print_graph(g)
    assert all(a is not b for a, b in zip(g.all_nodes(), g2.all_nodes()))
    n2 = nodes_by_name(g2)
    n2["z"].set_attr("tag", "s", "copy only")
    assert "tag" not in n["z"].attributes
    n["y"].output().replace_all_uses_with(g.inputs[1])
    n["y"].destroy()                           # destroys the nested blocks too
    g.lint()
    assert "p" not in g._names and "q" not in g._names


def _merge_into_group(g, producer, group):
    """What the fusion pass will do: move `producer` into `group`'s subgraph."""
    sub = group.subgraph
    env = {}
    for i, v in enumerate(producer.inputs):
        group.add_input(v)
        env[v] = sub.insert_input(len(sub.inputs), None, v.type)
    out = producer.output()
    idx = list(group.inputs).index(out)
    with sub.insert_point(next(sub.nodes())):
        clone = sub.create_clone(producer, lambda v: env[v])
        sub.insert_node(clone)
    sub.inputs[idx].replace_all_uses_with(clone.output())
    sub.erase_input(idx)
    group.remove_input(idx)
    producer.destroy()


def test_fusion_style_merge_with_subgraph():
    g = parse_ir(TEXT)
    n = nodes_by_name(g)
    with g.insert_point(n["c"]):
        grp = g.create("prim::FusionGroup", [n["b"].output()], 1)
        g.insert_node(grp)
    sub = Graph()
    s_in = sub.add_input("s_in")
    sub.register_output(sub.insert("aten::relu", [s_in]).output())
    grp.set_g("Subgraph", sub)
    n["c"].output().replace_all_uses_with(grp.output())
    n["c"].destroy()
    _merge_into_group(g, n["b"], grp)
    g.lint()
    assert [x.kind for x in grp.subgraph.nodes()] == ["aten::mul", "aten::relu"]
    assert [v.debug_name for v in grp.inputs] == ["a", "y"]
    text = print_graph(g)
    assert "with prim::FusionGroup_0 = graph(" in text
    g2 = parse_ir(text)
    x, y = torch.randn(2, 3), torch.randn(2, 3)
    a = x + y
    torch.testing.assert_close(run_graph(g2, [x, y])[0], torch.relu(a * y) + a)


def test_lint_detects_broken_use_lists():
    g = parse_ir(TEXT)
    n = nodes_by_name(g)
    n["b"].output().uses.clear()
    with pytest.raises(LintError, match="use list"):
        g.lint()
    g = parse_ir(TEXT)
    g._names.pop("a")
    with pytest.raises(LintError, match="name table"):
        g.lint()
