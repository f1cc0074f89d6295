"""`torch.compile(model, backend="pyfuser")` and `pyfuser.compile(model)`.

`pyfuser_backend(gm, example_inputs)` is the Dynamo backend: AOTAutograd (`aot_autograd`)
traces the graph Dynamo gives into functionalized aten graphs, a forward and a backward one when
something requires grad (an inference graph otherwise), and hands each to `compile_graph`, which
fuses what it can into regions run by pyfuser and leaves the rest (matmuls, convolutions,
attention, embeddings, copies into inputs) as the aten calls they are. The compiled graphs use
AOTAutograd's boxed calling convention.

The backend is registered under the entry-point group `torch_dynamo_backends` (pyproject.toml),
so after `pip install` `torch.compile(m, backend="pyfuser")` finds it with no import of pyfuser.

Decompositions: only those a fused kernel or the partitioner wants (`decompositions()`); every
other op reaches the backend as eager dispatches it, so what stays unfused runs eager's own
kernel. `_log_softmax` (amax, exp, sum, log: one online pass in the fused kernel) and
`nll_loss_backward` (an iota compare; no read of the log-probabilities' values) are decomposed
so that the min-cut partitioner can drop the [N, C] float32 log-probabilities a cross-entropy's
backward would otherwise get saved: it saves the logits (bfloat16 under autocast) and two
numbers a row, and the backward recomputes the log-probabilities in its own kernel. `detach`
becomes `alias` (what AOTAutograd's graphs run is autograd-free; the partitioner does not
recompute through a detach, so a detached output would be saved whole).

The forward / backward split is AOTAutograd's min-cut partitioner, which recomputes cheap
pointwise values in the backward instead of saving them, never a float reduction (whose bits
depend on the kernel's order: `_save_reductions`) (`PYFUSER_PARTITIONER=default`: the plain
split, every value the backward reads saved).

Options (`torch.compile(m, backend="pyfuser", options={...})` or `pyfuser.compile(m, ...)`):
`cuda_graphs` (bool, default False): inference, forward and backward graphs are replayed from
CUDA graphs (cuda_graphs.py, cuda_graphs_training.py); `mode="reduce-overhead"` asks for the
same, `mode="default"` for nothing; `cuda_graph_outputs` ("graph", the default, or "copy"): a
graphed inference call hands out its outputs on the graph's memory, valid until the next call
replays the graph into it, or as copies valid for good (cuda_graph_outputs.py);
other modes, unknown options and values of another type are an error, not silently ignored.
"""
from __future__ import annotations

import functools
import os

import torch

from .cuda_graph_outputs import MODES


def decompositions() -> dict:
    """The aten decompositions applied while tracing (see the module docstring)."""
    from torch._decomp import decomposition_table
    aten = torch.ops.aten
    table = {op: decomposition_table[op] for op in (
        aten._log_softmax.default, aten._log_softmax_backward_data.default)}
    return {**table, aten.nll_loss_backward.default: _nll_loss_backward,
            aten.detach.default: decomposition_table[aten.detach.default]}


def _nll_loss_backward(grad_output, self, target, weight, reduction, ignore_index,
                       total_weight):
    """nll_loss's gradient for [N, C] log-probabilities and class indices, written without
    reading `self`'s values (its shape, dtype and device only): -grad (over total_weight for a
    mean) where a row's target class is, 0 elsewhere and on rows whose target is ignore_index;
    a row whose target is out of range (eager: a device assert) is NaN, as the forward's loss
    and the op's own lowering are, never a silent zero. With class weights ([C], the input's
    dtype) the target's gradient is times weight[target], summed over the classes where the
    class is the target (a pick in the kernel, as the forward's). Other ranks and weights:
    NotImplemented (the op stays, and lowers as it is)."""
    if self.dim() != 2 or target.dim() != 1:
        return NotImplemented
    if weight is not None and (weight.dim() != 1 or weight.dtype != self.dtype):
        return NotImplemented
    g = grad_output
    if reduction == 1:                                   # mean
        g = g / total_weight
    elif reduction == 0:                                 # none: one gradient per row
        g = g.unsqueeze(1)
    classes = torch.arange(self.shape[1], device=self.device)
    kept = target != ignore_index
    match = target.unsqueeze(1) == classes
    hit = match & kept.unsqueeze(1)
    bad = (kept & ((target < 0) | (target >= self.shape[1]))).unsqueeze(1)
    grad = -g
    if weight is not None:                               # eager: weight[t] * -(g), rounded
        w_t = torch.where(match, weight, 0).sum(1, keepdim=True)
        grad = (w_t * grad.to(self.dtype)).to(self.dtype)
    return torch.where(bad, float("nan"), torch.where(hit, grad, 0.0)).to(self.dtype)


