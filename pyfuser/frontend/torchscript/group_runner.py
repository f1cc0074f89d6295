"""One fusion group of a fused graph at run time: lowering per input signature, guards, the
eager fallback, and the group's fast call.

`GroupRunner(node, index)` runs one `prim::PyfuserGroup`:
  * `run(args, stats, cpu_mode, ctx)` is the checked call. The group is lowered once per guard
    signature (passes/guards.py: dtype, rank, device, size-1 axes, stride order per tensor;
    type per scalar) and per value of the inputs the lowering needs as constants (view sizes
    made of `aten::size` results: `lowering.specialised_inputs`), at most MAX_VARIANTS times,
    then new ones run eagerly (logged). New sizes of a seen signature reuse its lowering (no
    recompile). A 0-dim CPU tensor beside CUDA tensors enters the fusion by value (a kernel
    parameter, `lower_graph(by_value=)`), never copied to the device. Inputs whose guard key
    (dtype, sizes, strides, device per tensor) passed before skip the signature.
  * runs eagerly, under autograd, when grad mode is on and an input requires grad (pyfuser's
    kernels have no backward): outputs require grad exactly when eager's do;
  * a lowering that fails is remembered for its signature (that signature runs eagerly, logged
    once); a PyfuserError while running makes the group eager for good; an ExecuteError (these
    sizes do not fit the fusion) runs that call eagerly. Every fallback is the eager subgraph.
  * `fast(args)`: the outputs through a recorded program, or None (then `run`). After a CUDA
    call that recorded a dispatch program (runtime/dispatch.py) for its fusion inputs, the
    group keeps, under one key over its own inputs (`fast_key`: per tensor dtype, sizes,
    strides, data_ptr % 16, device, and the value of a by-value input; per scalar its value;
    a specialised list its value), a generated entry: fusion inputs, pointers, the program,
    outputs (host-answered sizes fixed by the key). One key and one lookup per call.
  * `entry_source(args)` gives the code of the entry for these inputs without the key, for a
    call plan (plan.py) whose own key fixes them.
`stats` (jit.RunStats) is told what ran: kernels launched (CUDA) or kernel segments run (CPU),
host and eager segments, fallbacks.
"""
from __future__ import annotations

import logging
import math

import torch

from ...dump import dump
from ...errors import ExecuteError, PyfuserError
from ...ir.shapes import bind
from ...runtime import dispatch
from ...runtime.call_keys import slow_env
from ..lowering import lower_graph
from ..lowering.lower import HostValue, specialised_inputs
from .passes.groups import GROUP_KIND
from .passes.guards import signature
from .types import BoolType, FloatType, IntType, ListType, TensorType, TupleType

log = logging.getLogger("pyfuser")

GRAD_REASON = ("an input requires grad and grad mode is on: pyfuser's kernels have no "
               "backward, so this group runs eagerly with autograd (call under torch.no_grad() "
               "or torch.inference_mode() to fuse)")
MAX_VARIANTS = 16          # lowerings kept per group (signatures x specialised values)
_MAX_PASSED = 256
_MAX_FAST = 256


def freeze(a):
    return tuple(freeze(e) for e in a) if isinstance(a, (list, tuple)) else a


def _guard_key(args) -> tuple:
    """What the guard signature is a function of, cheap to build and hash: per tensor its dtype,
    sizes, strides and device; per other value its type."""
    return tuple((a.dtype, a.shape, a.stride(), a.device) if isinstance(a, torch.Tensor)
                 else type(a) for a in args)


def _by_value(args) -> tuple:
    """Positions of 0-dim CPU tensors among args that also hold a CUDA tensor."""
    if not any(isinstance(a, torch.Tensor) and a.is_cuda for a in args):
        return ()
    return tuple(i for i, a in enumerate(args) if isinstance(a, torch.Tensor)
                 and a.dim() == 0 and not a.is_cuda)


def item_key(t):
    """A by-value input's part of a fast key: its value (and sign: -0.0 is not 0.0) when it is
    on the CPU (passed by value), else None."""
    if not t.is_cpu:
        return None
    v = t.item()
    return v.__class__, v, math.copysign(1.0, v.real if isinstance(v, complex) else v)


