"""Where a Fusion runs: the single entry point `execute_fusion(fusion, inputs) -> list[Tensor]`.

Every frontend (FusionDefinition.execute, the TorchScript graph runner) calls this, never the
evaluator or the kernel executor directly. The Fusion is segmented once (segment/segmenter.py:
host segments of views at the edges, kernel segments, eager segments) and the segments run in
order (segment/runtime.py). Kernel segments run
- on CUDA tensors: through their FusionExecutor (one per segment program, cached on it);
- on CPU tensors: through the codegen's CPU interpreter of the generated kernel (a
  FusionExecutor in "interpret" mode, which also NVRTC-compiles the kernel; the default), or on
  the reference evaluator when `mode="evaluator"` or `PYFUSER_CPU_EXECUTOR=evaluator`.
A Fusion that is exactly one kernel goes straight to its executor (no segment bookkeeping).

Cached calls on CUDA tensors take a fast path: per Fusion a `_Programs` holds a generated key
function (the executor's key: dtype, shape, strides, data_ptr % 16, device per tensor) and, per
key, a program recorded from a slow call with the same key: the kernel segments' fast calls
(executor._Fast.call) with the slots their pointers come from, and per output either a slot or
`base.as_strided(size, stride)` (a host view at the fusion's edge, whose sizes and strides the key
fixes; views keep the storage offset, so a kernel reads a host view through its base's pointer).
A program is recorded only when every segment ran a kernel or a view (no eager segment, no
fallback, no 0-dim CPU tensor moved to the device), each host view was checked to share its
base's storage offset, and every in-place output (Fusion.aliases) was written into its input by
the kernel computing it (no copy after the kernels; the key fixes the input's layout, which
decided it): such an output replays as that input's slot, the kernel's pointer its pointer.
`mode=...`, PYFUSER_DUMP and PYFUSER_POISON_OUTPUTS always take the slow path. Kernel segments
of every scheduler (pointwise, transpose) run on the one FusionExecutor.
Each program is also handed, as plain data, to the Fusion's native Runner (runtime/native.py,
csrc/fast_runner.cpp) where the extension is available and every input is a tensor; from then on
`progs.run` is the Runner's, which replays a hit with no Python frame and passes a miss to the
generated Python run. Both are emptied together (clear_caches, executor.clear()).

`last_report(fusion)` is the RunReport of the fusion's last execute (segments in order with kind
and scheduler, kernels run, host segments); `fs.last_run` and `pyfuser run --json` read it.
`run_summary(fusion)` gives its {"kernels", "host_segments", ...} dict.
"""
from __future__ import annotations

import math
import os
import weakref

import torch

from ..ir.tensor import TensorView
from ..schedule.layout import strides_for
from ..segment.segmented_fusion import RunReport, SegmentRun
from .call_keys import _RAW_ENV, slow_env as _slow_env
from .executor import _workspace, stream_of

# Executors live in an attribute of their Fusion (so they die with it: an executor refers to its
# fusion, which a WeakKeyDictionary value must not); _holders lets clear_caches find them.
_ATTR = "_pyfuser_executors"
_REPORT = "_pyfuser_last_run"
_PROGS = "_pyfuser_programs"
_MAX_PROGRAMS = 1024
_holders: "weakref.WeakSet" = weakref.WeakSet()


class _Executors(dict):
    """mode -> executor. Copies and pickles of the Fusion (the codegen deep-copies it) get an
    empty one: executors are caches of this very object, never state to carry along."""

    def __deepcopy__(self, memo):
        return _Executors()

    def __copy__(self):
        return _Executors()

    def __reduce__(self):
        return (_Executors, ())


