"""Frontends: readers of the programs pyfuser compiles.

`torchscript/` parses TorchScript IR text into a Graph (and prints and eagerly runs it);
`definition.py` is the FusionDefinition builder API; `lowering/` turns TorchScript nodes into
Fusion IR.
"""
