"""The generator's state as an operand: ops that draw random numbers keep their graph order.

Every op that draws from PyTorch's global generator (an eager `multinomial`, `randperm`,
`bernoulli`; attention with dropout; and the random ops a fused region draws, whose launches
take their seed and offset from the same generator, runtime/rng.py) reads the state the
previous one left and leaves a new one: an edge that FX's graph does not show. Two such ops run
in the other order draw other numbers than eager does (each the other's), so the edge is made
explicit: `rng_links(nodes)` maps every random op but the first to the random op before it in
graph order, and `operands(node, links)` is what the node needs to run, its FX inputs and that
link. The partition walk (partition.py) checks convexity and records what each region needs
over these operands, the ready positions of the sibling joins (sibling_joins.py) follow them,
and the unit order (`partition.unit_order`) places each unit after them. So no join makes a
random op wait for a region that needs a later random op (a cycle, refused like any other), and
where a join delays a random op (an eager `multinomial` reading a region that waits for a later
matmul), the random ops after it wait too rather than draw first.

A random op is an OpOverload tagged `nondeterministic_seeded`, but an attention whose
`dropout_p` is the number 0 (eager's kernels draw nothing then: SDPA in inference graphs).
"""
from __future__ import annotations

import torch


def consumes_rng(node) -> bool:
    """Whether `node` draws from (advances) the global generator (module docstring)."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload) or \
            torch.Tag.nondeterministic_seeded not in target.tags:
        return False
    for i, a in enumerate(target._schema.arguments):
        if a.name == "dropout_p":
            p = node.kwargs.get(a.name, node.args[i] if i < len(node.args) else a.default_value)
            return not (isinstance(p, (int, float)) and p == 0)
    return True


def rng_links(nodes) -> dict:
    """random op -> the random op before it in `nodes` (graph order); the first has none."""
    links, last = {}, None
    for n in nodes:
        if consumes_rng(n):
            if last is not None:
                links[n] = last
            last = n
    return links


def operands(node, links: dict) -> list:
    """The nodes `node` needs before it runs: its FX inputs and its link (rng_links)."""
    ins = node.all_input_nodes
    prev = links.get(node)
    return ins if prev is None or prev in ins else ins + [prev]
