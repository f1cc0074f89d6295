"""The graph cache's key (graph_cache.py): a sha256 over everything AOTAutograd's result for a
Dynamo graph depends on, or no key (None and the reason) where that cannot be told safely.

Invariant: two compiles with equal keys hand AOTAutograd equal inputs in equal states, so its
result (the aten graphs and the runtime wrappers' metadata) is the same; anything this module
cannot describe exactly is no key (the graph is compiled without the cache), never left out.

`key_for(gm, example_inputs, opts)` hashes:
- the Dynamo graph, node by node: op, target, arguments (other nodes, constants of known types:
  numbers, strings, dtypes, devices, memory formats, slices, Ellipsis), node names (placeholder
  names are Dynamo's sources), node metadata other than Dynamo's bookkeeping (example values,
  stacks, sources) when it is plain data; each GraphModule's own metadata but Dynamo's
  bookkeeping (parameter names, compile id, backend id); nested GraphModules (the subgraphs of
  higher-order ops) the same way, and child GraphModules no node names (the saved-tensors hooks
  AOTAutograd inlines) by name. Call targets: torch functions (not closures), aten / prims
  ops, higher-order ops, operator / math / builtins, tensor methods;
- each input: Python numbers by value; tensors by type, dtype, device, layout, sizes, strides,
  storage offset, requires_grad, leafness, view-ness, which other inputs share its storage,
  conjugate / negative bits, inference-ness, Dynamo's source and static-address mark;
- the state AOTAutograd traces under: grad mode, inference mode, autocast per device (enabled,
  dtype, cache), the default dtype and device, deterministic algorithms, the attention / cuDNN
  / matmul backend flags (which attention kernel the graph records); torch's configs:
  functorch's (whole), Inductor's, Dynamo's, torch.compiler's (its cache_key_tag) and the
  symbolic-shapes one (their portable settings, sets sorted); torch's version and git commit;
- pyfuser's environment (runtime/plan_store.environment: pyfuser's source hash, Python, torch,
  the executor mode and target, the `PYFUSER_*` variables: the partitioner and channels-last
  choices among them), the backend's options (the CUDA-graph mode) and which functions its
  decompositions are (module and name: a table entry replaced at run time is another key).
No key: a user function kept in the graph (allow_in_graph), a custom op (its Python code is not
in the key), a submodule call or a child module that is not a graph, an argument or metadata of
another type (a selective-checkpointing policy: Python code on a subgraph's metadata), a graph
module holding tensors (constants: its parameters and buffers, which AOTAutograd's wrapper
passes first at each call and the rebuilt function does not), a symbolic size, stride or offset
of an input (dynamic shapes: AOTAutograd adds shape guards while it traces, which a hit could
not give back to Dynamo) or of a value inside the graph (an unbacked size: its ShapeEnv's facts
are not in the key), a SymInt / SymFloat input, a tensor subclass, an input of another type;
a dispatch mode or a functorch transform around the compile, a tracing context that fakifies
its first call (DDP's optimizer), functorch settings that are code (`joint_custom_pass`, a
callable memory-budget estimator or solver: save_config leaves them out).
"""
from __future__ import annotations

import builtins
import hashlib
import math
import operator
import os
import pickle
import sys
import types

import torch

from ...runtime import plan_store

FORMAT = 1

_BENIGN_META = frozenset({
    "example_value", "val", "grapharg", "tensor_dict", "nn_module_stack", "source_fn_stack",
    "stack_trace", "creation_timestamp", "fwd_nn_module_stack", "fwd_source_fn_stack",
    "from_node", "seq_nr", "tensor_meta", "is_wrapped", "source_fn", "original_aten",
    "_dynamo_source", "torch_fn"})
_PLAIN = (int, float, bool, str, complex, type(None), torch.dtype, torch.device,
          torch.memory_format, torch.layout)
_OP_NAMESPACES = frozenset({"aten", "prims"})
_FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.MethodDescriptorType,
              types.WrapperDescriptorType, types.ClassMethodDescriptorType, type)
# a GraphModule's own metadata that says nothing about what it computes (Dynamo's bookkeeping:
# parameter names, the compile's id, the backend call's name, a fresh one per compile)
_BENIGN_MODULE_META = frozenset({"dynamo_flat_name_to_original_fqn", "dynamo_compile_id",
                                 "backend_id"})
# functorch settings save_config leaves out (callables): set to one, AOTAutograd's result
# depends on code the key cannot see
_FUNCTORCH_CALLABLES = ("joint_custom_pass", "activation_memory_budget_runtime_estimator",
                        "activation_memory_budget_solver")


