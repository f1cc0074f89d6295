"""TorchScript frontend: parse IR text to a Graph, print it back, run it eagerly.

    from pyfuser.frontend.torchscript import parse_ir, run_graph, make_inputs
    g = parse_ir(text)                  # IRParseError(line, column) on bad text
    print(g)                            # same text format as PyTorch
    outs = run_graph(g, make_inputs(g, device="cpu", seed=0), device="cpu")
"""
from .from_torch import graph_from_function, graph_from_torch
from .graph import Block, Graph
from .inputs import make_inputs
from .lint import LintError
from .node import Node, Use, Value
from .parser import parse_ir
from .printer import node_line, print_graph
from .runner import NodeHandler, RunContext, run_graph
from .types import (AnyType, BoolType, ClassType, ComplexType, ContainerType, DeviceType,
                    DictType, FloatType, FunctionType, IntType, JitType, ListType, NoneType,
                    NumberType, OptionalType, StringType, TensorType, TupleType, UnionType)

__all__ = [
    "parse_ir", "print_graph", "node_line", "run_graph", "make_inputs", "graph_from_function",
    "graph_from_torch",
    "Graph", "Block", "Node", "Value", "Use", "LintError", "RunContext", "NodeHandler",
    "JitType", "TensorType", "IntType", "FloatType", "BoolType", "StringType", "ComplexType",
    "DeviceType", "NoneType", "NumberType", "AnyType", "FunctionType", "ListType",
    "OptionalType", "TupleType", "DictType", "UnionType", "ContainerType", "ClassType",
]