def compile_one(gm, example_inputs, kind: str, cuda_graphs: bool = False, static=(),
                mutated=(), users=None, outputs="graph"):
    """compile_graph, and for cuda_graphs a GraphedInference (inference graphs) or a
    GraphedTraining (forward, backward) around it (`static`, `mutated`, `users`: the graph's
    inputs read in place, its written inputs and a forward's user outputs: `_graph_facts`;
    `outputs`: how an inference graph hands out its outputs, the option cuda_graph_outputs)."""
    from ...runtime.gc_pause import paused
    with paused():              # a backward compiled at its first call is not under the backend's
        return _compile_one(gm, example_inputs, kind, cuda_graphs, static, mutated, users,
                            outputs)


def _compile_one(gm, example_inputs, kind, cuda_graphs, static, mutated, users, outputs):
    from .compile_graph import compile_graph
    if not cuda_graphs:
        return compile_graph(gm, example_inputs, kind)
    from .cuda_graphs import GraphedInference, graph_wide_reason, written_inputs
    from .cuda_graphs_training import GraphedTraining, attention_seed_inputs
    written = written_inputs(gm, mutated)              # before compile_graph rewrites gm
    seeds = attention_seed_inputs(gm) if kind == "backward" else ()
    why_not = graph_wide_reason(gm, static, mutated)
    if kind == "forward" and users is None:
        why_not = why_not or "AOTAutograd's metadata (which outputs are saved) is missing"
    if kind != "inference" and _distributed():
        # DDP / FSDP read gradients on their own streams, which a replay does not wait for
        why_not = why_not or ("torch.distributed is initialized: gradients handed out of "
                              "a graph's memory may be read on other streams")
    compiled = compile_graph(gm, example_inputs, kind)
    if kind == "inference":
        return GraphedInference(compiled, static, why_not, written=written, outputs=outputs)
    return GraphedTraining(compiled, static, users, why_not, written=written, seeds=seeds)


def _graph_facts(gm, kind: str, cuda_graphs: bool, outputs: str = "graph") -> dict:
    """compile_one's arguments besides the graph and its kind, read from AOTAutograd's metadata
    of the graph it is compiling (a backward's from the graph itself: the forward's metadata is
    not its own)."""
    if not cuda_graphs:
        return {}
    if kind == "inference":
        static, mutated = _static_and_mutated_inputs()
        return {"cuda_graphs": True, "static": static, "mutated": mutated, "outputs": outputs}
    from .cuda_graphs_training import backward_keyed_inputs, user_output_count
    if kind == "backward":               # the forward's metadata is not this graph's
        static, mutated, users = backward_keyed_inputs(gm), (), 0
    else:
        static, mutated = _static_and_mutated_inputs()
        users = user_output_count() if kind == "forward" else None
    return {"cuda_graphs": True, "static": static, "mutated": mutated, "users": users}


def _compiler(kind: str, cuda_graphs: bool = False, wrap=None, outputs: str = "graph"):
    """AOTAutograd's compiler for `kind` graphs; `wrap(kind, fn)`: the graph cache's wrapping
    (graph_cache.py), `fn(gm, example_inputs) -> (compiled, the arguments of compile_one besides
    the graph and its kind)`; `outputs`: the option cuda_graph_outputs."""
    def compile_fn(gm, example_inputs):
        return compile_one(gm, example_inputs, kind,
                           **_graph_facts(gm, kind, cuda_graphs, outputs))

    def with_facts(gm, example_inputs):
        facts = _graph_facts(gm, kind, cuda_graphs, outputs)
        return compile_one(gm, example_inputs, kind, **facts), facts

    compile_fn.__name__ = f"pyfuser_{kind}_compiler"
    return compile_fn if wrap is None else wrap(kind, with_facts)


def _distributed() -> bool:
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized()


def _static_and_mutated_inputs() -> tuple:
    """(indices of the static inputs: a module's parameters, buffers and tensor attributes and
    tensors marked with mark_static_address; of the inputs the graph writes) of the graph
    AOTAutograd is compiling, from its metadata (empty where it has none)."""
    ctx = torch._guards.TracingContext.try_get()
    meta = getattr(ctx, "fw_metadata", None) if ctx is not None else None
    if meta is None:
        return (), ()
    mutated = [i for i, info in enumerate(getattr(meta, "input_info", ()))
               if getattr(info, "mutates_data", False) or getattr(info, "mutates_metadata", False)]
    return tuple(getattr(meta, "static_input_indices", ()) or ()), tuple(mutated)


_OPTIONS = {"cuda_graphs": bool, "cuda_graph_outputs": str}


def _options(options, mode) -> dict:
    """The backend's options, checked (module docstring)."""
    got = dict(options or {})
    for k, v in got.items():
        if k not in _OPTIONS:
            raise TypeError(f"pyfuser backend: unknown option {k!r} (known: {sorted(_OPTIONS)})")
        if not isinstance(v, _OPTIONS[k]):
            raise TypeError(f"pyfuser backend: option {k!r} takes a {_OPTIONS[k].__name__}, "
                            f"not {type(v).__name__}")
    how = got.get("cuda_graph_outputs", "graph")
    if how not in MODES:
        raise TypeError(f"pyfuser backend: option 'cuda_graph_outputs' is one of {MODES}, "
                        f"not {how!r}")
    if mode not in (None, "default", "reduce-overhead"):
        raise TypeError(f"pyfuser backend: mode {mode!r} is not supported (\"default\" or "
                        "\"reduce-overhead\": CUDA graphs)")
    if mode == "reduce-overhead":
        got.setdefault("cuda_graphs", True)
    return got


