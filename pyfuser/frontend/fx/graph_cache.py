"""AOTAutograd's output on disk: a new process that compiles a Dynamo graph the backend has
compiled before skips AOTAutograd's tracing and partitioning (what Inductor's AOTAutogradCache
does for Inductor, which serves Inductor only).

`compile(gm, example_inputs, aot, opts)` is what the backend calls for each Dynamo graph:
1. `key_for` hashes everything AOTAutograd's result depends on, or gives up (None, with the
   reason; the graph is then compiled as before, nothing read or written):
   - the Dynamo graph, node by node: op, target, arguments (other nodes, constants of known
     types: numbers, strings, dtypes, devices, memory formats, slices, Ellipsis), node names
     (placeholder names are Dynamo's sources), node metadata other than Dynamo's bookkeeping
     (example values, stacks, sources) when it is plain data, nested GraphModules (the
     subgraphs of higher-order ops) the same way. Call targets: torch functions (not closures),
     aten / prims ops, higher-order ops, operator / math / builtins, tensor methods;
   - each input: Python numbers by value; tensors by type, dtype, device, layout, sizes,
     strides, storage offset, requires_grad, leafness, view-ness, which other inputs share its
     storage, conjugate / negative bits, Dynamo's source and static-address mark;
   - the state AOTAutograd traces under: grad mode, inference mode, autocast per device
     (enabled, dtype, cache), the default dtype and device, deterministic algorithms, the
     attention / cuDNN / matmul backend flags (which attention kernel the graph records),
     functorch's config, Inductor's config (the partitioner reads some of it); torch's
     version and git commit;
   - pyfuser's environment (runtime/plan_store.environment: pyfuser's source hash, Python,
     torch, the executor mode and target, the `PYFUSER_*` variables), the backend's options and
     which functions its decompositions are;
   No key (the graph is compiled as before): a user function kept in the graph
   (allow_in_graph), a custom op (its Python code is not in the key), a submodule call, an
   argument or metadata of another type, a graph module holding tensors (constants: its
   parameters and buffers, which AOTAutograd's wrapper passes first at each call and the
   rebuilt function does not), a symbolic size, stride or offset (dynamic shapes: AOTAutograd
   adds shape guards while it traces, which a hit could not give back to Dynamo), a SymInt /
   SymFloat input, a tensor subclass, an input of another type;
2. On a hit the entry is unpickled and torch's own reconstruction of a cached AOTAutograd result
   (`deserialize_bundled_cache_entry`: the runtime wrappers for input mutations, aliased
   outputs, saved tensors, the autograd.Function) is run on it; the forward / backward /
   inference graphs in it are AOTAutograd's aten graphs as they were handed to the compilers
   (with their example values, `val`, the only node metadata compile_graph reads), which
   `compile_graph` compiles again (its regions come from the plan cache, plan_cache.py: the
   warm path of before minus the tracing).
3. On a miss AOTAutograd runs as before, but the compilers' results are `GraphOutputCode`s
   (torch's bundled-cache protocol: the graph kept for storing), the backward is compiled with
   the forward (not at the first backward), and torch's AOTAutogradCache is pointed away from
   its own disk (a key of its own that never hits, its save captured): the entry torch builds
   is pickled into pyfuser's disk cache (runtime/disk_cache.py: atomic writes, checksums;
   `<key>.graph` files beside the CUBINs and region plans).
   Not stored: a compile during which AOTAutograd added guards of its own (duplicate or
   overlapping inputs), a graph the channels-last pass changed, a graph whose example inputs
   are not its placeholders' values (a restrided backward), anything that does not pickle.

A hit never gives another result than a compile: the key holds all the inputs of the compile
(or there is no key); a damaged or foreign file fails the disk cache's checksum; an entry that
does not unpickle or rebuild is deleted and the graph compiled as before, without storing
(logged at INFO); a compile through the cache that raises (a torch whose bundled entries want
Inductor's output, say) is done again without it. Where this torch lacks a piece the cache
uses (`_torch_parts`), every graph is compiled as before.
`PYFUSER_DISABLE_GRAPH_CACHE=1` switches this cache off (also off with the plan cache:
`PYFUSER_DISABLE_PLAN_CACHE`, `PYFUSER_DISABLE_DISK_CACHE`, `PYFUSER_DUMP`). `stats` counts
hits, misses, stores, bypasses (no key) and refused entries.
"""
from __future__ import annotations

import builtins
import contextlib
import hashlib
import logging
import math
import operator
import os
import pickle
import random
import types

import torch

from ...runtime import disk_cache, plan_store