class _Programs:
    """Per Fusion: key -> (run(inputs, ptrs) -> outputs, RunReport), and `run(inputs)`: the
    whole cached call, the slow path on a miss. `run` is the Python one generated here (key,
    lookup, program in one frame), or once a program was handed to it the native Runner's
    (runtime/native.py), which falls through to the Python one on a miss. It lives as long as its
    Fusion (clear_caches and executor.clear() empty `runs` and the runner, never replace them),
    so frontends may hold it and call `progs.run`. Frontends that bound its programs into code of
    their own (the TorchScript call plans) add a callback to `listeners`: it runs whenever the
    programs are emptied, so no bound program outlives them."""
    __slots__ = ("key_of", "runs", "run", "py_run", "native", "n_inputs", "listeners",
                 "native_data", "pending", "__weakref__")

    def __init__(self, fusion):
        from .call_keys import key_function
        self.key_of = key_function(fusion.inputs)
        self.runs: dict = {}
        self.pending: dict = {}          # key -> steps() of a program not yet handed over
        self.run = self.py_run = _run_function(fusion, self.runs, self)
        # None: not asked yet; False: not for this fusion (scalar inputs, no extension, ...)
        self.native = None if all(isinstance(v, TensorView) for v in fusion.inputs) \
            and _RAW_ENV is not None else False
        self.n_inputs = len(fusion.inputs)
        self.listeners: list = []
        self.native_data: dict = {}      # key -> the native program handed to the Runner

    def __deepcopy__(self, memo):
        return None

    def __reduce__(self):
        return (type(None), ())

    def clear(self) -> None:
        self.runs.clear()
        self.pending.clear()
        self.drop_native()

    def drop_native(self) -> None:
        """Forget the native programs (a launcher's mode changed): the Python ones answer.
        Frontends holding programs (listeners) are told either way."""
        if self.native:
            self.native.clear()
        self.native_data.clear()
        self.pending.clear()
        for cb in list(self.listeners):
            cb()

    def install(self, inputs, run, report, steps) -> None:
        """Record `run` (Python) for the key of `inputs`; `steps()` gives the native program's
        (steps, results, effects, device), or None when it cannot be one. The native program is
        made when the key is hit (`handoff`), so a call made once never loads the extension."""
        if len(self.runs) >= _MAX_PROGRAMS:
            self.clear()
        key = self.key_of(inputs)[0]
        self.runs[key] = (run, report)
        if self.native is not False:
            self.pending[key] = steps

    def handoff(self, inputs, key) -> None:
        """Hand the pending program of `key` (the key of `inputs`) to the native Runner, where
        the extension is built and the program can be one."""
        steps = self.pending.pop(key, None)
        if steps is None or self.native is False:
            return
        from . import native
        mod = native.runner_module()
        program = steps() if mod is not None and native.configure(mod) else None
        if program is None:
            return
        if self.native is None:
            self.native = mod.Runner(self.n_inputs, self.py_run, _RAW_ENV, (_DUMP, _POISON))
            self.run = self.native.run
        self.native.add(inputs, *program)
        self.native_data[key] = program


def _run_function(fusion, runs, progs):
    """Generate `run(inputs)`: what `execute_fusion(fusion, inputs)` does, in one frame on a hit
    (the key expression of call_keys.key_function inlined, one dict lookup, the env check; a
    program still pending for the native runner is handed over on its first hit)."""
    from .call_keys import key_parts
    names, ptrs, key = key_parts(fusion.inputs)
    unpack = (", ".join(names) + ("," if len(names) == 1 else "")) if names else "()"
    env = {"get": runs.get, "FD": fusion.__dict__, "REPORT": _REPORT, "slow": _execute_slow,
           "F": fusion, "ENV": _RAW_ENV, "slow_env": _slow_env, "DUMP": _DUMP, "POISON": _POISON,
           "_sign": math.copysign, "_T": torch.Tensor, "PENDING": progs.pending,
           "HANDOFF": progs.handoff}
    quiet = "DUMP not in ENV and POISON not in ENV" if _RAW_ENV is not None else "not slow_env()"
    lines = ["def run(inputs):", "    try:", f"        {unpack} = inputs"]
    lines += [f"        {p} = x{p[1:]}.data_ptr()" for p in ptrs]
    lines += [f"        k = ({key})",
              "        hit = get(k)",
              "    except Exception:  # malformed inputs: the slow path says what is wrong",
              "        hit = None",
              f"    if hit is not None and {quiet}:",
              "        FD[REPORT] = hit[1]",
              "        if PENDING:",
              "            HANDOFF(inputs, k)",
              f"        return hit[0](inputs, [{', '.join(ptrs)}])",
              "    return slow(F, inputs, None)"]
    exec(compile("\n".join(lines) + "\n", "<pyfuser fusion run>", "exec"), env)  # noqa: S102
    return env["run"]


def programs(fusion):
    """The Fusion's _Programs (made if needed): frontends call its `run(inputs)` instead of
    execute_fusion(fusion, inputs) (mode None) to save the frames; `run` is read per call, since
    it becomes the native runner's once a program was handed to one."""
    return _programs(fusion)[1]


CPU_MODES = ("evaluator", "interpret")


_DUMP, _POISON = b"PYFUSER_DUMP", b"PYFUSER_POISON_OUTPUTS"


def execute_fusion(fusion, inputs, mode: str | None = None) -> list:
    if mode is None:
        progs = fusion.__dict__.get(_PROGS)
        if progs is not None:
            return progs.run(inputs)
    return _execute_slow(fusion, inputs, mode)


