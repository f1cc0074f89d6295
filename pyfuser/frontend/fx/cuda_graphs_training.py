"""CUDA graphs for torch.compile's training graphs: AOTAutograd's forward and backward, with
`mode="reduce-overhead"` / `cuda_graphs=True` as for inference graphs (cuda_graphs.py, whose
rules on signatures, random ops and inputs written in place hold here too).

A training step's graphs hand tensors to each other: the forward's outputs past its user-visible
ones (AOTAutograd's `num_forward`) are saved for the backward, which reads them after the
forward returned, and the backward's outputs become parameters' `.grad`. Copying them out of the
graph's memory on every call, as inference results are, would move every activation and every
gradient twice. So a `GraphedTraining` hands them out as they lie:

- **Held outputs** (saved tensors, gradients) are tensors on the graph's own output memory (or
  on the buffer an input was copied into). Before a replay writes that memory again, the call
  checks that every tensor handed out by the previous replay is gone: the use count of each
  held storage is back to what it was before those tensors were made (autograd frees a
  step's saved tensors after its backward; `zero_grad()` drops the gradients). Where one is
  still alive (two forwards before their backwards, a gradient kept across steps, a saved
  tensor kept by `retain_graph=True`), the call runs the graph as it is instead: new memory,
  the same results, logged once. A view of a held tensor keeps its storage in use, so it
  counts as alive too. One tensor the graph returns twice (a gradient of two parameters) is
  handed out twice as one tensor, as a run returns it: autograd makes a gradient nothing else
  references `.grad` as it is and copies the others, so two tensors on its memory would both
  become `.grad` and an in-place update of one (clip_grad_norm_) would change the other.
- **User outputs** (the forward's first `num_forward`, after the effect tokens an effectful op
  adds: its results and the new values of inputs it mutates) are copies, as inference
  results: a caller keeps the loss of the last step while calling the next.
- **Inputs read in place**: the forward's parameters and buffers (AOTAutograd's static inputs)
  and every backward input that is not a tangent (the saved tensors, parameters) are read
  where they lie: their addresses are part of the signature, so the backward of a replayed
  forward (whose saved tensors are always at the same addresses) replays, and a call whose
  saved tensors lie elsewhere (their forward ran as it is) takes another signature, run as it
  is once and captured on its second sighting. Tangents and the forward's other inputs are
  copied into the graph's buffers. An output that is an input read in place is handed back
  as that input (or a view of it), as a run returns it; where parameters share one storage
  (views of one flat buffer), as the one it lies in, whose version counter it must carry (no
  graph where no single one holds it).

The graph holds no reference to its inputs (a capture drops its arguments), so the saved
tensors it read are freed by autograd as they would be.

**Memory-efficient attention's dropout seed** (`_scaled_dot_product_efficient_attention`, the
float32 SDPA kernel): its forward returns the seed and offset of its dropout mask as host
tensors when it runs as it is and as device tensors when it is captured, and its backward reads
them in the same way (a host run dereferences the pointer on the host: a device tensor there
crashed the process; a capture records the pointer: a host tensor there would be read by the
device). So a backward run as it is (its first call, a busy call, its warm-up before a capture)
gets host copies of seeds that lie on the device (a replayed forward's: one small copy each),
and a backward whose seeds lie on the host (its forward ran as it is) is not captured (the
capture is refused, the call runs as it is).
"""
from __future__ import annotations

import functools
import logging

import torch

from ...runtime.graph_capture import fresh_copies
from .cuda_graph_outputs import holders
from .cuda_graphs import _SCALARS, GraphedInference

log = logging.getLogger("pyfuser")
# how a replay hands out each output past the user's (GraphedTraining's plan): _VALUE, _EMPTY,
# (_SAME, k): output k again, (_INPUT, i): input i itself, (_VIEW, i): a view within input i,
# (_HELD, (storage, dtype, sizes, strides, offset)): a new tensor on a held storage
_VALUE, _EMPTY, _HELD, _SAME, _INPUT, _VIEW = "value", "empty", "held", "same", "input", "view"


