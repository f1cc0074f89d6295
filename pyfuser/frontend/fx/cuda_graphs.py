"""CUDA graphs for torch.compile's inference graphs: `torch.compile(m, backend="pyfuser",
mode="reduce-overhead")`, `options={"cuda_graphs": True}` or `pyfuser.compile(m,
cuda_graphs=True)`.

An inference graph (AOTAutograd's, when nothing needs a gradient) is wrapped in a
`GraphedInference`, a boxed callable like the CompiledGraph it wraps. Per input signature (each
tensor's shape, strides, dtype and device; the value of each other argument) the first call runs
the graph as it is (kernels compile and load, workspaces are made), the second captures it into a
CUDA graph (runtime/graph_capture.py) and later calls replay it: one graph launch instead of a
host call per region and per aten op, which is what a small batch or a bfloat16 model spends its
time on. What a caller sees:

- **Parameters and buffers are captured by address** (AOTAutograd's `static_input_indices`: a
  module's parameters, buffers and other tensor attributes, and tensors marked with
  `torch._dynamo.mark_static_address`): updating one in place (an optimizer step,
  `load_state_dict`, `.copy_()`) is seen by the next replay; passing another tensor in its place
  (a new address) captures again. The graph may write them (batch norm's running statistics in
  train mode under no_grad, a KV cache, a step counter): a replay writes them as a run does, and
  the capture puts back what its own runs of the graph wrote (its warm-up), so each call writes
  them once (a copy of each such tensor is held while a signature is captured).
- **Other tensor inputs are copied** into the graph's own buffers (one device copy each, skipped
  when the caller passes that buffer back), so new tensors may be passed on every call.
- **Outputs are the graph's own memory** (option `cuda_graph_outputs="graph"`, the default, as
  Inductor's CUDA graphs): valid until the next call with the same signature replays the graph
  (or the graph is dropped), when a tensor still held is invalidated: reading it raises, it never
  changes silently (cuda_graph_outputs.py). With `cuda_graph_outputs="copy"` they are copies of
  the graph's output buffers, valid for good, each storage they view copied once every call.
  Either way they have the strides, offsets and mutual aliasing the graph's own outputs have.
- **Random numbers** (dropout) are drawn anew by every replay: pyfuser's kernels add two
  device words to their seed and offset, which a captured `torch.randint` refreshes per replay
  (runtime/rng.py), and PyTorch's own random ops are graph-safe; a random draw seeded on the
  host alone (pyfuser's evaluator) fails the capture instead.
- A graph is not used (the graph runs as it is, the reason logged once) where replaying could
  differ from running: it writes an input that is not static
  (the write would land in the graph's copy); a tensor input is not on one CUDA device, or an
  argument is neither a tensor nor a bool / int / float / None; an input overlaps itself (an
  expanded tensor: no buffer of its strides takes a copy; a slice with gaps is copied); an
  output shares memory with an input (a copy would break that aliasing); the capture fails (a
  host synchronization, a data-dependent shape).
- At most MAX_GRAPHS signatures keep a graph per compiled graph (least recently used dropped);
  each holds its own memory pool.

Training graphs (forward and backward) are `GraphedTraining`s (cuda_graphs_training.py), which
hand the tensors saved for the backward and the gradients out of the graph's memory, checking
before each replay that the previous replay's are no longer in use.
"""
from __future__ import annotations

import logging
import struct
import weakref
from collections import OrderedDict

import torch

from ...runtime.graph_capture import (Backend, fresh_copies, overlaps_itself, shares_storage,
                                      tensors_of)
from .cuda_graph_outputs import SharedOutputs, drop_all, stale_message

log = logging.getLogger("pyfuser")
MAX_GRAPHS = 8
_SCALARS = (bool, int, float, type(None))
_DOUBLE = struct.Struct("<d")
_INT64 = struct.Struct("<q")


def _float_bits(v: float) -> int:
    """A float's 64 bits as an int64 (the native graph_key's value of a float)."""
    return _INT64.unpack(_DOUBLE.pack(v))[0]