class _NoKey(Exception):
    pass


# ---- the key -------------------------------------------------------------------------------------
def _plain(v, nodes: dict):
    """A stable description of an FX argument, or _NoKey."""
    if isinstance(v, torch.fx.Node):
        return ("%", nodes[v])
    if isinstance(v, float):
        return ("f", v.hex()) if math.isfinite(v) else ("f", repr(v))
    if isinstance(v, _PLAIN):
        return (type(v).__name__, repr(v))
    if isinstance(v, (tuple, list)):
        return (type(v).__name__,) + tuple(_plain(x, nodes) for x in v)
    if isinstance(v, dict):
        return ("dict",) + tuple((_plain(k, nodes), _plain(x, nodes)) for k, x in v.items())
    if isinstance(v, slice):
        return ("slice", _plain(v.start, nodes), _plain(v.stop, nodes), _plain(v.step, nodes))
    if v is Ellipsis:
        return ("...",)
    if isinstance(v, torch.Size):
        return ("size",) + tuple(v)
    raise _NoKey(f"an argument of type {type(v).__name__}")


def _target(node) -> str:
    t = node.target
    if node.op in ("placeholder", "output", "call_method"):
        if not isinstance(t, str):
            raise _NoKey(f"a {node.op} target {t!r}")
        return t
    if node.op != "call_function":
        raise _NoKey(f"a {node.op} node")
    if isinstance(t, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        if t.namespace not in _OP_NAMESPACES:      # a custom op: user code traced or run
            raise _NoKey(f"a call of the custom op {t}")
        return "op:" + str(t)
    if isinstance(t, torch._ops.HigherOrderOperator):
        return "hop:" + t.name()
    module = getattr(t, "__module__", None) or ""
    name = getattr(t, "__name__", None) or ""
    qual = getattr(t, "__qualname__", None) or ""
    if isinstance(t, _FUNCTIONS) and module.split(".")[0] == "torch":
        if qual and "<locals>" not in qual and "<lambda>" not in qual:
            return f"{module}.{qual}"  # torch's own: the version in the key pins its code
        owner = sys.modules.get(module)
        if name and owner is not None and getattr(owner, name, None) is t:
            return f"{module}.{name}"  # made by a factory, bound to its module's name (F.max_pool2d)
    for m in (builtins, operator, math):
        if name and getattr(m, name, None) is t:
            return f"{m.__name__}.{name}"
    raise _NoKey(f"a call of {module}.{qual}")   # a user function kept in the graph


def _graph_desc(gm, out: list, depth: int = 0) -> None:
    if depth > 8:
        raise _NoKey("nested graphs too deep")
    if type(gm).forward is not torch.fx.GraphModule.forward and \
            not isinstance(gm, torch.fx.GraphModule):
        raise _NoKey("not a GraphModule")
    out.append(("module-meta",) + _module_meta(gm))
    nodes, reached = {}, set()
    for i, n in enumerate(gm.graph.nodes):
        nodes[n] = i
        _no_symbols(n.meta.get("example_value", n.meta.get("val")))
        if n.op == "get_attr":
            v = _attr(gm, n.target)
            reached.add(n.target.split(".")[0])
            if isinstance(v, torch.fx.GraphModule):
                sub: list = []
                _graph_desc(v, sub, depth + 1)
                desc = ("get_attr", n.target, "graph", tuple(sub))
            elif type(v) in (torch.Tensor, torch.nn.Parameter) and v.layout == torch.strided \
                    and v.device.type != "meta":
                desc = ("get_attr", n.target, "tensor", _tensor_value(v))
            else:
                raise _NoKey(f"a get_attr of a {type(v).__name__}")
        else:
            desc = (n.op, _target(n), _plain(n.args, nodes), _plain(n.kwargs, nodes))
        meta = []
        for k in sorted(n.meta):
            if k not in _BENIGN_META:
                meta.append((k, _plain(n.meta[k], nodes)))
        out.append((n.name,) + desc + (tuple(meta),))
    for name, child in sorted(gm.named_children()):
        if name in reached:
            continue
        if not isinstance(child, torch.fx.GraphModule):
            raise _NoKey(f"a submodule {name} of type {type(child).__name__}")
        sub = []                     # a graph no node names (saved-tensors hooks AOTAutograd
        _graph_desc(child, sub, depth + 1)           # inlines): keyed by its name
        out.append(("child", name, tuple(sub)))


def _module_meta(gm) -> tuple:
    """A GraphModule's own metadata but Dynamo's bookkeeping, or _NoKey (a selective
    checkpointing policy, `_checkpoint_context_fn`, is a Python function)."""
    meta = getattr(gm, "meta", None) or {}
    out = []
    for k in sorted(meta):
        if k not in _BENIGN_MODULE_META:
            try:
                out.append((k, _plain(meta[k], {})))
            except _NoKey:
                raise _NoKey(f"graph metadata {k} of type {type(meta[k]).__name__}") from None
    return tuple(out)


def _no_symbols(v) -> None:
    """_NoKey where an example value holds a symbol (an unbacked size of a data-dependent op in
    a graph whose inputs are static: its ShapeEnv's facts are not in the key)."""
    if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _NoKey("a symbolic value inside the graph")
    if isinstance(v, torch.Tensor):
        if not all(type(d) is int for d in (*v.shape, *v.stride(), v.storage_offset())):
            raise _NoKey("a symbolic size, stride or offset inside the graph")
    elif isinstance(v, (tuple, list)):
        for x in v:
            _no_symbols(x)
    elif isinstance(v, dict):
        for x in v.values():
            _no_symbols(x)


def _attr(gm, target: str):
    v = gm
    for part in target.split("."):
        v = getattr(v, part)
    return v


def _tensor_value(t) -> tuple:
    t = t.detach()
    data = t.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() \
        if t.numel() else b""
    return (str(t.dtype), str(t.device), tuple(t.shape), tuple(t.stride()), t.storage_offset(),
            t.requires_grad, hashlib.sha256(data).hexdigest())


def _static_ints(xs) -> tuple:
    out = []
    for v in xs:
        if not isinstance(v, int) or isinstance(v, bool):
            raise _NoKey("a symbolic size, stride or offset (dynamic shapes)")
        out.append(v)
    return tuple(out)


def _input_desc(x, ev, storages: dict):
    if isinstance(x, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        raise _NoKey("a symbolic scalar input")
    if isinstance(x, (bool, int, float)) or x is None:
        return _plain(x, {})
    if not isinstance(x, torch.Tensor):
        raise _NoKey(f"an input of type {type(x).__name__}")
    from torch._subclasses.fake_tensor import FakeTensor
    if type(x) not in (torch.Tensor, torch.nn.Parameter, FakeTensor) or x.layout != torch.strided:
        raise _NoKey(f"a {type(x).__name__} input ({x.layout})")
    descs = []
    for t in (x, ev) if isinstance(ev, torch.Tensor) else (x,):
        descs.append((str(t.dtype), str(t.device), _static_ints(t.shape),
                       _static_ints(t.stride()), _static_ints([t.storage_offset()]),
                       t.requires_grad))
    from torch.multiprocessing.reductions import StorageWeakRef
    ref = StorageWeakRef(x.untyped_storage())
    sid = storages.setdefault(ref, len(storages))
    return ("T", type(x).__name__, tuple(descs), x.is_leaf, x._is_view(), sid,
            x.is_inference(), x.is_conj(), x.is_neg(),
            getattr(x, "_dynamo_static_input_type", None))


def _context() -> None:
    """_NoKey where what surrounds this compile is not in the key: a dispatch mode or a
    functorch transform around it (they change what AOTAutograd traces), a tracing context
    whose first call is fakeified (DDP's optimizer: its inputs are not the graph's values), a
    functorch setting that is code."""
    if torch._C._len_torch_dispatch_stack():
        raise _NoKey("a dispatch mode is active")
    peek = getattr(torch._C._functorch, "peek_interpreter_stack", None)
    if peek is not None and peek() is not None:
        raise _NoKey("a functorch transform is active")
    import torch._functorch.config as functorch_config
    from torch._guards import TracingContext
    ctx = TracingContext.try_get()
    if getattr(ctx, "fakify_first_call", False):
        raise _NoKey("the tracing context fakifies the first call")
    cfg = functorch_config
    for name in _FUNCTORCH_CALLABLES:
        v = getattr(cfg, name, None)
        if v is not None and not isinstance(v, str):
            raise _NoKey(f"functorch's {name} is set to code ({type(v).__name__})")


def _config_hash(cfg) -> str:
    """sha256 of a torch config module's portable settings (sets sorted: their order differs
    between processes)."""
    save = getattr(cfg, "save_config_portable", None)
    items = save() if save is not None else {}

    def stable(v):
        if isinstance(v, (set, frozenset)):
            return repr(sorted(repr(x) for x in v))
        return repr(v)
    return hashlib.sha256(repr(sorted((k, stable(v)) for k, v in items.items())).encode()) \
        .hexdigest()


def _configs() -> tuple:
    """torch's configs AOTAutograd and the compile read: functorch's (whole, as torch's own
    cache keys it), Inductor's (the partitioner reads some), Dynamo's, torch.compiler's (its
    cache_key_tag among them) and the symbolic-shapes one."""
    import torch._dynamo.config as dynamo_config
    import torch._functorch.config as functorch_config
    import torch.fx.experimental._config as fx_config
    from torch._inductor import config as inductor_config
    return (hashlib.sha256(functorch_config.save_config()).hexdigest(),
            _config_hash(inductor_config), _config_hash(dynamo_config),
            _config_hash(getattr(torch.compiler, "config", None)), _config_hash(fx_config))


def _state() -> tuple:
    autocast = []
    devices = getattr(torch._C, "_autocast_supported_devices", None)
    for dev in devices() if devices is not None else ("cpu", "cuda", "xpu", "mps", "hpu"):
        try:
            autocast.append((dev, torch.is_autocast_enabled(dev),
                             str(torch.get_autocast_dtype(dev))))
        except Exception:  # noqa: BLE001 - a device type this torch does not know
            pass
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), tuple(autocast),
            str(torch.get_default_dtype()), str(_default_device()), _backend_flags(),
            torch.is_autocast_cache_enabled(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(), _configs(),
            torch.__version__, getattr(torch.version, "git_version", ""))


def _default_device():
    get = getattr(torch, "get_default_device", None)
    return get() if get is not None else None


def _backend_flags() -> tuple:
    """The backend switches an aten graph's ops are chosen by while tracing (attention kernels:
    AOTAutograd records the one the flags pick) or that change what the kernels compute."""
    out = []
    b = torch.backends
    for name, fn in (("flash", "flash_sdp_enabled"), ("mem", "mem_efficient_sdp_enabled"),
                     ("math", "math_sdp_enabled"), ("cudnn_sdp", "cudnn_sdp_enabled")):
        f = getattr(b.cuda, fn, None)
        out.append((name, f() if f is not None else None))
    out.append(("cudnn", b.cudnn.enabled, b.cudnn.deterministic, b.cudnn.benchmark,
                b.cudnn.allow_tf32))
    out.append(("matmul", b.cuda.matmul.allow_tf32,
                getattr(b.cuda.matmul, "allow_fp16_reduced_precision_reduction", None),
                getattr(b.cuda.matmul, "allow_bf16_reduced_precision_reduction", None),
                torch.get_float32_matmul_precision()))
    out.append(("mkldnn", getattr(b.mkldnn, "enabled", None)))
    return tuple(repr(x) for x in out)


def _source_name(node) -> str:
    """Dynamo's source of a placeholder (which input it is: a parameter, a buffer, an argument),
    as text."""
    ga = node.meta.get("grapharg")
    src = getattr(ga, "source", None)
    if src is None:
        return ""
    name = getattr(src, "name", "")
    name = name() if callable(name) else name
    return f"{type(src).__name__}:{name}"


def _target_env(example_inputs) -> tuple:
    for x in example_inputs:
        if isinstance(x, torch.Tensor) and x.device.type == "cuda":
            return "cuda", x.device
    return os.environ.get("PYFUSER_CPU_EXECUTOR") or "interpret", None


def _decomposition_ids() -> tuple:
    """Which functions the backend's decompositions are (a table entry replaced at run time by
    other code is another key; pyfuser's own are pinned by its source hash)."""
    from .backend import decompositions
    return tuple(sorted((str(op), getattr(fn, "__module__", ""), getattr(fn, "__qualname__", ""))
                        for op, fn in decompositions().items()))


def key_for(gm, example_inputs, opts: dict) -> tuple:
    """(key, '') or (None, why there is none)."""
    try:
        _context()
        if list(gm.parameters()) or list(gm.buffers()):
            raise _NoKey("the graph module holds parameters or buffers")
        graph: list = []
        _graph_desc(gm, graph)
        places = [n for n in gm.graph.nodes if n.op == "placeholder"]
        if len(places) != len(example_inputs):
            raise _NoKey("inputs and placeholders differ in number")
        storages: dict = {}
        inputs = tuple((_source_name(n), _input_desc(x, n.meta.get("example_value"), storages))
                       for x, n in zip(example_inputs, places))
        mode, device = _target_env(example_inputs)
        env = plan_store.environment(mode, device)
        desc = ("pyfuser-fx-graph", FORMAT, tuple(graph), inputs, _state(),
                tuple(sorted(opts.items())), _decomposition_ids())
        key = hashlib.sha256(pickle.dumps((desc, env), protocol=4)).hexdigest()
        return key, ""
    except _NoKey as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - anything unexpected: no key, compile as before
        return None, f"{type(e).__name__}: {e}"