def _execute_slow(fusion, inputs, mode):
    given = inputs
    inputs = list(inputs)
    on_cuda = any(isinstance(x, torch.Tensor) and x.is_cuda for x in inputs)
    if on_cuda:
        backend, inputs = "cuda", _scalars_to_device(fusion, inputs)
    else:
        backend = mode or os.environ.get("PYFUSER_CPU_EXECUTOR") or "interpret"
        if backend not in CPU_MODES:
            raise ValueError(f"CPU executor mode must be one of {CPU_MODES}, got {mode!r}")
    from ..segment.segmenter import segment
    sf = segment(fusion)
    segs = sf.segments
    # A program is recorded when the call could take the fast path next time.
    record = {} if (backend == "cuda" and mode is None and not _slow_env()
                    and all(a is b for a, b in zip(inputs, given))) else None
    if len(segs) == 1 and segs[0].fusion is fusion and segs[0].kind == "kernel":
        return _run_whole(fusion, segs[0], inputs, backend, record)
    from ..segment.runtime import run_segments
    outs, report = run_segments(sf, inputs, backend, _segment_executor, record)
    fusion.__dict__[_REPORT] = report
    if record is not None and record.get("ok"):
        _install(fusion, inputs, report, record)
    return outs


def _run_whole(fusion, seg, inputs, backend: str, record=None) -> list:
    from ..segment.runtime import _split_devices
    ex = None
    if backend != "evaluator" and not _split_devices(seg, inputs):
        ex = _segment_executor(fusion, backend)
    if ex is None:
        outs, used, launched = _evaluate(fusion, inputs), "evaluator", 0
    else:
        outs = ex.run(inputs)
        launched = int(ex.last_run.get("kernels", 0))
        used = "evaluator" if ex.last_run.get("fallback") else backend
    report = RunReport([SegmentRun("kernel", seg.scheduler, [e.op_name for e in seg.exprs], used)],
                       kernels=ex.last_run.get("kernel_segments", 1) if ex is not None else 1,
                       launched=launched)   # kernel_segments: a split segment (segment/split.py)
    if fusion.aliases:
        from ..segment.runtime import apply_aliases
        outs = apply_aliases(fusion, inputs, outs, report)
        if report.copies:        # a copy after the kernel: no replay program (it would skip it)
            record = None
    fusion.__dict__[_REPORT] = report
    if record is not None and ex is not None and used == "cuda":
        fast = ex.fast_entry(inputs)
        if fast is not None:
            n = len(inputs)
            _programs(fusion, ex)[1].install(
                inputs, fast.call, report, lambda: _native_program(
                    fusion, report, [(fast, list(range(n)), ex)],
                    [(n + k, None) for k in range(len(fast.specs))], n))
    return outs


def _programs(fusion, *executors):
    progs = fusion.__dict__.get(_PROGS)
    if progs is None:
        progs = fusion.__dict__[_PROGS] = _Programs(fusion)
    _holders.add(fusion)                 # again after a clear_caches (which keeps progs)
    for ex in executors:
        if not any(cb.__self__ is progs for cb in ex.on_clear):
            ex.on_clear.append(progs.clear)
    return fusion, progs


def _install(fusion, inputs, report, record) -> None:
    """Turn a recorded segmented run into a program (see the module docstring)."""
    # a kernel writing an in-place output is given its inputs (the output is one of them):
    # (position in its fusion's inputs) per tensor input slot, else None
    steps = [(fast.call, slots, ex._tensor_idx if fast.inplace else None,
              len(ex.fusion.inputs)) for fast, slots, ex in record["kernels"]]
    outputs = record["outputs"]
    executors = [ex for _, _, ex in record["kernels"]]

    def run(inputs, ptrs):
        env = list(inputs)
        for call, slots, where, n in steps:
            args = None
            if where is not None:
                args = [None] * n
                for i, k in zip(where, slots):
                    args[i] = env[k]
            env.extend(call(args, [env[k].data_ptr() for k in slots]))
        return [env[k] if spec is None else env[k].as_strided(*spec) for k, spec in outputs]

    # What frontends that inline a program without kernels need (views of the inputs only).
    run.kernels, run.outputs = len(steps), list(outputs)

    _, progs = _programs(fusion, *executors)
    progs.install(inputs, run, report, lambda: _native_program(
        fusion, report, record["kernels"], outputs, len(inputs)))