_LIVE: "weakref.WeakSet" = weakref.WeakSet()


def graphed_calls() -> list:
    """The GraphedInference objects alive in this process (tests and benchmarks read their
    `captures` / `replays` counts)."""
    return list(_LIVE)


def written_inputs(gm, mutated_idx=()) -> frozenset:
    """The inputs the graph writes in place: `mutated_idx` (AOTAutograd's metadata) and every
    placeholder the graph copies into (a functionalized graph's input writes)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    copied = {n.args[0] for n in gm.graph.nodes
              if n.op == "call_function" and n.target is torch.ops.aten.copy_.default}
    return frozenset(mutated_idx) | {i for i, p in enumerate(placeholders) if p in copied}


def graph_wide_reason(gm, static_idx, mutated_idx=()) -> str | None:
    """Why no call of this inference graph may be replayed from a CUDA graph (None: calls may):
    it writes an input that is not static (written_inputs)."""
    written = sorted(written_inputs(gm, mutated_idx) - set(static_idx))
    if written:
        return (f"it writes input {written[0]} in place, which is not static (a parameter, "
                "buffer or tensor marked static)")
    return None


class _Entry:
    """One signature's state: the call count before capture, then the captured graph."""
    __slots__ = ("runs", "graph", "inputs", "ptrs", "out", "failed", "plan", "held", "counts",
                 "made", "hand")

    def __init__(self):
        self.runs = 0
        self.graph = self.inputs = self.ptrs = self.out = None
        self.failed = self.plan = self.held = self.counts = self.made = None
        self.hand = None                  # SharedOutputs: outputs on the graph's memory