log = logging.getLogger("pyfuser")
NAME = "fx-graph"
FORMAT = 1
stats = {"hits": 0, "misses": 0, "stores": 0, "bypass": 0, "refused": 0}
disk_stats: dict = {}       # the disk cache's own counts for these entries (corrupt, foreign...)
last_bypass = [""]          # the last reason a graph had no key (tests read it)

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


def enabled() -> bool:
    off = os.environ.get("PYFUSER_DISABLE_GRAPH_CACHE", "").strip().lower() in (
        "1", "true", "yes", "on")
    forced = getattr(getattr(torch.compiler, "config", None), "force_disable_caches", False)
    return not off and not forced and plan_store.enabled()


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
    if isinstance(t, _FUNCTIONS) and module.split(".")[0] == "torch" and qual and \
            "<locals>" not in qual and "<lambda>" not in qual:
        return f"{module}.{qual}"      # torch's own: the version in the key pins its code
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
    nodes = {}
    for i, n in enumerate(gm.graph.nodes):
        nodes[n] = i
        if n.op == "get_attr":
            v = _attr(gm, n.target)
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


def _state() -> tuple:
    autocast = []
    for dev in ("cpu", "cuda", "xpu", "mps", "hpu", "xla"):
        try:
            autocast.append((dev, torch.is_autocast_enabled(dev),
                             str(torch.get_autocast_dtype(dev))))
        except Exception:  # noqa: BLE001 - a device type this torch does not know
            pass
    return (torch.is_grad_enabled(), torch.is_inference_mode_enabled(), tuple(autocast),
            str(torch.get_default_dtype()), str(_default_device()), _backend_flags(),
            torch.is_autocast_cache_enabled(), torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            hashlib.sha256(torch._functorch.config.save_config()).hexdigest(),
            _inductor_config(), torch.__version__, getattr(torch.version, "git_version", ""))


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


def _inductor_config() -> str:
    from torch._inductor import config as ic
    cfg = ic.save_config_portable() if hasattr(ic, "save_config_portable") else {}
    return hashlib.sha256(repr(sorted((k, repr(v)) for k, v in cfg.items())).encode()).hexdigest()


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


def key_for(gm, example_inputs, opts: dict, extra=()) -> tuple:
    """(key, '') or (None, why there is none)."""
    try:
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
                tuple(sorted(opts.items())), tuple(extra))
        key = hashlib.sha256(pickle.dumps((desc, env), protocol=4)).hexdigest()
        return key, ""
    except _NoKey as e:
        return None, str(e)
    except Exception as e:  # noqa: BLE001 - anything unexpected: no key, compile as before
        return None, f"{type(e).__name__}: {e}"


# ---- the compilers' results ----------------------------------------------------------------------
try:                                          # torch's bundled-cache protocol
    from torch._inductor.output_code import OutputCode
except ImportError:  # pragma: no cover - a torch without it: the cache is off (_torch_parts)
    OutputCode = object


class GraphOutputCode(OutputCode):
    """A compiled graph in torch's bundled-cache protocol: the aten graph AOTAutograd gave the
    compiler (pickled with its example values, before compile_graph rewrote it) and what the
    compiler needs besides; compiled again after loading (`post_compile`)."""

    def __init__(self, kind, compiled, data, extra):
        self.kind = kind
        self.compiled = compiled
        self.data = data
        self.extra = extra
        self._boxed_call = True

    def __call__(self, args):
        return self.compiled(args)

    def prepare_for_serialization(self) -> None:
        self.compiled = None

    def __getstate__(self):
        state = dict(self.__dict__)
        state["compiled"] = None
        return state

    def post_compile(self, *args, **kwargs) -> None:
        if self.compiled is None:
            if self.data is None:
                raise ValueError(f"the {self.kind} graph was not stored")
            compiled = _recompile(self.kind, self.data, self.extra)
            if _layout(compiled) is not None:
                raise ValueError(f"the channels-last pass changed the {self.kind} graph")
            if self.kind == "backward":          # as AOTAutograd's wrapping of bw_compiler
                compiled = _disable(compiled, "do not trace generated backwards pass")
            self.compiled = compiled

    def set_triton_bundle(self, triton_bundle) -> None:
        pass


_KEPT_META = frozenset({"val"})    # what compile_graph reads of a node's metadata (meta.py)


