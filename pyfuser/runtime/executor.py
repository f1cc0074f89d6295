"""FusionExecutor: runs one Fusion as one generated kernel, compiling once per signature.

    ex = FusionExecutor(fusion)                 # launches on CUDA tensors
    ex = FusionExecutor(fusion, mode="interpret")  # CPU tensors: codegen's CPU interpreter,
                                                # but the CUDA source is still NVRTC-compiled
    outs = ex.run(inputs)

Caches, from cheapest to dearest:
1. fast key -> _Fast: a tuple of the inputs' (dtype, shape, strides, data_ptr % 16, device) or
   the Python type of a scalar. It fixes everything the codegen's `signature` may look at, so a
   hit skips `signature`; for fusions without scalar inputs it also keeps the Bindings and the
   LaunchConfig (both functions of the sizes only), so a hit skips `bind` and `launch_config`.
2. signature -> _Entry (plan, packer, launcher): a new size with the same signature reuses the
   compiled kernel (sizes are kernel arguments, not compile-time constants).
3. the disk cache of CUBINs (nvrtc.compile_cuda), shared across processes.

Invariants:
- `last_run` describes the last call: kernels launched, kernels compiled (NVRTC or disk),
  `cache_hit` (the in-memory fast cache answered), `disk_hit`, `compile_time_s`, `fallback`.
- A SchedulerError from plan_kernel makes that signature fall back to the reference evaluator
  (remembered, logged once). CompileError and driver errors propagate: they are pyfuser bugs.
- `PYFUSER_POISON_OUTPUTS=1` fills freshly allocated outputs with NaN (floating) or 0x7f bytes
  (others) before the kernel runs, so tests see any element the kernel fails to write.
"""
from __future__ import annotations

import logging
import os
import time

import torch

from .. import dump as D
from ..errors import ExecuteError, SchedulerError
from ..ir.shapes import bind
from ..ir.tensor import TensorView
from . import nvrtc
from .params import ParamPacker

log = logging.getLogger("pyfuser")
_MAX_FAST_KEYS = 4096
_logged_reasons: set[str] = set()


def _api():
    from ..codegen import api
    return api


class _Entry:
    __slots__ = ("plan", "kernel", "binary", "packer", "launcher", "fallback")

    def __init__(self, plan=None, kernel=None, binary=None, packer=None, launcher=None,
                 fallback=None):
        self.plan, self.kernel, self.binary = plan, kernel, binary
        self.packer, self.launcher, self.fallback = packer, launcher, fallback


class _Fast:
    __slots__ = ("entry", "bindings", "cfg", "device")

    def __init__(self, entry, device, bindings=None, cfg=None):
        self.entry, self.device, self.bindings, self.cfg = entry, device, bindings, cfg


# os.environ.get costs ~1 us (it encodes the key); the hot path reads the raw POSIX dict, which
# os.environ (and pytest's monkeypatch) keeps in sync. Elsewhere it falls back to os.environ.
_RAW_ENV = getattr(os.environ, "_data", None)
if not (isinstance(_RAW_ENV, dict) and os.name == "posix"):
    _RAW_ENV = None


def _env_set(name: str, raw: bytes) -> bool:
    """True when the variable is set to something other than '' or '0'."""
    v = _RAW_ENV.get(raw) if _RAW_ENV is not None else os.environ.get(name)
    return bool(v) and v not in (b"0", "0")


def poison_enabled() -> bool:
    return _env_set("PYFUSER_POISON_OUTPUTS", b"PYFUSER_POISON_OUTPUTS")


def poison(outputs) -> None:
    """Fill outputs with NaN (floating/complex) or 0x7f bytes over their whole storage."""
    for out in outputs:
        if out.numel() == 0:
            continue
        if out.is_floating_point() or out.is_complex():
            out.fill_(float("nan"))
        else:
            raw = torch.empty(0, dtype=torch.uint8, device=out.device)
            raw.set_(out.untyped_storage())
            raw.fill_(0x7F)