class GraphedInference:
    """An inference CompiledGraph replayed from CUDA graphs (module docstring); boxed call."""
    keyed_by_address = False

    def __init__(self, compiled, static_idx=(), why_not=None, backend=None, written=(),
                 outputs="graph"):
        self._boxed_call = True
        self.__name__ = f"{compiled.__name__}_graphed"
        self.compiled = compiled
        # what runs the graph as it is or under a capture: `compiled` (GraphedTraining may wrap
        # it); it holds no reference to this object, nor does anything the entries hold
        self.run = compiled
        self.static_idx = frozenset(static_idx)
        self.written = frozenset(written) & self.static_idx   # static inputs the graph writes
        self.why_not = why_not
        self.backend = backend or Backend()
        self.entries: "OrderedDict[tuple, _Entry]" = OrderedDict()
        self.captures = self.replays = 0
        self._logged: set = set()
        self._native = None                   # the native runner's module, False without one
        self._masks: dict = {}                # argument count -> keyed mask (graph_key's)
        # "graph": outputs on the graph's memory where the backend can invalidate them
        self.outputs = outputs if getattr(self.backend, "can_invalidate", False) else "copy"
        self.stale = 0                        # handed-out storages invalidated while in use
        _LIVE.add(self)
        # the graphs go with this object: what they handed out and is still held is invalidated
        # (not at the interpreter's exit, when nothing is read any more and torch is going)
        weakref.finalize(self, drop_all, self.entries).atexit = False
        if why_not:
            log.info("pyfuser: %s runs without CUDA graphs: %s", compiled.__name__, why_not)

    def __getattr__(self, name):             # kernels(), report(), regions ... of the graph
        compiled = self.__dict__.get("compiled")
        if compiled is None:
            raise AttributeError(name)
        return getattr(compiled, name)

    def __call__(self, args):
        if self.why_not:
            return self.run(args)
        key = self.key(args)
        if key is None:
            return self.run(args)
        e = self.entries.get(key)
        if e is None:                        # the first call of a signature runs as it is
            e = self.entries[key] = _Entry()
            gone = [self.entries.popitem(last=False)[1].hand
                    for _ in range(len(self.entries) - MAX_GRAPHS)]
            # a hand-out nobody holds goes now (its memory with it); one in use after this call
            gone = [h for h in gone if h is not None and h.in_use()]
            return self._first_run(e, args, gone)
        self.entries.move_to_end(key)
        if e.failed is not None:
            return self.run(args)
        if e.graph is not None and not self._free(e):
            return self.run(args)          # a replay would overwrite results still in use
        if e.graph is not None and self._bind(e, args):
            if e.hand is not None:           # after the inputs' copies: one may be an output
                self.stale += e.hand.retire()
            self.backend.replay(e.graph)
            self.replays += 1
            return self._results(e, args)
        if e.runs == 0:
            return self._first_run(e, args, ())
        old, e.hand = e.hand, None           # captured again (a static input moved): the old
        try:                                 # graph goes once this call read its inputs (an
            return self._capture(e, args)    # output of the old one may be one)
        finally:
            self._drop(old)

    def _first_run(self, e, args, gone):
        """The first call of signature `e` runs as it is; then `gone` (the hand-outs in use of
        the graphs pushed out for it) go: one of its inputs may be an output of one of them."""
        e.runs += 1
        try:
            return self.run(args)
        finally:
            for hand in gone:
                self._drop(hand)

    # ---- what a subclass changes (cuda_graphs_training.py) ------------------------------
    def _free(self, e) -> bool:
        """Whether nothing handed out by an earlier replay of `e` still uses its buffers (an
        inference graph hands out copies only)."""
        return True

    def _results(self, e, args):
        """This call's results after a replay of `e`."""
        return e.hand.hand_out() if e.hand is not None else fresh_copies(e.out)

    def _plan_outputs(self, e, out, call_args) -> str | None:
        """Decide how replays hand out the captured outputs `out`; a reason where they
        cannot (the signature then runs without a graph)."""
        ins = [a for a in call_args if isinstance(a, torch.Tensor)]
        if shares_storage(tensors_of(out, []), ins):
            return "an output shares memory with an input"
        if self.outputs == "graph" and isinstance(out, (list, tuple)) and \
                all(isinstance(o, (torch.Tensor, *_SCALARS)) for o in out):
            e.hand = SharedOutputs(out, self.backend, stale_message(self.compiled.__name__),
                                   self.native())
        return None

    def _drop_hand(self, e) -> None:
        """`e`'s graph goes: what its replays handed out and is still held is invalidated."""
        hand, e.hand = e.hand, None
        self._drop(hand)

    def _drop(self, hand) -> None:
        if hand is not None:
            self.stale += hand.drop()

    def key(self, args):
        """The signature a graph is captured for, or None: this call runs without one. With
        `keyed_by_address` the static inputs' addresses are part of it (GraphedTraining). One
        pass over the arguments (a backward has a hundred or more, and this runs every call):
        in C++ where the native runner is built (its `graph_key`: the same facts, as bytes),
        else in Python (`python_key`). One object uses one of the two for its life."""
        fast = getattr(self.native(), "graph_key", None)
        if fast is None:
            return self.python_key(args)
        n = len(args)
        mask = self._masks.get(n)
        if mask is None:
            keyed = self.static_idx if self.keyed_by_address else ()
            mask = self._masks[n] = bytes(1 if i in keyed else 0 for i in range(n))
        k = fast(args, mask, getattr(self.backend, "any_device", False))
        if k is None and self.python_key(args) is not None:     # what only Python's key takes
            return self._skip("an argument the native key does not take (an int past int64)")
        return k

    def native(self):
        """The native runner's module (graph_key; a training graph's hand_out and use_counts),
        None where it is not built: looked up once, so one object uses one path for its life."""
        if self._native is None:
            from ...runtime import native
            self._native = native.runner_module() or False
        return self._native or None

    def python_key(self, args):
        """key() in Python: a tuple, or None (the reason logged)."""
        parts, device = [], None
        any_device = getattr(self.backend, "any_device", False)
        keyed = self.static_idx if self.keyed_by_address else ()
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor):
                d = a.get_device()                       # -1: not a CUDA tensor
                if d < 0 and not any_device:
                    return self._skip(f"input {i} is on {a.device}, not a CUDA device")
                if device is not None and d != device:
                    return self._skip("tensor inputs on more than one device")
                device = d
                parts.append((a.shape, a.stride(), a.dtype, a.storage_offset(),
                              a.data_ptr() if i in keyed else None))
            elif isinstance(a, _SCALARS):  # a float by its bits: -0.0 is not 0.0, NaNs of
                # another sign or payload are not one NaN (float.hex gives 'nan' for all)
                parts.append((type(a), _float_bits(a) if isinstance(a, float) else a))
            else:
                return self._skip(f"input {i} is a {type(a).__name__}")
        return (device, tuple(parts))

    def _skip(self, why):
        if why not in self._logged:
            self._logged.add(why)
            log.info("pyfuser: a call of %s runs without a CUDA graph: %s",
                     self.compiled.__name__, why)
        return None

    def _bind(self, e, args) -> bool:
        """Point the captured graph at this call's arguments: copy each non-parameter tensor into
        its buffer (one foreach copy); False where a parameter moved (capture again). Keyed by
        address (GraphedTraining), the key already held every parameter's address."""
        if not self.keyed_by_address:
            for i, ptr in e.ptrs.items():
                if args[i].data_ptr() != ptr:
                    return False
        dst, src = [], []
        for i, buf in e.inputs.items():
            a = args[i]
            if buf.data_ptr() != a.data_ptr():
                dst.append(buf)
                src.append(a)
        if len(dst) > 1:
            torch._foreach_copy_(dst, src)
        elif dst:
            dst[0].copy_(src[0])
        return True

    def _capture(self, e, args):
        bufs, ptrs, call_args = {}, {}, []
        for i, a in enumerate(args):
            if isinstance(a, torch.Tensor) and i not in self.static_idx:
                if overlaps_itself(a):
                    return self._give_up(e, f"input {i} overlaps itself (an expanded tensor): "
                                            "no buffer of its strides can be copied into", args)
                b = torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device=a.device)
                b.copy_(a)
                bufs[i] = b
                call_args.append(b)
            else:
                if isinstance(a, torch.Tensor):
                    ptrs[i] = a.data_ptr()
                call_args.append(a)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        # The capture runs the graph (its warm-up; a stand-in's capture too) before the replay
        # that answers this call: static inputs the graph writes (batch norm's running stats, a
        # KV cache, a step counter) are put back as they were, so this call writes them once.
        saved = [(a, a.clone()) for i, a in enumerate(args)
                 if i in self.written and isinstance(a, torch.Tensor)]
        call = BoundCall(self.run, call_args)
        try:
            graph, out = self.backend.capture(call, device)
        except Exception as ex:  # noqa: BLE001 - capture refused: this signature runs as it is
            _restore(saved)
            return self._give_up(e, f"capture failed: {type(ex).__name__}: "
                                    f"{str(ex).splitlines()[0] if str(ex) else ''}", args)
        _restore(saved)
        e.graph, e.inputs, e.ptrs, e.out = graph, bufs, ptrs, out
        why = self._plan_outputs(e, out, call_args)
        call.args = call_args = None         # the graph holds no reference to this call's inputs
        if why:
            return self._give_up(e, why, args)
        self.captures += 1
        self.backend.replay(graph)           # the capture ran nothing: this call's results
        self.replays += 1
        return self._results(e, args)

    def _give_up(self, e, reason, args):
        e.failed = reason
        self._drop_hand(e)
        e.graph = e.inputs = e.out = None
        log.info("pyfuser: an input signature of %s runs without a CUDA graph: %s",
                 self.compiled.__name__, reason)
        return self.run(args)


class BoundCall:
    """`compiled(args)` as the no-argument callable a capture records. Its `args` are
    dropped after the capture (a graph reads its inputs by address and must not keep them
    alive: tensors a forward hands out are freed by their users)."""
    __slots__ = ("compiled", "args")

    def __init__(self, compiled, args):
        self.compiled, self.args = compiled, list(args)

    def __call__(self):
        return self.compiled(list(self.args))


def _restore(saved) -> None:
    for t, value in saved:
        t.copy_(value)


__all__ = ["BoundCall", "GraphedInference", "MAX_GRAPHS", "graph_wide_reason", "graphed_calls",
           "written_inputs"]