def _examples_differ(gm, example) -> bool:
    """Whether AOTAutograd handed the compiler example inputs other than the placeholders'
    example values (a backward whose saved tensors' strides the forward reported): a rebuilt
    graph is compiled from the placeholders' values."""
    places = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(places) != len(example):
        return True
    for n, x in zip(places, example):
        v = n.meta.get("val")
        if isinstance(x, torch.Tensor) != isinstance(v, torch.Tensor):
            return True
        if isinstance(x, torch.Tensor) and (
                x.dtype != v.dtype or tuple(x.shape) != tuple(v.shape) or
                tuple(x.stride()) != tuple(v.stride()) or
                x.storage_offset() != v.storage_offset()):
            return True
    return False


def _layout(compiled):
    """The channels-last pass' report of a compiled graph (a GraphedInference's inner one)."""
    inner = getattr(compiled, "compiled", compiled)
    return getattr(inner, "layout", getattr(compiled, "layout", None))


def dump_graph(gm) -> bytes:
    """The graph with its nodes' example values (FakeTensors, SymInts), and no other metadata
    (stacks, provenance: nothing pyfuser reads; unpickling them cost more than the values)."""
    from torch.fx._graph_pickler import GraphPickler, Options
    try:
        opts = Options(ops_filter=None, node_metadata_key_filter=_KEPT_META.__contains__)
    except TypeError:  # pragma: no cover - a torch whose Options has no such filter
        opts = Options(ops_filter=None)
    return GraphPickler.dumps(gm, opts)


def _recompile(kind, data, extra):
    from torch._subclasses import FakeTensorMode
    from torch.fx._graph_pickler import GraphPickler
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from .backend import compile_one
    # the example values in the fake mode of the compile (Dynamo's, as AOTAutograd's graphs
    # have it): passes that make values in the tracing context's mode can mix them
    ctx = torch._guards.TracingContext.try_get()
    fake_mode = getattr(ctx, "fake_mode", None) or FakeTensorMode(shape_env=ShapeEnv())
    gm = GraphPickler.loads(data, fake_mode)
    example = [n.meta.get("val") for n in gm.graph.nodes if n.op == "placeholder"]
    with fake_mode:
        return compile_one(gm, example, kind, **extra)


# ---- compiling through the cache -----------------------------------------------------------------
def _torch_parts():
    """torch's pieces this cache uses (ImportError / AttributeError where this torch lacks
    one: the cache is then off)."""
    if OutputCode is object:
        raise ImportError("torch._inductor.output_code.OutputCode")
    from torch._functorch._aot_autograd import autograd_cache as ac
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    from torch.fx._graph_pickler import GraphPickler
    GraphPickler.loads                                 # noqa: B018 - present
    try:
        from torch._functorch._aot_autograd.aot_autograd_result import \
            deserialize_bundled_cache_entry
    except ImportError:
        from torch._functorch._aot_autograd.autograd_cache import \
            deserialize_bundled_cache_entry
    cfg = torch._functorch.config
    for name in ("bundled_autograd_cache", "force_non_lazy_backward_lowering",
                 "enable_autograd_cache"):
        getattr(cfg, name)
    ac.AOTAutogradCache.save, ac.AOTAutogradCache._lookup, ac.autograd_cache_key  # noqa: B018
    return ac, SerializableAOTDispatchCompiler, deserialize_bundled_cache_entry


def compile(gm, example_inputs, make_aot, opts: dict):  # noqa: A001
    """The backend's compile of one Dynamo graph through the cache (module docstring).
    `make_aot(wrap)` builds the AotAutograd callable, its compilers passed through `wrap`."""
    if not enabled():
        return make_aot(None)(gm, example_inputs)
    try:
        parts = _torch_parts()
    except (ImportError, AttributeError) as e:
        last_bypass[0] = f"this torch lacks {e}"
        stats["bypass"] += 1
        return make_aot(None)(gm, example_inputs)
    key, why = key_for(gm, example_inputs, opts, _decomposition_ids())
    if key is None:
        last_bypass[0] = why
        stats["bypass"] += 1
        log.debug("pyfuser graph cache: no key (%s); compiled without the cache", why)
        return make_aot(None)(gm, example_inputs)
    fn, refused = _load(key, parts)
    if fn is not None:
        return fn
    if refused:                        # compiled without storing: a torch whose rebuild of this
        return make_aot(None)(gm, example_inputs)          # entry failed would fail again
    try:
        return _compile_and_store(gm, example_inputs, make_aot, key, parts)
    except Exception as e:  # noqa: BLE001 - see below
        if type(e).__name__.endswith("RestartAnalysis"):
            raise                      # Dynamo's own control flow, not a failure
        # the cache's way through AOTAutograd failed (a torch whose cache entries want
        # Inductor's output, say): compile as without the cache (a real error raises again)
        log.info("pyfuser graph cache: compiling through the cache failed (%s: %s); compiled "
                 "without it", type(e).__name__, e)
        stats["bypass"] += 1
        last_bypass[0] = f"{type(e).__name__}: {e}"
        return make_aot(None)(gm, example_inputs)


