"""CUDA graphs for call plans: `pyfuser.jit(f, cuda_graphs=True)`.

Per input signature (plan key) the first call makes the plan (plan.py); the second captures
the plan into a CUDA graph; later calls replay it. What a caller sees:

- **Inputs are copied** into the graph's own input buffers (one device-to-device copy per
  tensor input, skipped when the caller passes those buffers' own tensors back), so new tensors
  may be passed on every call, as with any function.
- **Outputs are fresh tensors**: each call returns copies of the graph's output buffers (one
  copy per storage, on the GPU, strides and aliasing kept), so a result stays valid after later
  calls. (Non-tensor outputs are the values of the capturing call; the key fixes them.)
- **Parameters and buffers are captured by address**: updating them in place (optimizer steps,
  `load_state_dict`, `.copy_()`) is seen by the next replay; replacing one (assigning a new
  tensor, `.data = ...`, moving the module) is detected (its address changed) and the graph is
  captured again.
- A signature is replayed only when every top-level input is a CUDA tensor or a value the key
  fixes (ints, bools, strings, None): a float input, a CPU tensor or any other input would be
  frozen at its captured value, so such calls run the plan without a graph. So do graphs that
  write an input in place, that return a tensor sharing memory with an input, signatures with
  an input that overlaps itself (an expanded tensor), or whose capture fails (a host
  synchronisation, a data-dependent shape; logged once): their plan runs as is.
- Each captured signature holds its own memory pool (inputs, outputs and intermediates of one
  call); at most MAX_GRAPHS signatures keep a graph per compiled function (oldest dropped).

`GraphedPlan` wraps a Plan with the same interface (`fn`, `stats`, `sites`, `error`). Capture
and replay go through runtime/graph_capture.py's `Backend` (`torch.cuda.CUDAGraph`; tests give
a stand-in that replays by running the captured function on the same buffers).
"""
from __future__ import annotations

import logging

import torch

from ...runtime.graph_capture import Backend, fresh_copies, overlaps_itself, tensors_of
from .plan import FACTS, VALUE, input_level

log = logging.getLogger("pyfuser")
MAX_GRAPHS = 8


def graphable(graph, skip: int) -> str | None:
    """Why the graph's plans cannot be replayed from a CUDA graph at all (None: they can): every
    input must be a tensor or a value the key fixes, and no tensor input may be written."""
    from .passes.aliasing import AliasInfo
    from .types import TensorType
    for v in graph.inputs[skip:]:
        lv = input_level(v.type)
        if lv not in (FACTS, VALUE):
            return f"input %{v.debug_name} of type {v.type} is not fixed by the plan key"
    info = AliasInfo(graph)
    for v in graph.inputs[skip:]:
        if isinstance(v.type, TensorType) and info.is_mutated(v):
            return f"input %{v.debug_name} may be written in place"
    return None


class GraphedPlan:
    """A Plan replayed from a CUDA graph from its second call on (see the module docstring)."""
    __slots__ = ("plan", "compiled", "backend", "graph", "static_in", "static_out",
                 "out_tensors", "attrs", "failed", "calls")

    def __init__(self, plan, compiled, backend):
        self.plan, self.compiled, self.backend = plan, compiled, backend
        self.graph = self.static_in = self.static_out = None
        self.out_tensors = []
        self.attrs = ()
        self.failed = None
        self.calls = 0

    direct = None                      # never the native runner: the graph answers

    @property
    def stats(self):
        return self.plan.stats

    @property
    def sites(self):
        return self.plan.sites

    @property
    def source(self):
        return self.plan.source

    def error(self, e):
        return self.plan.error(e)

    def fn(self, *args):
        if self.failed is not None:
            return self.plan.fn(*args)
        if self.graph is None:
            return self._capture(args)
        for s, x in zip(self.static_in, args):
            if s is not None and x.data_ptr() != s.data_ptr():
                s.copy_(x)
        for getter, name, ptr in self.attrs:
            if getter(name).data_ptr() != ptr:     # a parameter replaced: capture again
                self.graph = None
                return self._capture(args)
        self.backend.replay(self.graph)
        self.compiled.last_run = self.plan.stats
        return fresh_copies(self.static_out)

    def _give_up(self, reason, args):
        self.failed = reason
        self.graph = self.static_in = self.static_out = None
        log.info("pyfuser: this input signature runs without a CUDA graph: %s", reason)
        return self.plan.fn(*args)

    def _capture(self, args):
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if any(not t.is_cuda for t in tensors):
            return self._give_up("a tensor input is not on a CUDA device", args)
        if torch.is_grad_enabled():
            return self._give_up("grad mode is on (call under torch.no_grad() or "
                                 "torch.inference_mode() to replay a graph)", args)
        if any(overlaps_itself(t) for t in tensors):
            return self._give_up("an input overlaps itself (an expanded tensor): no buffer of "
                                 "its strides can be copied into", args)
        self.compiled._note_graph(self)
        static = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                  if isinstance(a, torch.Tensor) else None for a in args]
        for s, a in zip(static, args):
            if s is not None:
                s.copy_(a)
        call_args = [s if s is not None else a for s, a in zip(static, args)]
        device = tensors[0].device if tensors else torch.device("cuda")
        attrs = self.plan_attrs()
        try:
            graph, out = self.backend.capture(lambda: self.plan.fn(*call_args), device)
        except Exception as e:  # noqa: BLE001 - capture refused: run the plan as is
            return self._give_up(f"capture failed: {type(e).__name__}: "
                                 f"{str(e).splitlines()[0] if str(e) else ''}", args)
        outs = tensors_of(out, [])
        ins = {s.untyped_storage().data_ptr() for s in static if s is not None}
        if any(o.untyped_storage().data_ptr() in ins for o in outs):
            return self._give_up("an output shares memory with an input", args)
        self.graph, self.static_in, self.static_out, self.out_tensors = graph, static, out, outs
        self.attrs = attrs
        self.backend.replay(graph)          # the capture ran nothing: this call's results
        self.compiled.last_run = self.plan.stats
        return fresh_copies(out)

    def release(self) -> None:
        """Drop the captured graph (its memory); a later call captures again."""
        self.graph = self.static_in = self.static_out = None
        self.out_tensors = []

    def plan_attrs(self):
        """(getter, name, data_ptr) of every tensor attribute the plan reads per call."""
        found = []
        for getter, name in self.plan.attr_reads:
            try:
                v = getter(name)
            except Exception:  # noqa: BLE001
                continue
            if isinstance(v, torch.Tensor):
                found.append((getter, name, v.data_ptr()))
        return tuple(found)


__all__ = ["GraphedPlan", "Backend", "MAX_GRAPHS", "graphable"]
