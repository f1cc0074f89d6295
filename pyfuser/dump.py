"""Debug dumps switched on by one environment variable.

`PYFUSER_DUMP=fusion_ir,cuda_kernel` (comma list) enables the named dumps; each goes to stderr
with a header line. `PYFUSER_DUMP=all` enables every dump. `cuda_to_file` writes kernel sources
to `$PYFUSER_DUMP_DIR` (default `./pyfuser_dump`). Known dump names are listed in DUMP_NAMES;
unknown names are reported once so typos are visible.

The variable is read on every call (cheap), so tests can set it with monkeypatch.
"""
from __future__ import annotations

import logging
import os
import sys

DUMP_NAMES = {
    "graph_passes": "TorchScript graph after each fuser pass",
    "fusion_groups": "each fusion group and why neighbours were not merged",
    "fx_graph": "each aten FX graph the torch.compile backend gets, and the graph it makes",
    "fusion_ir": "Fusion IR of each fusion, before scheduling",
    "fusion_ir_scheduled": "Fusion IR with the scheduler's transforms applied",
    "segmenter_logging": "which scheduler took or refused which segment, and why",
    "segmented_fusion": "the segments of a fusion, in run order",
    "scheduler_params": "parameters each scheduler chose",
    "kernel_ir": "kernel IR (loop nest, indices, predicates)",
    "cuda_kernel": "generated CUDA C source",
    "cuda_to_file": "write generated CUDA C into $PYFUSER_DUMP_DIR",
    "launch_params": "grid, block and shared memory of each launch",
    "ptxas_verbose": "registers, spills and shared memory of each compiled kernel (ptxas -v)",
    "fallback": "ops and guards that fell back to eager, with the reason",
}

log = logging.getLogger("pyfuser")
_warned: set[str] = set()


def enabled_dumps() -> set[str]:
    raw = os.environ.get("PYFUSER_DUMP", "")
    names = {n.strip() for n in raw.split(",") if n.strip()}
    if "all" in names:
        return set(DUMP_NAMES) - {"cuda_to_file"}
    for n in names - set(DUMP_NAMES):
        if n not in _warned:
            _warned.add(n)
            print(f"[pyfuser] unknown PYFUSER_DUMP entry {n!r}; known: {', '.join(sorted(DUMP_NAMES))}",
                  file=sys.stderr)
    return names


def is_enabled(name: str) -> bool:
    assert name in DUMP_NAMES, name
    return name in enabled_dumps()


def dump(name: str, title: str, text) -> None:
    """Print `text` (a string or a zero-argument callable giving one) under a header, if enabled."""
    if not is_enabled(name):
        return
    body = text() if callable(text) else text
    print(f"===== [{name}] {title} =====\n{body}", file=sys.stderr)


def dump_dir() -> str:
    return os.environ.get("PYFUSER_DUMP_DIR", os.path.join(os.getcwd(), "pyfuser_dump"))