def _load(key, parts) -> tuple:
    """(the rebuilt compiled function or None, whether an entry was there and refused)."""
    data = disk_cache.load(key, NAME, disk_cache.GRAPH_SUFFIX, disk_stats)
    if data is None:
        stats["misses"] += 1
        return None, False
    _, _, deserialize = parts
    from . import compile_graph as CG
    n_compiled = len(CG._COMPILED)
    try:
        with _no_modes():
            entry = pickle.loads(data)
        if not isinstance(entry, tuple) or len(entry) != 2 or entry[0] != FORMAT:
            raise ValueError("another format")
        fn = deserialize(entry[1])
    except Exception as e:  # noqa: BLE001 - a bad entry: compile as if it were absent
        stats["refused"] += 1
        log.info("pyfuser graph cache: entry %s refused (%s: %s); compiled again", key,
                 type(e).__name__, e)
        _remove(key)
        del CG._COMPILED[n_compiled:]           # what the failed rebuild compiled is not used
        return None, True
    stats["hits"] += 1
    return _disable(fn, "do not trace AOT-compiled graph"), False


def _disable(fn, reason: str):
    try:
        return torch._dynamo.disable(fn, reason=reason)
    except TypeError:  # pragma: no cover - a torch without disable's reason
        return torch._dynamo.disable(fn)


def _no_modes():
    try:
        from torch.utils._python_dispatch import _disable_current_modes
        return _disable_current_modes()
    except ImportError:  # pragma: no cover
        return contextlib.nullcontext()


def _compile_and_store(gm, example_inputs, make_aot, key, parts):
    ac, Serializable, _ = parts
    Out = GraphOutputCode
    captured: list = []
    unsafe: list = []

    def wrap(kind, compile_fn):
        def fn(g, example):
            try:
                data = dump_graph(g)
            except Exception as e:  # noqa: BLE001 - not picklable: compile, store nothing
                unsafe.append(f"the {kind} graph does not pickle: {type(e).__name__}: {e}")
                data = None
            if _examples_differ(g, example):    # the rebuilt graph's examples would be its own
                unsafe.append(f"the {kind} graph's example inputs are strided otherwise than its "
                              "placeholders")
            compiled, extra = compile_fn(g, example)
            if data is not None and _layout(compiled) is not None:
                unsafe.append(f"the channels-last pass changed the {kind} graph")
            return Out(kind, compiled, data, extra)
        return Serializable(Out, fn)

    def save(_key, entry, remote=False):
        captured.append(entry)

    def nonce_key(*args, **kwargs):
        return "pyfuser-" + "%032x" % random.getrandbits(128), []

    ctx = torch._guards.TracingContext.try_get()
    guards = getattr(getattr(ctx, "guards_context", None), "aotautograd_guards", None)
    n_guards = len(guards) if guards is not None else 0
    cfg = torch._functorch.config
    with cfg.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True,
                   enable_autograd_cache=True), \
            _patched(ac.AOTAutogradCache, "save", staticmethod(save)), \
            _patched(ac.AOTAutogradCache, "_lookup", staticmethod(lambda *a, **k: None)), \
            _patched(ac, "autograd_cache_key", nonce_key):
        fn = make_aot(wrap)(gm, example_inputs)
    if guards is not None and len(guards) != n_guards:
        unsafe.append("AOTAutograd added guards (duplicate or overlapping inputs)")
    if guards is None:
        unsafe.append("no tracing context to check AOTAutograd's guards in")
    if len(captured) != 1:
        unsafe.append(f"{len(captured)} entries made")
    if unsafe:
        log.debug("pyfuser graph cache: not stored: %s", "; ".join(unsafe))
        return fn
    try:
        entry = captured[0]
        entry.pre_save()
        with _no_modes():
            data = pickle.dumps((FORMAT, entry))
    except Exception as e:  # noqa: BLE001 - not storable: the next process compiles again
        log.debug("pyfuser graph cache: not stored: %s: %s", type(e).__name__, e)
        return fn
    if disk_cache.store(key, data, NAME, disk_cache.GRAPH_SUFFIX, disk_stats):
        stats["stores"] += 1
    return fn


def _remove(key: str) -> None:
    try:
        os.remove(disk_cache.entry_path(key, disk_cache.GRAPH_SUFFIX))
    except OSError:
        pass


@contextlib.contextmanager
def _patched(owner, name, value):
    old = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
    setattr(owner, name, value)
    try:
        yield
    finally:
        setattr(owner, name, old)