def _native_program(fusion, report, kernels, outputs, n_inputs):
    """(steps, results, effects, device) of the native Runner for a recorded program: per kernel
    (fast, its input slots, executor) its outputs allocated, its workspaces (partials allocated,
    semaphores the current stream's zeroed buffer) and its prepared launch (pointers from those
    slots, then its outputs, then its workspaces), per output its slot or a view of one; the
    effects are what the Python program does besides (the fast entries' run counts, executors'
    last_run, the report). Slots are numbered as the Python program's (inputs, then each
    kernel's outputs) mapped through `where`, since workspaces take runner slots too.
    None when a launch cannot go through the runner (native.launch_step)."""
    from . import native
    steps, effects, device = [], [], -1
    where = list(range(n_inputs))         # the Python program's slot -> the runner's
    slot = n_inputs

    def add(step):
        nonlocal slot
        steps.append(step)
        slot += 1
        return slot - 1

    for fast, slots, ex in kernels:
        # an in-place output is the input the kernel writes it into: that input's slot
        outs = [where[slots[fast.inplace[k]]] if k in fast.inplace else
                add(("alloc", size, stride, torch.empty(0, dtype=dtype, device=fast.device)))
                for k, (size, stride, dtype) in enumerate(fast.specs)]
        work = []
        for n, dtype, kind in fast.workspaces if fast.prep is not None else ():
            if kind == "semaphores":     # this stream's zeroed buffer (a miss on another stream)
                work.append(add(("const", _workspace(fast, n, dtype, kind), stream_of(fast))))
            else:                        # n: elements, or a shape (laid out row-major)
                sizes = tuple(n) if isinstance(n, tuple) else (n,)
                work.append(add(("alloc", sizes, strides_for(sizes, list(range(len(sizes)))),
                                 torch.empty(0, dtype=dtype, device=fast.device))))
        if fast.prep is not None:
            step = native.launch_step(fast.entry.launcher, fast.prep,
                                      [where[k] for k in slots] + outs + work)
            if step is None:
                return None
            steps.append(step)
            device = fast.prep.device_index
            drop = fusion.__dict__[_PROGS].drop_native
            if drop not in fast.prep.listeners:
                fast.prep.listeners.append(drop)
        where += outs
        effects += [("incr", fast, "runs"), ("setattr", ex, "last_run", fast.hit)]
    results = [where[k] if spec is None else add(("view", where[k], *spec))
               for k, spec in outputs]
    effects.append(("setitem", fusion.__dict__, _REPORT, report))
    return steps, results, effects, device


def last_report(fusion) -> RunReport | None:
    """The RunReport of the last execute of `fusion` (None before the first)."""
    return fusion.__dict__.get(_REPORT)


def run_summary(fusion) -> dict:
    """{"kernels", "launched", "host_segments", "eager_segments", "copies", "segments"} of the
    last run."""
    r = last_report(fusion)
    return r.as_dict() if r is not None else {"kernels": 0, "launched": 0, "host_segments": 0,
                                              "eager_segments": 0, "copies": 0, "segments": []}


def get_executor(fusion, mode: str = "cuda"):
    """The cached FusionExecutor of `fusion` (None if its scheduler refuses it)."""
    return _executor(fusion, mode)


def _executor(fusion, mode: str, checked: bool = False):
    per_fusion = fusion.__dict__.get(_ATTR)
    if per_fusion is not None and mode in per_fusion:
        return per_fusion[mode]
    from ..codegen.api import can_schedule
    from .executor import FusionExecutor, note_fallback
    ok, reason = (True, "") if checked else can_schedule(fusion)
    if ok:
        ex = FusionExecutor(fusion, mode=mode)
    else:
        note_fallback(reason)
        ex = None
    fusion.__dict__.setdefault(_ATTR, _Executors())[mode] = ex
    _holders.add(fusion)
    return ex


def _segment_executor(fusion, mode: str):
    """Executor of a kernel segment's program (the segmenter already had it accepted; the codegen
    api plans it with the scheduler named by its `kernel_scheduler`)."""
    return _executor(fusion, mode, checked=True)




def _scalars_to_device(fusion, inputs) -> list:
    """0-dim CPU tensor inputs next to CUDA tensors (eager allows it) move to the CUDA device."""
    device = None
    for i, x in enumerate(inputs):
        if isinstance(x, torch.Tensor) and not x.is_cuda and x.dim() == 0 and i < len(fusion.inputs) \
                and isinstance(fusion.inputs[i], TensorView):
            if device is None:
                device = next(t.device for t in inputs if isinstance(t, torch.Tensor) and t.is_cuda)
                inputs = list(inputs)
            inputs[i] = x.to(device)
    return inputs


def _evaluate(fusion, inputs) -> list:
    from ..ir.evaluator import evaluate
    return evaluate(fusion, inputs)


def clear_caches() -> None:
    """Forget every executor (in-memory kernel caches); the disk cache stays."""
    from ..segment.segmenter import forget_all
    forget_all()
    for fusion in list(_holders):
        fusion.__dict__.pop(_ATTR, None)
        progs = fusion.__dict__.get(_PROGS)
        if progs is not None:            # emptied, not dropped: frontends hold its `run`
            progs.clear()
    _holders.clear()
