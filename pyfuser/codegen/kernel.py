"""The contract between code generation and the runtime: a generated kernel and its parameters.

The codegen produces a `GeneratedKernel`: CUDA C source, the kernel's name and its flat parameter
list. Each `Param` says how the runtime obtains its value at launch time (`source`), so the runtime
never needs to understand the kernel: it binds sizes (ir.shapes.bind), walks the params, packs
their values in order with C alignment, computes the launch configuration and launches.

Param sources:
  ("ptr", i)              data pointer of segment tensor i (inputs first, then outputs)
  ("stride", i, axis)     element stride of segment tensor i on logical axis `axis`
  ("size", i, axis)       size of segment tensor i on logical axis `axis`
  ("scalar", scalar)      value of a fusion Scalar from the Bindings (scalar inputs, extents)
  ("numel", i)            number of elements of segment tensor i

Invariant: `ctype` is one of CTYPES; values are converted to it exactly (no silent narrowing:
the codegen picks int32 only when every index fits, see `index_type`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

CTYPES = {
    # C type -> (struct format char, size) used by the runtime's packer
    "void*": ("Q", 8), "int64_t": ("q", 8), "int": ("i", 4), "uint32_t": ("I", 4),
    "float": ("f", 4), "double": ("d", 8), "bool": ("?", 1),
}


@dataclass(frozen=True)
class Param:
    name: str
    ctype: str
    source: tuple


@dataclass
class LaunchConfig:
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_mem: int = 0

    def __str__(self) -> str:
        return (f"grid=({self.grid[0]}, {self.grid[1]}, {self.grid[2]}) "
                f"block=({self.block[0]}, {self.block[1]}, {self.block[2]}) smem={self.shared_mem}")


@dataclass
class GeneratedKernel:
    name: str                 # the __global__ function's name, e.g. "pf_add_mul_cast"
    source: str               # complete CUDA C (prelude included), compilable by NVRTC alone
    params: list[Param]       # kernel parameters, in order
    # (bindings, tensors) -> LaunchConfig; tensors are the segment's inputs then outputs
    launch_config: Callable = field(repr=False, default=None)
    # Human-readable scheduler parameters, for the `scheduler_params` dump
    scheduler_params: dict = field(default_factory=dict)