class GraphedTraining(GraphedInference):
    """A forward or backward CompiledGraph replayed from CUDA graphs (module docstring).
    `keyed_idx`: the inputs read in place; `user_outputs`: how many leading outputs the caller
    sees (copied); boxed call."""
    keyed_by_address = True

    def __init__(self, compiled, keyed_idx, user_outputs: int, why_not=None, backend=None,
                 written=(), seeds=()):
        super().__init__(compiled, keyed_idx, why_not, backend, written)
        self.user_outputs = user_outputs
        self.busy = 0                     # calls run as they are: earlier results still in use
        self.seeds = tuple(seeds)         # inputs that are attention dropout seeds (docstring)
        if self.seeds:
            self.run = functools.partial(_run_with_seeds, compiled, self.seeds)

    def _free(self, e) -> bool:
        if e.counts is None or self._use_counts(e.held) == e.counts:
            return True
        self.busy += 1
        if self.busy == 1:
            log.info("pyfuser: a call of %s runs without its CUDA graph: tensors its previous "
                     "replay handed out (saved for a backward, gradients) are still in use",
                     self.compiled.__name__)
        return False

    def _plan_outputs(self, e, out, call_args) -> str | None:
        if not isinstance(out, (list, tuple)):
            return f"its result is a {type(out).__name__}, not a list"
        inputs = {}
        for i, a in enumerate(call_args):
            if isinstance(a, torch.Tensor) and a.untyped_storage().nbytes():
                inputs.setdefault(a.untyped_storage().data_ptr(), []).append(i)
        plan, held, first = [], {}, {}
        for j, o in enumerate(out):
            if j >= self.user_outputs and isinstance(o, torch.Tensor):
                k = first.setdefault(id(o), j)
                if k != j:                # one tensor twice (two equal gradients): the same
                    plan.append((_SAME, k))    # tensor twice, as a run returns it
                    continue
            if not isinstance(o, torch.Tensor):
                if not isinstance(o, _SCALARS):
                    return f"output {j} is a {type(o).__name__}"
                plan.append(_VALUE)       # a size saved for the backward, a None gradient
                continue
            st = o.untyped_storage()
            ins = inputs.get(st.data_ptr()) if st.nbytes() else None
            if j < self.user_outputs:
                if ins:
                    return f"output {j} shares memory with input {ins[0]}"
                plan.append(None)         # copied
                continue
            i = _input_of(o, ins, call_args) if ins else None
            if ins and i is None:
                return f"output {j} lies on the memory of inputs {ins}, not in one of them"
            if not st.nbytes():
                plan.append(_EMPTY)
            elif i is not None and i in self.static_idx:
                plan.append((_INPUT if o is call_args[i] else _VIEW, i))
            else:
                st = held.setdefault(st.data_ptr(), st)
                plan.append((_HELD, (st, o.dtype, tuple(o.shape), o.stride(),
                                     o.storage_offset())))
        e.plan, e.held, e.counts = plan, list(held.values()), None
        # the native hand_out's items: the held outputs' (storage, dtype, sizes, strides, offset)
        e.made = None if self.native() is None else [
            h[1] for h in plan if type(h) is tuple and h[0] is _HELD]
        return None

    def _use_counts(self, storages) -> tuple:
        """Each held storage's holders (cuda_graph_outputs.holders: a caller holding only its
        storage object, `grad.untyped_storage()`, counts too)."""
        return holders(storages, self.native())

    def _results(self, e, args):
        n = self.user_outputs
        users = fresh_copies(list(e.out[:n]))
        e.counts = self._use_counts(e.held)          # before this call's tensors exist
        res = users
        made = iter(self.native().hand_out(e.made)) if e.made is not None else None  # one call
        for o, how in zip(e.out[n:], e.plan[n:]):
            kind = how[0] if type(how) is tuple else how   # the common kinds inline (a
            if kind is _HELD and made is not None:          # hundred a call)
                res.append(next(made))
            elif kind is _SAME:
                res.append(res[how[1]])
            elif kind is _INPUT:                            # a saved parameter
                res.append(args[how[1]])
            else:
                res.append(_hand_out(o, how, args))
        return tuple(res) if isinstance(e.out, tuple) else res


def _input_of(o, ins, args):
    """Which of the inputs `ins` (those on output `o`'s storage) `o` is, or is a view within:
    parameters may share one storage (views of one flat buffer, `p.data = flat[a:b]`), and the
    one handed back carries that parameter's version counter (an in-place update before the
    backward is the error it is in eager). None where no single one holds `o`."""
    if len(ins) == 1:
        return ins[0]
    for i in ins:
        if o is args[i]:
            return i
    inside = [i for i in ins if _within(o, args[i])]
    return inside[0] if len(inside) == 1 else None


