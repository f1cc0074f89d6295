"""FusionExecutor: runs one Fusion as one generated kernel, compiling once per signature.

    ex = FusionExecutor(fusion)                 # launches on CUDA tensors
    ex = FusionExecutor(fusion, mode="interpret")  # CPU tensors: codegen's CPU interpreter,
                                                # but the CUDA source is still NVRTC-compiled
    outs = ex.run(inputs)

Caches, from cheapest to dearest:
1. fast key -> _Fast: a tuple of the inputs' (dtype, shape, strides, data_ptr % 16, device) or
   a scalar's (type, value, sign). It fixes everything the codegen's `signature` may look at and
   every kernel parameter except the tensor pointers, so a hit skips `signature`, `bind` and
   `launch_config`. In "cuda" mode, from the second call with a key on, the hit runs `_Fast.call`
   (generated): outputs by `new_empty_strided` of the first tensor input (or `torch.empty_strided`)
   with cached sizes/strides (an in-place output the kernel writes into its input: that input,
   KernelPlan.inplace), then `prep.go(ptrs)` of a `Prepared` launch (launch.py) whose
   buffer already holds every constant parameter: one cuLaunchKernelEx through ctypes. `call_keys.key_function`
   generates the key code once per input list shape (no per-call interpretation).
2. signature -> _Entry (plan, packer, launcher): a new size with the same signature reuses the
   compiled kernel (sizes are kernel arguments, not compile-time constants). Entries may be made
   before the first run: `prepare(inputs)` plans for stand-ins of the inputs (meta tensors, from
   a compiler's example values) and `adopt(sig, plan)` takes a plan from the plan store
   (runtime/plan_store.py); their CUBINs are fetched in the background (nvrtc.compile_async)
   and the first run with that signature waits for it (`_finish`). Counters and `last_run`
   count such a kernel as compiled by the run that first uses it, as for one built there.
3. the disk cache of CUBINs (nvrtc.compile_cuda), shared across processes.

Invariants:
- `last_run` describes the last call: kernels launched, kernels compiled (NVRTC or disk),
  `kernel_segments` (only when the call was split: segment/split.py's kernel segments),
  `cache_hit` (the in-memory fast cache answered), `disk_hit`, `compile_time_s`, `fallback`.
- A SchedulerError from plan_kernel makes that signature run as the segments the other
  schedulers take when the refusing scheduler is inner_outer_persistent (segment/split.py),
  else fall back to the reference evaluator (remembered, logged once). CompileError and driver
  errors propagate: they are pyfuser bugs.
- `PYFUSER_POISON_OUTPUTS=1` fills freshly allocated outputs with NaN (floating) or 0x7f bytes
  (others) before the kernel runs, so tests see any element the kernel fails to write.
- The fast call is skipped (the general path runs) whenever PYFUSER_POISON_OUTPUTS or
  PYFUSER_DUMP is set, so poisoning and launch dumps never miss a call.
- `clear()` also drops everything built on the fast entries (dispatch's programs, via on_clear).
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
from .call_keys import _RAW_ENV, _env_set, key_function, poison, poison_enabled, slow_env
from .params import ParamPacker

log = logging.getLogger("pyfuser")
_MAX_FAST_KEYS = 4096
_logged_reasons: set[str] = set()


def _api():
    from ..codegen import api
    return api


class _Entry:
    """One signature's kernel. `pending`: the Future of its CUBIN while it compiles in the
    background (a prepared or adopted plan); the first run that needs it waits for it."""
    __slots__ = ("plan", "kernel", "binary", "packer", "launcher", "fallback", "split", "pending")

    def __init__(self, plan=None, kernel=None, binary=None, packer=None, launcher=None,
                 fallback=None, split=None, pending=None):
        self.plan, self.kernel, self.binary = plan, kernel, binary
        self.packer, self.launcher, self.fallback = packer, launcher, fallback
        self.split = split        # segment/split.py: run as other schedulers' segments
        self.pending = pending


class _Fast:
    """One fast key's entry. Once `call` is built (cuda mode): `prep` (the Prepared launch, None
    for an empty grid), `specs` (size, stride, dtype) per output, `inplace` (the outputs that
    are an input, written by the kernel) and `hit` (its last_run) are what dispatch hands to the
    native runner."""
    __slots__ = ("entry", "bindings", "cfg", "device", "call", "runs", "prep", "specs", "hit",
                 "workspaces", "semaphores", "inplace")

    def __init__(self, entry, device, bindings=None, cfg=None):
        self.entry, self.device, self.bindings, self.cfg = entry, device, bindings, cfg
        self.call = None          # (inputs, ptrs) -> outputs, once built (cuda mode)
        self.runs = 0
        self.prep = self.specs = self.hit = None
        self.workspaces = ()      # (elements, dtype, kind) of the buffers each launch needs
        self.semaphores = {}      # raw stream -> this key's semaphore buffer on that stream
        self.inplace = {}         # output k -> position among the tensor inputs of the input
                                  # the kernel writes it into (an in-place output, _fast_call)


class FusionExecutor:
    def __init__(self, fusion, mode: str = "cuda", arch: str | None = None):
        if mode not in ("cuda", "interpret"):
            raise ValueError(f"FusionExecutor mode must be 'cuda' or 'interpret', got {mode!r}")
        self.fusion, self.mode, self.arch = fusion, mode, arch
        self._tensor_idx = [i for i, v in enumerate(fusion.inputs) if isinstance(v, TensorView)]
        self._has_scalars = len(self._tensor_idx) != len(fusion.inputs)
        self.key_of = key_function(fusion.inputs)
        self._fast: dict = {}
        self._plans: dict = {}
        self._stats = {"runs": 0, "cache_hits": 0, "compiled": 0, "nvrtc": 0, "disk_hits": 0,
                       "compile_time_s": 0.0, "kernels": 0, "fallback_runs": 0}
        self.on_clear: list = []      # callbacks run by clear() (dispatch's programs)
        self.last_run: dict = {}

    @property
    def stats(self) -> dict:
        """Counters: runs, cache_hits, compiled, nvrtc, disk_hits, compile_time_s, kernels..."""
        st = dict(self._stats)
        for fast in self._fast.values():
            if fast.runs:
                st["runs"] += fast.runs
                st["cache_hits"] += fast.runs
                st["kernels"] += fast.runs * _nonempty(fast.cfg)
        return st

    # ---- keys -------------------------------------------------------------------------------
    def num_kernels_compiled(self) -> int:
        """Kernels a run has used (prepared ones still unused are not counted)."""
        return len([e for e in self._plans.values() if e.binary is not None and e.split is None])

    def clear(self) -> None:
        """Drop the in-memory caches (the disk cache stays)."""
        self._fold_fast_stats()
        self._fast.clear()
        self._plans.clear()
        for cb in list(self.on_clear):
            cb()

    def _fold_fast_stats(self) -> None:
        st = self.stats
        for k in ("runs", "cache_hits", "kernels"):
            self._stats[k] = st[k]
        for fast in self._fast.values():
            fast.runs = 0

    def fast_entry(self, inputs):
        """The _Fast of these inputs if its fast call is built (dispatch composes those)."""
        try:
            fast = self._fast.get(self.key_of(inputs)[0])
        except Exception:  # noqa: BLE001 - not a valid input list: no fast entry
            return None
        return fast if fast is not None and fast.call is not None else None

    # ---- running ----------------------------------------------------------------------------
    def run(self, inputs) -> list:
        try:
            key, ptrs = self.key_of(inputs)
            fast = self._fast.get(key)
        except Exception:  # noqa: BLE001 - malformed inputs: the checked path says what is wrong
            key = fast = None
        if fast is not None and fast.call is not None and (
                b"PYFUSER_DUMP" not in _RAW_ENV and b"PYFUSER_POISON_OUTPUTS" not in _RAW_ENV
                if _RAW_ENV is not None else not slow_env()):
            return fast.call(inputs, ptrs)
        inputs = list(inputs)
        if key is None:
            bind(self.fusion, inputs)           # raises ExecuteError naming the problem
            key = self.key_of(inputs)[0]
        info = {"kernels": 0, "compiled": 0, "cache_hit": fast is not None, "disk_hit": 0,
                "compile_time_s": 0.0, "fallback": None}
        self.last_run = info
        stats = self._stats
        stats["runs"] += 1
        if fast is None:
            fast = self._miss(inputs, key, info)
        else:
            stats["cache_hits"] += 1
        entry = fast.entry
        if entry.split is not None:
            outs, info["kernels"], info["kernel_segments"] = entry.split(inputs)
            stats["kernels"] += info["kernels"]
            return outs
        if entry.fallback is not None:
            info["fallback"] = entry.fallback
            stats["fallback_runs"] += 1
            from ..ir.evaluator import evaluate
            return evaluate(self.fusion, inputs)

        bindings = fast.bindings
        if bindings is None:
            bindings = bind(self.fusion, inputs)
        device = fast.device
        outputs = entry.plan.allocate_outputs(bindings, inputs, device)
        inplace = getattr(entry.plan, "inplace", None)
        if poison_enabled():
            poison([o for o in outputs if not any(o is x for x in inputs)] if inplace else outputs)
        if self._has_scalars:
            tensors = [inputs[i] for i in self._tensor_idx]
            tensors.extend(outputs)
        else:
            tensors = inputs + outputs
        cfg = fast.cfg
        if cfg is None:
            cfg = entry.kernel.launch_config(bindings, tensors)
            fast.bindings, fast.cfg = bindings, cfg      # the key fixes sizes and scalar values
        if _env_set("PYFUSER_DUMP", b"PYFUSER_DUMP"):
            D.dump("launch_params", entry.kernel.name, lambda: str(cfg))
        if self.mode == "cuda" and _nonempty(cfg) and hasattr(entry.plan, "workspace_specs"):
            specs = entry.plan.workspace_specs(bindings, tensors)   # a grid reduction's buffers
            if specs:
                fast.workspaces = tuple(specs)
                tensors = tensors + [_workspace(fast, n, dt, kind) for n, dt, kind in specs]
        if self.mode == "interpret":
            # the workspaces a grid reduction asks for are parameters too; every parameter is
            # checked to fit its C type, and the interpreter runs with the packed values
            work = entry.plan.workspaces(bindings, tensors, device) \
                if hasattr(entry.plan, "workspaces") else []
            values = entry.packer.checked_values(tensors + work, bindings)
            if work or entry.packer.has_philox:
                _api().interpret(entry.plan, inputs, outputs, bindings, params=values,
                                 workspaces=work)
            else:
                _api().interpret(entry.plan, inputs, outputs, bindings)
            info["kernels"] = 1
        elif _nonempty(cfg):
            entry.launcher.launch(cfg, tensors, bindings, device.index)
            info["kernels"] = 1
        stats["kernels"] += info["kernels"]
        if fast.call is None and self.mode == "cuda":
            # a kernel drawing random numbers replays too: its prepared launch draws a new seed
            # / offset every call (launch.Prepared.rng); an in-place output the kernel wrote
            # into its input replays as that input (the key fixes its sizes and strides, which
            # decided that allocate_outputs handed it out)
            written = {k: j for k, j in inplace.items() if outputs[k] is inputs[j]} \
                if inplace else {}
            fast.call = self._fast_call(fast, outputs, tensors, written)
        return outputs

    def _fast_call(self, fast, outputs, tensors, written=None):
        """Build (inputs, ptrs) -> outputs for this key from a call that just ran: output sizes,
        strides and dtypes, the launch config and every non-pointer parameter are fixed by it.

        Generated per key: outputs by `x.new_empty_strided(size, stride)` of the first tensor
        input x (a plain torch.Tensor: the key fixes its dtype and device; no device argument to
        parse), else (inputs=None from dispatch's programs, a subclass, no tensor input)
        `torch.empty_strided(size, stride, dtype=, device=)`; then `prep.go(ptrs)`, read per call
        so that switching the launcher's mode reaches it.

        `written` ({output k: fusion input j}): in-place outputs the kernel wrote into their
        input, returned as `inputs[j]` with that input's pointer (`ptrs` holds the tensor
        inputs'); such a call needs its inputs (dispatch's programs pass them), and
        `fast.inplace` maps k to j's position among the tensor inputs."""
        written = written or {}
        entry, cfg, device = fast.entry, fast.cfg, fast.device
        launcher = entry.launcher
        prep = launcher.prepare(cfg, device.index, tensors, fast.bindings) \
            if _nonempty(cfg) else None
        specs = [(tuple(o.shape), tuple(o.stride()), o.dtype) for o in outputs]
        work = [f"w{k}" for k in range(len(fast.workspaces))]
        hit = {"kernels": int(prep is not None), "compiled": 0, "cache_hit": True, "disk_hit": 0,
               "compile_time_s": 0.0, "fallback": None}
        env = {"E": torch.empty_strided, "Tensor": torch.Tensor, "dev": device, "prep": prep,
               "fast": fast, "ex": self, "hit": hit, "W": _workspace}
        i0 = self._tensor_idx[0] if self._tensor_idx else None
        like_dtype = tensors[0].dtype if i0 is not None else None
        outs = [f"o{k}" for k in range(len(specs))]
        general, like, same = [], [], []
        fast.inplace = {k: self._tensor_idx.index(j) for k, j in written.items()}
        for k, (size, stride, dtype) in enumerate(specs):
            if k in written:
                same.append(f"o{k} = inputs[{written[k]}]")
                continue
            env[f"Z{k}"], env[f"T{k}"], env[f"D{k}"] = size, stride, dtype
            general.append(f"o{k} = E(Z{k}, T{k}, dtype=D{k}, device=dev)")
            like.append(f"o{k} = x.new_empty_strided(Z{k}, T{k})" if dtype == like_dtype else
                        f"o{k} = x.new_empty_strided(Z{k}, T{k}, dtype=D{k})")
        lines = ["def call(inputs, ptrs):"]
        if not general:
            pass                                 # every output is an input written in place
        elif i0 is not None:
            lines += ["    x = inputs[%d] if inputs is not None else None" % i0,
                      "    if type(x) is Tensor:"] + [f"        {c}" for c in like] + \
                     ["    else:"] + [f"        {c}" for c in general]
        else:
            lines += [f"    {c}" for c in general]
        lines += [f"    {c}" for c in same]
        if prep is not None:
            for k, (n, dtype, kind) in enumerate(fast.workspaces):
                env[f"WN{k}"], env[f"WD{k}"], env[f"WK{k}"] = n, dtype, kind
                lines.append(f"    w{k} = W(fast, WN{k}, WD{k}, WK{k})")
            out_ptrs = [f"ptrs[{fast.inplace[k]}]" if k in written else f"o{k}.data_ptr()"
                        for k in range(len(outs))] + [f"{w}.data_ptr()" for w in work]
            if len(out_ptrs) == 1:
                lines.append(f"    ptrs.append({out_ptrs[0]})")
            elif out_ptrs:
                lines.append("    ptrs.extend((" + "".join(f"{p}, " for p in out_ptrs) + "))")
            lines.append("    prep.go(ptrs)")
        lines += ["    fast.runs += 1", "    ex.last_run = hit",
                  "    return [" + ", ".join(outs) + "]"]
        exec(compile("\n".join(lines) + "\n", "<pyfuser fast call>", "exec"), env)  # noqa: S102
        fast.prep, fast.specs, fast.hit = prep, specs, hit
        return env["call"]

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
        elif entry.pending is not None:
            self._finish(entry, info)
        if len(self._fast) >= _MAX_FAST_KEYS:
            self._fold_fast_stats()
            self._fast.clear()
            for cb in list(self.on_clear):
                cb()
        fast = _Fast(entry, self._device(inputs))
        self._fast[key] = fast
        return fast

    def _build(self, inputs, info) -> _Entry:
        entry = self._plan_entry(inputs)
        if entry.fallback is None and entry.split is None:
            t0 = time.perf_counter()
            binary = nvrtc.compile_cuda(entry.kernel.source, entry.kernel.name,
                                        self.arch or self._arch(inputs))
            self._install_binary(entry, binary, time.perf_counter() - t0, info)
        return entry

    def _plan_entry(self, inputs) -> _Entry:
        """The entry of a new signature, planned (or a fallback), not compiled yet."""
        api = _api()
        try:
            plan = api.plan_kernel(self.fusion, inputs)
        except SchedulerError as e:
            reason = str(e)
            from ..segment.split import split_runner
            split = split_runner(self.fusion, self.mode, reason)
            if split is not None:
                return _Entry(split=split)
            note_fallback(reason)
            return _Entry(fallback=reason)
        kernel = plan.kernel
        D.dump("cuda_kernel", kernel.name, kernel.source)
        D.dump("scheduler_params", kernel.name, lambda: str(kernel.scheduler_params))
        return _Entry(plan, kernel)

    def _install_binary(self, entry, binary, elapsed: float, info) -> None:
        packer = ParamPacker(entry.kernel.params)
        launcher = None
        if self.mode == "cuda":
            from .launch import KernelLauncher
            launcher = KernelLauncher(binary, packer)
        entry.binary, entry.packer, entry.launcher, entry.pending = binary, packer, launcher, None
        info["compiled"] += 1
        info["disk_hit"] += int(binary.from_disk)
        info["compile_time_s"] += elapsed
        stats = self._stats
        stats["compiled"] += 1
        stats["disk_hits"] += int(binary.from_disk)
        stats["nvrtc"] += int(not binary.from_disk)
        stats["compile_time_s"] += elapsed

    def _finish(self, entry, info) -> None:
        """Wait for a prepared entry's CUBIN (compiled in the background) and load it."""
        t0 = time.perf_counter()
        binary = entry.pending.result()          # a CompileError is raised here, as _build would
        waited = time.perf_counter() - t0
        self._install_binary(entry, binary, binary.compile_time_s or waited, info)

    # ---- ahead of the first run --------------------------------------------------------------
    def prepare(self, inputs, arch: str | None = None):
        """Plan the kernel for inputs like these (meta tensors with the real ones' sizes,
        strides and storage offsets, or real tensors) and start compiling it in the background
        (nvrtc.compile_async), so that the first run finds it planned and, by then, compiled.
        Returns the outputs the kernel would allocate, on the inputs' device (what later
        segments read), or None when this signature falls back to the evaluator. The entry is
        keyed by `signature(fusion, inputs)`, exactly as a run's, so a run with other layout
        facts plans its own kernel as before."""
        bindings = bind(self.fusion, inputs)   # ExecuteError for inputs the fusion cannot take
        sig = _api().signature(self.fusion, inputs)
        entry = self._plans.get(sig)
        if entry is None:
            entry = self._plan_entry(inputs)
            if entry.fallback is None and entry.split is None:
                entry.pending = nvrtc.compile_async(entry.kernel.source, entry.kernel.name,
                                                    self.arch or arch or nvrtc.default_arch())
            self._plans[sig] = entry
        if entry.fallback is not None or entry.split is not None:
            return None
        device = next((inputs[i].device for i in self._tensor_idx), torch.device("meta"))
        return entry.plan.allocate_outputs(bindings, inputs, device)

    def adopt(self, sig, plan, arch: str | None = None) -> bool:
        """Take a plan made for signature `sig` by an earlier process (runtime/plan_store.py)
        and fetch its CUBIN in the background (the disk cache, else NVRTC). False when this
        signature has an entry already."""
        if sig in self._plans:
            return False
        kernel = plan.kernel
        entry = _Entry(plan, kernel)
        entry.pending = nvrtc.compile_async(kernel.source, kernel.name,
                                            self.arch or arch or nvrtc.default_arch())
        self._plans[sig] = entry
        return True

    def plans(self) -> dict:
        """signature -> KernelPlan of every planned kernel (fallbacks left out)."""
        return {sig: e.plan for sig, e in self._plans.items() if e.plan is not None}

    def _arch(self, inputs) -> str:
        if self.mode == "cuda" and not os.environ.get("PYFUSER_ARCH"):
            for i in self._tensor_idx:
                d = inputs[i].device
                if d.type == "cuda":
                    major, minor = torch.cuda.get_device_capability(d)
                    return f"sm_{major}{minor}"
        return nvrtc.default_arch()


