"""Fuzzing the parser: damaged IR text gives IRParseError (line >= 1) or a sound graph.

A text that still parses must lint cleanly and print to text that parses again; anything
else must be an IRParseError whose line/column point inside (or just past) the text.
"""
from __future__ import annotations

import pathlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pyfuser.errors import IRParseError
from pyfuser.frontend.torchscript import parse_ir, print_graph

import test_ts_parser
import ts_corpus

EXAMPLES = pathlib.Path(__file__).parents[2] / "examples"
_CORPUS_PICK = ("if_else_hi", "for_loop", "constants", "t_tensor_consts", "tuple_ops")
BASES = [p.read_text() for p in sorted(EXAMPLES.glob("*.ir"))] + [
    test_ts_parser.CONSTANTS,
    """graph(%a : Tensor):
  %b : Tensor = prim::DifferentiableGraph_0(%a)
  return (%b)
with prim::DifferentiableGraph_0 = graph(%x : Tensor):
  %y : Tensor = prim::FusionGroup_0(%x)
  return (%y)
with prim::FusionGroup_0 = graph(%p : Tensor):
  %q : Tensor = aten::relu(%p) # f.py:1:2
  return (%q)
""",
] + [ts_corpus.build(e)[1] for e in ts_corpus.CORPUS if e[0] in _CORPUS_PICK]
NASTY = list('%()[]{}:=,"\\#<>-.0123456789aeTj* \n\t') + ["->", "block0", "return", "with ",
                                                              "graph(", "Float(", "prim::If"]

SETTINGS = settings(max_examples=200, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def check(text: str) -> None:
    try:
        g = parse_ir(text)
    except IRParseError as e:
        n_lines = text.count("\n") + 1
        assert 1 <= e.line <= n_lines + 1, (e.line, n_lines)
        assert e.column >= 1
        return
    g.lint()
    printed = print_graph(g)
    assert print_graph(parse_ir(printed)) == printed


@st.composite
def damaged(draw):
    text = draw(st.sampled_from(BASES))
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(["truncate", "replace", "insert", "delete_line",
                                   "swap_lines", "dup_line", "delete_span"]))
        pos = draw(st.integers(0, max(len(text) - 1, 0)))
        lines = text.split("\n")
        i = draw(st.integers(0, len(lines) - 1))
        j = draw(st.integers(0, len(lines) - 1))
        if op == "truncate":
            text = text[:pos]
        elif op == "replace":
            text = text[:pos] + draw(st.sampled_from(NASTY)) + text[pos + 1:]
        elif op == "insert":
            text = text[:pos] + draw(st.sampled_from(NASTY)) + text[pos:]
        elif op == "delete_line":
            text = "\n".join(lines[:i] + lines[i + 1:])
        elif op == "swap_lines":
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
        elif op == "dup_line":
            text = "\n".join(lines[:i] + [lines[j]] + lines[i:])
        else:
            text = text[:pos] + text[pos + draw(st.integers(1, 40)):]
    return text


@SETTINGS
@given(damaged())
def test_damaged_text_gives_parse_error_or_sound_graph(text):
    check(text)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(NASTY + ["%x", "%1", "Tensor", "aten::add", "="]),
                max_size=40).map("".join))
def test_random_token_soup(text):
    check("graph(" + text)


@pytest.mark.parametrize("text", [
    "graph(%x : " + "(" * 3000 + "Tensor" + ")" * 3000 + "):\n  return ()\n",
    "graph(%x : Tensor" + "[]" * 2000 + "):\n  return ()\n",
    "graph():\n  %y : int = prim::Constant[value=" + "[" * 3000 + "]()\n  return ()\n",
    "\x00\x01graph(",
    "graph(%x : Tensor):\n  %y : Tensor = aten::relu(%x)\n  return (%y)\n" + "with " * 3,
])
def test_pathological_inputs(text):
    check(text)


def test_deep_block_nesting_is_a_parse_error():
    depth = 300
    lines = ["graph(%c : bool):"]
    lines += ["= prim::If(%c)\nblock0():"] * depth
    lines += ["-> ()\nblock1():\n-> ()"] * depth
    with pytest.raises(IRParseError, match="nested more than"):
        parse_ir("\n".join(lines + ["return ()"]))


def test_every_truncation_of_an_example():
    text = (EXAMPLES / "seed003_bn_add_relu.ir").read_text()
    for cut in range(0, len(text), 7):
        check(text[:cut])