def _within(o, a) -> bool:
    """Whether the memory `o` spans lies in the memory `a` spans (both on one storage)."""
    def span(t):
        last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
        return t.storage_offset() * t.element_size(), \
            (t.storage_offset() + last + 1) * t.element_size()
    if not o.numel() or not a.numel():
        return False
    (lo, hi), (a_lo, a_hi) = span(o), span(a)
    return a_lo <= lo and hi <= a_hi


def _hand_out(o, how, args):
    """Output `o` of the captured run as this call receives it (see GraphedTraining): a new
    tensor on a held storage (built in one call on CUDA: a backward hands out a hundred), a
    value, an empty tensor, or the input (a view of it) it is."""
    if how is _VALUE:
        return o
    if how is _EMPTY:
        return torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
    kind, what = how
    if kind is _HELD:
        st, dtype, size, stride, offset = what
        if o.is_cuda and _on_cuda_storage is not None:
            return _on_cuda_storage({"size": size, "stride": stride, "dtype": dtype,
                                     "device": o.device, "storage_offset": offset}, st)
        return torch.empty(0, dtype=dtype, device=o.device).set_(st, offset, size, stride)
    a = args[what]
    return a if kind is _INPUT else a.as_strided(o.shape, o.stride(), o.storage_offset())


_on_cuda_storage = getattr(torch._C, "_construct_CUDA_Tensor_From_Storage_And_Metadata", None)


# the memory-efficient attention backwards, whose philox seed and offset arguments are read on
# the host outside a capture and on the device inside one (module docstring)
_SEEDED = ("_scaled_dot_product_efficient_attention_backward", "_efficient_attention_backward")


def attention_seed_inputs(gm) -> tuple:
    """The inputs of a backward graph that a memory-efficient attention backward takes as its
    dropout's philox seed or offset (placeholders: saved by the forward)."""
    index = {n: i for i, n in enumerate(n for n in gm.graph.nodes if n.op == "placeholder")}
    found = set()
    for n in gm.graph.nodes:
        if n.op != "call_function" or getattr(n.target, "_opname", None) not in _SEEDED:
            continue
        for k, arg in enumerate(n.target._schema.arguments):
            if arg.name in ("philox_seed", "philox_offset"):
                v = n.args[k] if k < len(n.args) else n.kwargs.get(arg.name)
                if v in index:
                    found.add(index[v])
    return tuple(sorted(found))


def _run_with_seeds(compiled, seeds, args):
    return compiled(seeds_for_this_run(args, seeds))


def seeds_for_this_run(args, seeds):
    """`args` with the attention seeds `seeds` where this run reads them: on the host outside
    a capture (a device seed copied), on the device inside one (a host seed refused: the capture
    fails and the call runs as it is)."""
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        if any(isinstance(args[i], torch.Tensor) and not args[i].is_cuda for i in seeds):
            raise RuntimeError("a memory-efficient attention's dropout seed is a host tensor "
                               "(its forward ran without a graph): a graph would read it on "
                               "the device")
        return args
    if not any(isinstance(args[i], torch.Tensor) and args[i].is_cuda for i in seeds):
        return args
    args = list(args)
    for i in seeds:
        if isinstance(args[i], torch.Tensor) and args[i].is_cuda:
            args[i] = args[i].cpu()
    return args


def user_output_count() -> int | None:
    """How many leading outputs of the forward AOTAutograd is compiling are the caller's (its
    `num_forward`: mutated inputs' new values, the results, intermediate bases, an RNG offset;
    the rest are saved for the backward), after the effect tokens that lead them where the graph
    keeps its tokens (an effectful op: `linalg.inv`'s error check, a print; Note [Side-Effectful
    Tokens in AOTAutograd]); None where its metadata is not at hand."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    n = getattr(meta, "num_forward", None)
    if not isinstance(n, int):
        return None
    if not getattr(torch._functorch.config, "unlift_effect_tokens", False):
        n += len(getattr(meta, "tokens", None) or ())
    return n


def backward_keyed_inputs(gm) -> tuple:
    """The inputs of a backward graph read in place: every placeholder but the tangents."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return tuple(i for i, p in enumerate(placeholders) if not str(p.target).startswith("tangents"))


__all__ = ["GraphedTraining", "attention_seed_inputs", "backward_keyed_inputs", "seeds_for_this_run",
           "user_output_count"]