def pyfuser_backend(gm, example_inputs, options=None, mode=None, **unknown):
    """The Dynamo backend (what `backend="pyfuser"` names)."""
    if unknown:
        raise TypeError(f"pyfuser backend: unknown arguments {sorted(unknown)}")
    opts = _options(options, mode)
    from torch._dynamo.backends.common import aot_autograd
    extra = {}
    if os.environ.get("PYFUSER_PARTITIONER", "mincut") != "default":
        extra["partition_fn"] = _recomputing_partition
    graphs = opts.get("cuda_graphs", False)
    outputs = opts.get("cuda_graph_outputs", "graph")

    def make_aot(wrap):
        return aot_autograd(fw_compiler=_compiler("forward", graphs, wrap),
                            bw_compiler=_compiler("backward", graphs, wrap),
                            inference_compiler=_compiler("inference", graphs, wrap, outputs),
                            decompositions=decompositions(), keep_inference_input_mutations=True,
                            **extra)
    from ...runtime.gc_pause import paused
    from . import graph_cache
    with paused():                             # $PYFUSER_GC_PAUSE=1: no collector passes
        if not graph_cache.enabled():          # the default: AOTAutograd as it is
            return make_aot(None)(gm, example_inputs)
        return graph_cache.compile(gm, example_inputs, make_aot, opts)


def _recomputing_partition(joint_module, joint_inputs, **kwargs):
    """AOTAutograd's min-cut partitioner: the forward saves fewer tensors for the backward and
    the backward recomputes the cheap pointwise values it needs from them (in its own fused
    kernels), as Inductor's does; never a float reduction (`_save_reductions`)."""
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    _save_reductions(joint_module.graph)
    return min_cut_rematerialization_partition(joint_module, joint_inputs, compiler="inductor",
                                               **kwargs)


def _save_reductions(graph) -> None:
    """Mark the forward's float reductions and normalizations that the backward depends on
    MUST_SAVE (banned from recomputation, as the partitioner marks collectives): their rounding
    depends on the order of the kernel's schedule, and the backward's kernel need not reduce in
    the forward's order, so a recomputed reduction need not have the forward's bits. The
    backward of amax / amin compares the saved maximum with the recomputed input exactly: a
    mean recomputed one ulp apart matched no element of a row, and the gradient was 0 / 0 = NaN
    (fx fuzz seed 916246). The partitioner's own rule bans only reductions whose output is 4x
    smaller than their input, judged at the sizes traced: a dynamic graph traced with a
    reduced axis of 3 recomputed a mean that later calls reduced over 24 elements.
    Only ancestors of the backward are marked: with no backward node, the partitioner's plain
    split would save every MUST_SAVE node."""
    from torch.utils.checkpoint import CheckpointPolicy
    from ..lowering.registry import NORMALIZATION, REDUCTION
    from .meta import meta
    from .support import op_class, tensor_metas
    backward = set()
    for node in graph.nodes:
        if (node.op == "placeholder" and "tangents" in str(node.target)) or \
                any(a in backward for a in node.all_input_nodes):
            backward.add(node)
    needed, todo = set(), [a for n in backward for a in n.all_input_nodes if a not in backward]
    while todo:
        node = todo.pop()
        if node not in needed:
            needed.add(node)
            todo += node.all_input_nodes
    for node in needed:
        metas = tensor_metas(meta(node))
        if op_class(node) in (REDUCTION, NORMALIZATION) and metas and \
                any(t.dtype.is_floating_point for t in metas) and "recompute" not in node.meta:
            node.meta["recompute"] = CheckpointPolicy.MUST_SAVE


def compile(model=None, **kwargs):  # noqa: A001 - pyfuser.compile mirrors torch.compile
    """`torch.compile(model, backend=pyfuser_backend, **kwargs)` (dynamic=, fullgraph=, mode
    ... as torch.compile takes them; `cuda_graphs=True` is `options={"cuda_graphs": True}`,
    `cuda_graph_outputs="copy"` is that option). Usable as a decorator, with or without
    arguments."""
    if "backend" in kwargs:
        raise TypeError("pyfuser.compile: the backend is pyfuser's; do not pass backend=")
    if model is None:
        return functools.partial(compile, **kwargs)
    for name in ("cuda_graphs", "cuda_graph_outputs"):   # pyfuser.compile(m, cuda_graphs=True)
        if name in kwargs:
            kwargs["options"] = {**(kwargs.get("options") or {}), name: kwargs.pop(name)}
    return torch.compile(model, backend=pyfuser_backend, **kwargs)