class FusionExecutor:
    def __init__(self, fusion, mode: str = "cuda", arch: str | None = None):
        if mode not in ("cuda", "interpret"):
            raise ValueError(f"FusionExecutor mode must be 'cuda' or 'interpret', got {mode!r}")
        self.fusion, self.mode, self.arch = fusion, mode, arch
        self._tensor_idx = [i for i, v in enumerate(fusion.inputs) if isinstance(v, TensorView)]
        self._has_scalars = len(self._tensor_idx) != len(fusion.inputs)
        self._fast: dict = {}
        self._plans: dict = {}
        self.stats = {"runs": 0, "cache_hits": 0, "compiled": 0, "nvrtc": 0, "disk_hits": 0,
                      "compile_time_s": 0.0, "kernels": 0, "fallback_runs": 0}
        self.last_run: dict = {}

    # ---- keys -------------------------------------------------------------------------------
    @staticmethod
    def fast_key(inputs) -> tuple:
        return tuple((x.dtype, x.shape, x.stride(), x.data_ptr() & 15, x.get_device())
                     if isinstance(x, torch.Tensor) else type(x) for x in inputs)

    def num_kernels_compiled(self) -> int:
        return len([e for e in self._plans.values() if e.fallback is None])

    def clear(self) -> None:
        """Drop the in-memory caches (the disk cache stays)."""
        self._fast.clear()
        self._plans.clear()

    # ---- running ----------------------------------------------------------------------------
    def run(self, inputs) -> list:
        inputs = list(inputs)
        key = self.fast_key(inputs)
        fast = self._fast.get(key)
        info = {"kernels": 0, "compiled": 0, "cache_hit": fast is not None, "disk_hit": 0,
                "compile_time_s": 0.0, "fallback": None}
        self.last_run = info
        self.stats["runs"] += 1
        if fast is None:
            fast = self._miss(inputs, key, info)
        else:
            self.stats["cache_hits"] += 1
        entry = fast.entry
        if entry.fallback is not None:
            info["fallback"] = entry.fallback
            self.stats["fallback_runs"] += 1
            from ..ir.evaluator import evaluate
            return evaluate(self.fusion, inputs)

        bindings = fast.bindings
        if bindings is None:
            bindings = bind(self.fusion, inputs)
        device = fast.device
        outputs = entry.plan.allocate_outputs(bindings, inputs, device)
        if poison_enabled():
            poison(outputs)
        if self._has_scalars:
            tensors = [inputs[i] for i in self._tensor_idx]
            tensors.extend(outputs)
        else:
            tensors = inputs + outputs
        cfg = fast.cfg
        if cfg is None:
            cfg = entry.kernel.launch_config(bindings, tensors)
            if not self._has_scalars:
                fast.bindings, fast.cfg = bindings, cfg
        if _env_set("PYFUSER_DUMP", b"PYFUSER_DUMP"):
            D.dump("launch_params", entry.kernel.name, lambda: str(cfg))
        if self.mode == "interpret":
            entry.packer.pack(tensors, bindings)  # checks every parameter fits its C type
            _api().interpret(entry.plan, inputs, outputs, bindings)
            info["kernels"] = 1
        elif _nonempty(cfg):
            entry.launcher.launch(cfg, tensors, bindings, device.index)
            info["kernels"] = 1
        self.stats["kernels"] += info["kernels"]
        return outputs

    def _check_devices(self, inputs) -> None:
        want = "cpu" if self.mode == "interpret" else "cuda"
        devices = {inputs[i].device for i in self._tensor_idx if isinstance(inputs[i], torch.Tensor)}
        bad = [d for d in devices if d.type != want]
        if bad or len(devices) > 1:
            raise ExecuteError(f"execute: a {self.mode!r} executor needs all tensor inputs on one "
                               f"{want} device; got {sorted(map(str, devices))}")

    def _device(self, inputs) -> torch.device:
        for i in self._tensor_idx:
            return inputs[i].device
        if self.mode == "interpret":
            return torch.device("cpu")
        return torch.device("cuda", torch.cuda.current_device())

    # ---- compiling --------------------------------------------------------------------------
    def _miss(self, inputs, key, info) -> _Fast:
        bind(self.fusion, inputs)  # validates the inputs (ExecuteError) before the codegen sees them
        self._check_devices(inputs)
        api = _api()
        sig = api.signature(self.fusion, inputs)
        entry = self._plans.get(sig)
        if entry is None:
            entry = self._build(inputs, info)
            self._plans[sig] = entry
        if len(self._fast) >= _MAX_FAST_KEYS:
            self._fast.clear()
        fast = _Fast(entry, self._device(inputs))
        self._fast[key] = fast
        return fast

    def _build(self, inputs, info) -> _Entry:
        api = _api()
        try:
            plan = api.plan_kernel(self.fusion, inputs)
        except SchedulerError as e:
            reason = str(e)
            note_fallback(reason)
            return _Entry(fallback=reason)
        kernel = plan.kernel
        D.dump("cuda_kernel", kernel.name, kernel.source)
        t0 = time.perf_counter()
        binary = nvrtc.compile_cuda(kernel.source, kernel.name, self.arch or self._arch(inputs))
        elapsed = time.perf_counter() - t0
        packer = ParamPacker(kernel.params)
        launcher = None
        if self.mode == "cuda":
            from .launch import KernelLauncher
            launcher = KernelLauncher(binary, packer)
        info["compiled"] += 1
        info["disk_hit"] += int(binary.from_disk)
        info["compile_time_s"] += elapsed
        self.stats["compiled"] += 1
        self.stats["disk_hits"] += int(binary.from_disk)
        self.stats["nvrtc"] += int(not binary.from_disk)
        self.stats["compile_time_s"] += elapsed
        return _Entry(plan, kernel, binary, packer, launcher)

    def _arch(self, inputs) -> str:
        if self.mode == "cuda" and not os.environ.get("PYFUSER_ARCH"):
            for i in self._tensor_idx:
                d = inputs[i].device
                if d.type == "cuda":
                    major, minor = torch.cuda.get_device_capability(d)
                    return f"sm_{major}{minor}"
        return nvrtc.default_arch()


def _nonempty(cfg) -> bool:
    g, b = cfg.grid, cfg.block
    return g[0] > 0 and g[1] > 0 and g[2] > 0 and b[0] > 0 and b[1] > 0 and b[2] > 0


def note_fallback(reason: str, what: str = "fusion") -> None:
    """Log (once per distinct reason) and dump that a fusion runs on the reference evaluator."""
    D.dump("fallback", what, reason)
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        log.info("pyfuser: %s runs on the reference evaluator: %s", what, reason)