def key_expr(name: str, type_, by_value: bool = False):
    """The fast-key expression of one group input of declared type `type_` (None: the group
    has no fast key: an Optional or other input whose runtime type may vary)."""
    if isinstance(type_, TensorType):
        facts = f"{name}.dtype, {name}.shape, {name}.stride(), {name}.data_ptr() & 15, " \
                f"{name}.device"
        return f"{facts}, _item({name})" if by_value else facts
    if isinstance(type_, FloatType):
        return f"{name}.__class__, {name}, _sign(1.0, {name})"
    if isinstance(type_, (IntType, BoolType)):
        return f"{name}.__class__, {name}"
    if isinstance(type_, (ListType, TupleType)):
        return f"_freeze({name})"
    return None


class GroupRunner:
    def __init__(self, node, index: int):
        self.node, self.index = node, index
        self.subgraph = node.g("Subgraph")
        self.special = specialised_inputs(self.subgraph)
        self.lowered = None           # the first lowering (its fusion: dumps, tests)
        self.variants: dict = {}      # (signature, specialised values) -> LoweredGraph or reason
        self.dead = None              # reason this group runs eagerly for good
        self._logged: set = set()
        self._passed: dict = {}       # guard key -> (LoweredGraph, on CUDA) or reason
        self._host: dict = {}         # (guard key, lowering) -> host-answered outputs
        self._fast: dict = {}         # fast key -> entry(args) -> outputs
        self._by_value_seen: set = set()
        self.key_of = self._make_key()
        self.listeners: list = []     # called when the fast entries are dropped (plans)

    @property
    def name(self) -> str:
        return f"{GROUP_KIND}_{self.index} -> " + ", ".join("%" + v.debug_name for v in self.node.outputs)

    # ---- the checked call ------------------------------------------------------------------
    def _fallback(self, reason, args, ctx, stats):
        stats.fallbacks.append({"node": self.name, "kind": GROUP_KIND, "reason": reason})
        stats.eager_groups += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.info("pyfuser: %s runs eagerly: %s", self.name, reason)
            dump("fallback", self.name, reason)
        return ctx.run_graph(self.subgraph, args)

    def _lower(self, args):
        """The LoweredGraph for these inputs' signature and specialised values (lowered on first
        sight), or the reason they run eagerly."""
        vkey = (signature(args), tuple(freeze(args[i]) for i in self.special))
        lowered = self.variants.get(vkey)
        if lowered is not None:
            return lowered
        if len(self.variants) >= MAX_VARIANTS:
            return (f"more than {MAX_VARIANTS} specialisations (input signatures and values of "
                    + ", ".join(["sizes"] + [f"%{self.subgraph.inputs[i].debug_name}"
                                             for i in self.special]) + ")")
        by_value = _by_value(args)
        try:
            lowered = lower_graph(self.subgraph, args, by_value)
        except PyfuserError as e:
            lowered = f"lowering failed: {e}"
        self.variants[vkey] = lowered
        if not isinstance(lowered, str):
            if lowered.by_value and not set(lowered.by_value) <= self._by_value_seen:
                self._by_value_seen |= set(lowered.by_value)
                self.key_of = self._make_key()
                self.drop_fast()
            if self.lowered is None:
                self.lowered = lowered
                dump("fusion_ir", self.name, lambda: str(lowered.fusion))
        return lowered

    def _admit(self, args):
        lowered = self._lower(args)
        if isinstance(lowered, str):
            return lowered
        return lowered, any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)

    def run(self, args, stats, cpu_mode, ctx):
        if self.dead is not None:
            return self._fallback(self.dead, args, ctx, stats)
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            return self._fallback(GRAD_REASON, args, ctx, stats)
        key = _guard_key(args)
        if self.special:                 # and the values the group is specialised on
            key = (key, tuple(freeze(args[i]) for i in self.special))
        hit = self._passed.get(key)
        if hit is None:                  # not seen yet: the full guard signature
            hit = self._admit(args)
            if len(self._passed) >= _MAX_PASSED:
                self._passed.clear()
            self._passed[key] = hit
        if isinstance(hit, str):
            return self._fallback(hit, args, ctx, stats)
        lowered, on_cuda = hit
        fusion = lowered.fusion
        fargs = lowered.fusion_args(args)
        try:
            outs = dispatch.execute_fusion(fusion, fargs, None if on_cuda else cpu_mode) \
                if fusion.outputs else []
            host = self._host_values(key, lowered, fargs) if lowered.host_values else None
        except ExecuteError as e:        # these inputs only (a size the fusion cannot take)
            return self._fallback(f"inputs not accepted: {e}", args, ctx, stats)
        except PyfuserError as e:
            self.dead = f"execution failed: {type(e).__name__}: {e}"
            self.drop_fast()
            return self._fallback(self.dead, args, ctx, stats)
        stats.add_run(dispatch.last_report(fusion) if fusion.outputs else None, on_cuda)
        result = [outs[i] for i in lowered.output_map] if host is None else \
            [outs[m] if h is None else (list(h) if isinstance(h, list) else h)
             for m, h in zip(lowered.output_map, host)]
        if on_cuda and self.key_of is not None:
            self._remember(args, lowered, fargs, host)
        return result

    def _host_values(self, key, lowered, fargs) -> list:
        """Per graph output, its HostValue's value (None for kernel outputs); the sizes are fixed
        by the guard key, so they are computed once per key."""
        host = self._host.get((key, id(lowered)))
        if host is None:
            b = bind(lowered.fusion, fargs)
            if len(self._host) >= _MAX_PASSED:
                self._host.clear()
            host = self._host[(key, id(lowered))] = [
                m.value(b) if isinstance(m, HostValue) else None for m in lowered.output_map]
        return host

    # ---- the fast call ----------------------------------------------------------------------
    def _make_key(self):
        """Generate `key_of(args)` (see the module docstring); None when an input's declared
        type does not fix what the key must hold."""
        parts = []
        for i, v in enumerate(self.subgraph.inputs):
            e = key_expr(f"a[{i}]", v.type, i in self._by_value_seen)
            if e is None:
                return None
            parts.append(e)
        src = "def key_of(a):\n    return (" + "".join(f"{p}, " for p in parts) + ")\n"
        env = {"_sign": math.copysign, "_freeze": freeze, "_item": item_key}
        exec(compile(src, f"<pyfuser group {self.index} key>", "exec"), env)  # noqa: S102
        return env["key_of"]

    def fast(self, args):
        """The outputs through this group's fast entry for `args`, or None (then the checked
        path runs: also when grad mode is on and an input requires grad, which the fast key
        does not hold)."""
        try:
            entry = self._fast.get(self.key_of(args))
        except Exception:  # noqa: BLE001 - not the declared kinds of input: the checked path
            return None
        if entry is None or slow_env():
            return None
        if torch.is_grad_enabled() and any(isinstance(a, torch.Tensor) and a.requires_grad
                                           for a in args):
            return None
        return entry(args)

    def drop_fast(self) -> None:
        self._fast.clear()
        for cb in list(self.listeners):
            cb()

    def _remember(self, args, lowered, fargs, host) -> None:
        """Keep a fast entry for these inputs if the dispatcher recorded a program for them
        (once per fast key: a plan that calls the checked path does not build it again)."""
        try:
            key = self.key_of(args)
        except Exception:  # noqa: BLE001
            return
        if key in self._fast:
            return
        entry = self.entry_for(args, lowered, fargs, host)
        if entry is None:
            return
        if len(self._fast) >= _MAX_FAST:
            self.drop_fast()
        self._fast[key] = entry

    def program_for(self, lowered, fargs):
        """(program, fusion's _Programs) recorded for these fusion inputs, or None."""
        fusion = lowered.fusion
        if not fusion.outputs:
            return None, None         # nothing to launch: host-answered outputs only
        progs = fusion.__dict__.get(dispatch._PROGS)
        if progs is None:
            return None
        try:
            hit = progs.runs.get(progs.key_of(fargs)[0])
        except Exception:  # noqa: BLE001
            return None
        if hit is None:
            return None
        if self.drop_fast not in progs.listeners:
            progs.listeners.append(self.drop_fast)
        return hit[0], progs

    def entry_source(self, args, names, lowered=None, fargs=None, host=None):
        """(lines, env, outputs) computing this group's outputs for inputs like `args` (same
        fast key) held in variables `names`, through the recorded program: `lines` run it,
        `outputs` are an expression per group output; None when no program is recorded."""
        if lowered is None:
            hit = self._passed.get(self._passed_key(args))
            if hit is None or isinstance(hit, str):
                return None
            lowered = hit[0]
            fargs = lowered.fusion_args(args)
            host = self._host_values(self._passed_key(args), lowered, fargs) \
                if lowered.host_values else None
        found = self.program_for(lowered, fargs)
        if found is None:
            return None
        prog = found[0]
        env = {}
        fnames = []
        tensor_names = []
        for i in lowered.input_indices:
            if i in lowered.by_value:
                fnames.append(f"{names[i]}.item()")
            else:
                fnames.append(names[i])
                if isinstance(args[i], torch.Tensor):
                    tensor_names.append(names[i])
        tag = f"G{self.index}_{id(lowered)}"
        lines = []
        direct = None                  # views of the inputs only: no program call at all
        if prog is not None and getattr(prog, "kernels", None) == 0:
            direct = []
            for k, spec in prog.outputs:
                if spec is None:
                    direct.append(fnames[k])
                else:
                    env[f"V{tag}_{len(direct)}"] = spec
                    direct.append(f"{fnames[k]}.as_strided(*V{tag}_{len(direct)})")
        elif prog is not None and _native_program(found[1], fargs):
            # the program is the native runner's: the fusion's whole cached call runs there
            # (key, allocations, launches in C++); a miss falls through to the Python program
            # or the checked path
            env[f"R{tag}"] = found[1]
            lines.append(f"_o = R{tag}.run([{', '.join(fnames)}])")
        elif prog is not None:
            env[f"P{tag}"] = prog
            lines.append(f"_o = P{tag}([{', '.join(fnames)}], "
                         f"[{', '.join(n + '.data_ptr()' for n in tensor_names)}])")
        outs = []
        for k, m in enumerate(lowered.output_map):
            h = host[k] if host is not None else None
            if h is None:
                outs.append(direct[m] if direct is not None else f"_o[{m}]")
            else:
                env[f"H{tag}_{k}"] = h
                outs.append(f"list(H{tag}_{k})" if isinstance(h, list) else f"H{tag}_{k}")
        return lines, env, outs

    def _passed_key(self, args):
        key = _guard_key(args)
        if self.special:
            key = (key, tuple(freeze(args[i]) for i in self.special))
        return key

    def entry_for(self, args, lowered, fargs, host):
        """A generated entry(args) -> outputs for inputs with the fast key of `args`."""
        names = [f"a[{i}]" for i in range(len(args))]
        made = self.entry_source(args, names, lowered, fargs, host)
        if made is None:
            return None
        lines, env, outs = made
        src = "def entry(a):\n" + "".join(f"    {x}\n" for x in lines) + \
            f"    return [{', '.join(outs)}]\n"
        exec(compile(src, f"<pyfuser group {self.index} entry>", "exec"), env)  # noqa: S102
        return env["entry"]


def _native_program(progs, fargs) -> bool:
    """Whether the program recorded for `fargs` is (now) the native runner's: a pending one is
    handed over here, as the fusion's first cached hit would."""
    if progs.native is False:
        return False
    try:
        key = progs.key_of(fargs)[0]
    except Exception:  # noqa: BLE001
        return False
    if key in progs.pending:
        progs.handoff(fargs, key)
    return key in progs.native_data


__all__ = ["GroupRunner", "GRAD_REASON", "MAX_VARIANTS", "freeze", "key_expr"]
