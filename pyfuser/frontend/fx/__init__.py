"""The torch.compile backend: aten FX graphs from AOTAutograd, fused into pyfuser regions.

    torch.compile(model, backend="pyfuser")     # registered as an entry point: no import needed
    pyfuser.compile(model, dynamic=True)        # the same, through pyfuser

Modules: `backend.py` (the Dynamo backend, AOTAutograd, decompositions), `compile_graph.py`
(one FX graph: support, partition, lowering, rewrite), `support.py` (which nodes may fuse),
`partition.py` (convex regions), `lower.py` (a region -> a Fusion through the lowering table
TorchScript uses), `region.py` (the fused region's run-time call), `meta.py` (example values
read without guards). Design and limits: docs/compile_backend.md.
"""
from .backend import compile, decompositions, pyfuser_backend  # noqa: F401,A004
from .compile_graph import compiled_graphs, reset_compiled  # noqa: F401
