"""The table of TorchScript node kinds pyfuser lowers, and the decorator that fills it.

Each entry records the handler (node arguments -> Fusion IR values), the op's class (pointwise,
metadata, reduction, normalization: the graph fuser only groups classes some scheduler runs),
and which argument positions must be compile-time constants.

Invariant: one entry per node kind; in-place kinds (`aten::add_`) are not here: the graph fuser
makes them functional first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

POINTWISE, METADATA, REDUCTION, NORMALIZATION = "pointwise", "metadata", "reduction", "normalization"
# random numbers drawn in the kernel (Philox): the torch.compile backend fuses them; the
# TorchScript fuser does not group this class (its graphs keep eager's generator)
RANDOM = "random"
# tensors made from numbers alone (scalar_tensor, full): the torch.compile backend fuses them
# into regions that also read a tensor on their device; the TorchScript fuser does not group
# this class
FACTORY = "factory"
# sums of rows into the positions another tensor holds (embedding_dense_backward): a kernel of
# their own (the embedding_backward scheduler); the torch.compile backend fuses them, the
# TorchScript fuser does not group this class
SCATTER = "scatter"


@dataclass(frozen=True)
class Lowering:
    kind: str
    handler: Callable        # handler(*args) -> Val | tuple of Val (one per node output)
    op_class: str
    const_args: tuple        # positions that must be constants (dims, sizes, dtypes, flags)
    n_args: tuple            # accepted argument counts (empty: any)
    # node -> op class, for ops whose class depends on constant arguments (batch_norm in
    # inference mode is pointwise); None: always `op_class`.
    classify: Callable | None = None
    # node -> None, or why this node's arguments (their structure, as the graph holds it)
    # cannot be lowered: the graph fuser then leaves the node out of its groups rather than
    # letting the whole group fall back when the handler refuses. None: no such check.
    check: Callable | None = None

    def class_of(self, node) -> str:
        return self.classify(node) if self.classify is not None else self.op_class


LOWERINGS: dict[str, Lowering] = {}


def lowers(*kinds: str, op_class: str = POINTWISE, const_args=(), n_args=(), classify=None,
           check=None):
    def register(fn):
        for k in kinds:
            assert k not in LOWERINGS, k
            LOWERINGS[k] = Lowering(k, fn, op_class, tuple(const_args), tuple(n_args), classify,
                                    check)
        return fn
    return register