def _workspace(fast, n, dtype, kind):
    """A launch's workspace: partials fresh from the allocator (stream-ordered reuse is safe);
    semaphores one zeroed buffer per key and stream, which every launch leaves zero (launches on
    one stream run in order; other streams get their own)."""
    if kind != "semaphores":
        return torch.empty(n, dtype=dtype, device=fast.device)
    stream = stream_of(fast)
    buf = fast.semaphores.get(stream)
    if buf is None:
        buf = fast.semaphores[stream] = torch.zeros(n, dtype=dtype, device=fast.device)
    return buf


def stream_of(fast) -> int:
    """The raw current stream of fast's device, as its launches (and the native runner) see it."""
    return fast.entry.launcher._stream(fast.device.index)


def _nonempty(cfg) -> bool:
    g, b = cfg.grid, cfg.block
    return g[0] > 0 and g[1] > 0 and g[2] > 0 and b[0] > 0 and b[1] > 0 and b[2] > 0


def note_fallback(reason: str, what: str = "fusion") -> None:
    """Log (once per distinct reason) and dump that a fusion runs on the reference evaluator."""
    D.dump("fallback", what, reason)
    if reason not in _logged_reasons:
        _logged_reasons.add(reason)
        log.info("pyfuser: %s runs on the reference evaluator: %s", what, reason)
