"""Lowering of TorchScript graphs (or fusion-group subgraphs) to Fusion IR.

`lower_graph(graph, example_inputs=None) -> LoweredGraph` builds a Fusion from a graph whose nodes
all have entries in the aten lowering table (aten_table.py); `node_support(node)` says whether one
node can be lowered (and why not), which the graph fuser uses to pick fusible nodes.
"""
from .lower import LoweredGraph, lower_graph, node_support  # noqa: F401
from .registry import LOWERINGS  # noqa: F401
