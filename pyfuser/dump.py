"""Debug dumps switched on by one environment variable.

`PYFUSER_DUMP=fusion_ir,cuda_kernel` (comma list) enables the named dumps; each goes to stderr
with a header line. `PYFUSER_DUMP=all` enables every dump. `cuda_to_file` writes kernel sources
to `$PYFUSER_DUMP_DIR` (default `./pyfuser_dump`). Known dump names are listed in DUMP_NAMES;
unknown names are reported once so typos are visible. `PYFUSER_DUMP=help` prints every name
with one line each (`help_text()`, once per process, when pyfuser is imported), as does
`python -m pyfuser.dump`.

Names are nvFuser's (NVFUSER_DUMP) where nvFuser has the same dump; where its spelling differs
from ours, DUMP_ALIASES maps it to ours (`launch_param` is `launch_params`, ...). One name means
something else: nvFuser's `fusion_ir` is the IR after scheduling (ours: `fusion_ir_scheduled`),
ours is the IR before (nvFuser's `fusion_ir_presched`, an alias here).

The variable is read on every call (cheap), so tests can set it with monkeypatch.
"""
from __future__ import annotations

import functools
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

# nvFuser's NVFUSER_DUMP spelling -> ours, where the dump is the same and the name differs.
DUMP_ALIASES = {
    "launch_param": "launch_params",
    "fusion_ir_presched": "fusion_ir",
    "fusion_ir_original": "fusion_ir",
    "cuda_full": "cuda_kernel",          # ours is always the complete source, prelude included
}

log = logging.getLogger("pyfuser")
_warned: set[str] = set()
_SPECIAL = ("all", "help")


def help_text() -> str:
    """Every dump name with one line each, then the aliases."""
    width = max(map(len, DUMP_NAMES))
    lines = ["PYFUSER_DUMP=name[,name...] prints to stderr (`all`: every dump but cuda_to_file):"]
    lines += [f"  {n:<{width}}  {what}" for n, what in DUMP_NAMES.items()]
    lines.append("nvFuser's NVFUSER_DUMP spellings that differ from ours work too: " +
                 ", ".join(f"{a} = {n}" for a, n in DUMP_ALIASES.items()))
    return "\n".join(lines)


def _print_help_once() -> None:
    if "help" not in _warned:
        _warned.add("help")
        print(help_text(), file=sys.stderr)


def enabled_dumps() -> set[str]:
    return set(_enabled(os.environ.get("PYFUSER_DUMP", "")))


@functools.lru_cache(maxsize=8)
def _enabled(raw: str) -> frozenset:
    """The dump names a PYFUSER_DUMP value enables (parsed once per value: asked per verdict)."""
    names = {n.strip() for n in raw.split(",") if n.strip()}
    if "help" in names:
        _print_help_once()
    names = {DUMP_ALIASES.get(n, n) for n in names}
    if "all" in names:
        return frozenset(DUMP_NAMES) - {"cuda_to_file"}
    for n in names - set(DUMP_NAMES) - set(_SPECIAL):
        if n not in _warned:
            _warned.add(n)
            print(f"[pyfuser] unknown PYFUSER_DUMP entry {n!r}; known: {', '.join(DUMP_NAMES)} "
                  "(PYFUSER_DUMP=help says what each prints)", file=sys.stderr)
    return frozenset(names)


def is_enabled(name: str) -> bool:
    assert name in DUMP_NAMES, name
    return name in _enabled(os.environ.get("PYFUSER_DUMP", ""))


def dump(name: str, title: str, text) -> None:
    """Print `text` (a string or a zero-argument callable giving one) under a header, if enabled."""
    if not is_enabled(name):
        return
    body = text() if callable(text) else text
    print(f"===== [{name}] {title} =====\n{body}", file=sys.stderr)


def dump_dir() -> str:
    return os.environ.get("PYFUSER_DUMP_DIR", os.path.join(os.getcwd(), "pyfuser_dump"))


if __name__ == "__main__":
    print(help_text())
