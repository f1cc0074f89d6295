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
  ("philox", "seed")      the launch's random-number seed (int64_t, its bit pattern)
  ("philox", "offset", n) the launch's generator offset; the launch reserves n (4 per random op)
                          of it (runtime/rng.py draws both once per launch)

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


def _with_shared_mem(launch_config, nbytes: int):
    """`launch_config` with `nbytes` of dynamic shared memory a block (kernel_shared.py)."""
    def config(bindings, tensors) -> LaunchConfig:
        cfg = launch_config(bindings, tensors)
        cfg.shared_mem = max(cfg.shared_mem, nbytes)
        return cfg
    return config


class KernelPlan:
    """What `codegen.api.plan_kernel` returns for every scheduler: the generated kernel, the
    kernel IR it was printed from, and how the runtime allocates its outputs.

    `orders[k]` lays output k out (axes outermost first, as eager would); `kernel_tensors` lists
    the kernel's tensors in Param-source order (the fusion's tensor inputs, then the outputs);
    `workspaces` gives the extra buffers a kernel asks for (pointer Params after the outputs'
    ones: a grid reduction's partials and semaphores); `body` is the kernel function without the
    prelude (tests compile many of them as one module).
    `inplace[k] = j`: output k is written into fusion input j's storage by the kernel itself
    (an in-place output, fusion.aliases, the lowering found safe): allocate_outputs hands out
    that input when its sizes, strides and dtype are the ones the output would get."""

    def __init__(self, fusion, scheduler: str, params, kernel: GeneratedKernel, kernel_ir,
                 body: str, orders: list, workspace_sizes=None):
        self.fusion = fusion
        self.scheduler = scheduler
        self.params = params
        self.kernel = kernel
        self.kernel_ir = kernel_ir
        from .kernel_shared import shared_layout
        dynamic = shared_layout(kernel_ir).launch_bytes
        if dynamic:         # shared arrays past the static 48 KB: the launch passes their bytes
            kernel.launch_config = _with_shared_mem(kernel.launch_config, dynamic)
        self.index_type = kernel_ir.index_type
        self.body = body
        self._outputs = list(fusion.outputs)
        self._orders = orders
        self._workspace_sizes = workspace_sizes    # (bindings, tensors) -> [(numel, torch dtype)]
        self.inplace: dict = {}

    def allocate_outputs(self, bindings, inputs, device) -> list:
        import torch
        from ..schedule.layout import strides_for
        outs = []
        for k, (o, order) in enumerate(zip(self._outputs, self._orders)):
            sizes = bindings.shape(o)
            strides = strides_for(sizes, order)
            x = inputs[self.inplace[k]] if k in self.inplace else None
            if x is not None and x.dtype == o.dtype.torch and x.device == device and \
                    tuple(x.shape) == tuple(sizes) and all(
                        a == b or n == 1 for a, b, n in zip(x.stride(), strides, sizes)):
                outs.append(x)
                continue
            outs.append(torch.empty_strided(sizes, strides, dtype=o.dtype.torch, device=device))
        return outs

    def kernel_tensors(self, inputs, outputs) -> list:
        from ..ir.tensor import TensorView
        tensors = [x for v, x in zip(self.fusion.inputs, inputs) if isinstance(v, TensorView)]
        return tensors + list(outputs)

    def workspace_specs(self, bindings, tensors) -> list:
        """[(elements, torch dtype, kind)]: "partials" (any contents) or "semaphores" (zero
        before a launch; the kernel leaves them zero)."""
        return [] if self._workspace_sizes is None else self._workspace_sizes(bindings, tensors)

    def workspaces(self, bindings, tensors, device) -> list:
        """Fresh buffers for one launch (semaphores zeroed)."""
        import torch
        return [torch.zeros(n, dtype=dt, device=device) if kind == "semaphores" else
                torch.empty(n, dtype=dt, device=device)
                for n, dt, kind in self.workspace_specs(bindings, tensors)]

    def __repr__(self) -> str:
        p = self.params.as_dict() if hasattr(self.params, "as_dict") else self.params
        return f"KernelPlan[{self.scheduler}]({self.kernel.name}, {p})"
