"""Runs a kernel segment whose scheduler is not the codegen api's own (the transpose scheduler).

The runtime's FusionExecutor plans through `pyfuser.codegen.api.plan_kernel` (pointwise). Until
that api routes other schedulers' programs (a Fusion's `kernel_scheduler` attribute) to their
planners, `PlannerExecutor` does the same job for them with the runtime's public parts: the
codegen `signature` as cache key, `nvrtc.compile_cuda` (disk cache included), `ParamPacker`,
`KernelLauncher`; in "interpret" mode the plan's own `interpret` runs it on the CPU (after
packing the parameters, so values that do not fit their C type still raise).

Invariants: one compile per signature; `last_run` has the FusionExecutor keys the segment runtime
reads ("kernels", "compiled", "fallback").
"""
from __future__ import annotations

import os

import torch

from .. import dump as D
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from ..runtime import nvrtc
from ..runtime.params import ParamPacker

PLANNERS = {"transpose": "pyfuser.schedule.transpose"}


class PlannerExecutor:
    def __init__(self, fusion, mode: str, scheduler: str):
        import importlib
        self.fusion, self.mode = fusion, mode
        self.planner = importlib.import_module(PLANNERS[scheduler])
        self._tensor_idx = [i for i, v in enumerate(fusion.inputs) if isinstance(v, TensorView)]
        self._plans: dict = {}
        self._fast: dict = {}      # exact input key -> [entry, bindings, launch config]
        self.last_run: dict = {}
        self.stats = {"runs": 0, "compiled": 0, "kernels": 0}

    def num_kernels_compiled(self) -> int:
        return len(self._plans)

    def run(self, inputs) -> list:
        inputs = list(inputs)
        info = {"kernels": 0, "compiled": 0, "fallback": None}
        self.last_run = info
        self.stats["runs"] += 1
        key = tuple((x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())
                    if isinstance(x, torch.Tensor) else (type(x), x) for x in inputs)
        fast = self._fast.get(key)
        if fast is None:
            from ..codegen.api import signature
            b = bind(self.fusion, inputs)
            sig = signature(self.fusion, inputs)
            entry = self._plans.get(sig)
            if entry is None:
                entry = self._plans[sig] = self._build(inputs)
                info["compiled"] = 1
            if len(self._fast) >= 1024:
                self._fast.clear()
            fast = self._fast[key] = [entry, b, None]
        (plan, packer, launcher), b, cfg = fast
        tensors = [inputs[i] for i in self._tensor_idx]
        device = tensors[0].device if tensors else torch.device("cpu")
        outputs = plan.allocate_outputs(b, inputs, device)
        tensors += outputs
        if cfg is None:
            cfg = fast[2] = plan.kernel.launch_config(b, tensors)
        if D.enabled_dumps():
            D.dump("launch_params", plan.kernel.name, lambda: str(cfg))
        if self.mode == "interpret":
            packer.pack(tensors, b)
            plan.interpret(inputs, outputs, b)
            info["kernels"] = 1
        elif cfg.grid[0] > 0:
            launcher.launch(cfg, tensors, b, device.index)
            info["kernels"] = 1
        self.stats["kernels"] += info["kernels"]
        return outputs

    def _build(self, inputs):
        plan = self.planner.plan_kernel(self.fusion, inputs)
        kernel = plan.kernel
        D.dump("cuda_kernel", kernel.name, kernel.source)
        D.dump("scheduler_params", kernel.name, lambda: str(kernel.scheduler_params))
        binary = nvrtc.compile_cuda(kernel.source, kernel.name, self._arch(inputs))
        packer = ParamPacker(kernel.params)
        self.stats["compiled"] += 1
        launcher = None
        if self.mode == "cuda":
            from ..runtime.launch import KernelLauncher
            launcher = KernelLauncher(binary, packer)
        return plan, packer, launcher

    def _arch(self, inputs) -> str:
        if self.mode == "cuda" and not os.environ.get("PYFUSER_ARCH"):
            x = next(inputs[i] for i in self._tensor_idx)
            major, minor = torch.cuda.get_device_capability(x.device)
            return f"sm_{major}{minor}"
        return nvrtc.default_arch()
