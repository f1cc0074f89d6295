"""AOTAutograd's output on disk: a new process that compiles a Dynamo graph the backend has
compiled before skips AOTAutograd's tracing and partitioning (what Inductor's AOTAutogradCache
does for Inductor, which serves Inductor only).

`compile(gm, example_inputs, aot, opts)` is what the backend calls for each Dynamo graph:
1. `key_for` (graph_cache_key.py, whose docstring lists what it holds) hashes everything
   AOTAutograd's result depends on, or gives up (None, with the reason; the graph is then
   compiled as before, nothing read or written: dynamic shapes, custom ops, user functions in
   the graph, graphs holding tensors...);
2. On a hit the entry is unpickled and torch's own reconstruction of a cached AOTAutograd result
   (`deserialize_bundled_cache_entry`: the runtime wrappers for input mutations, aliased
   outputs, saved tensors, the autograd.Function) is run on it; the forward / backward /
   inference graphs in it are AOTAutograd's aten graphs as they were handed to the compilers
   (with their example values, `val`, the only node metadata compile_graph reads), which
   `compile_graph` compiles again (its regions come from the plan cache, plan_cache.py: the
   warm path of before minus the tracing).
3. On a miss AOTAutograd runs as before, but the compilers' results are `GraphOutputCode`s
   (graph_cache_entry.py; torch's bundled-cache protocol: the graph kept for storing), the
   backward is compiled with the forward (not at the first backward), and torch's
   AOTAutogradCache is pointed away from its own disk (a key of its own that never hits, its
   save captured): the entry torch builds is pickled into pyfuser's disk cache
   (runtime/disk_cache.py: atomic writes, checksums; `<key>.graph` files beside the CUBINs and
   region plans).
   Not stored: a compile during which AOTAutograd added guards of its own (duplicate or
   overlapping inputs), a graph the channels-last pass changed, a graph whose example inputs
   are not its placeholders' values (a restrided backward), anything that does not pickle.

On by default; `PYFUSER_GRAPH_CACHE=0` (or false / no / off) switches it off, and so do the
plan cache's switches (`PYFUSER_DISABLE_PLAN_CACHE`, `PYFUSER_DISABLE_DISK_CACHE`,
`PYFUSER_DUMP`) and torch's `force_disable_caches`. Off, the backend compiles exactly as
without this module: it asks `enabled()` (the environment) and nothing else, imports no torch
internals, computes no key.

Invariants: a hit never gives another result than a compile: the key holds all the inputs of
the compile (or there is no key); a damaged or foreign file fails the disk cache's checksum (a
miss, logged at INFO by runtime/disk_cache.py); an entry that does not unpickle or rebuild is
deleted and the graph compiled as before, without storing (logged at INFO); a compile through
the cache that raises (a torch whose bundled entries want Inductor's output, say) is done again
without it. Where this torch lacks a piece the cache uses (`_torch_parts`: looked up once per
process), the cache is off with one logged warning and every graph is compiled as before. `stats` counts hits, misses, stores, bypasses (no key) and refused entries.
"""
from __future__ import annotations

import contextlib
import logging
import os
import pickle
import random

import torch

from ...runtime import disk_cache, plan_store
from .graph_cache_key import key_for

log = logging.getLogger("pyfuser")
NAME = "fx-graph"
FORMAT = 1
stats = {"hits": 0, "misses": 0, "stores": 0, "bypass": 0, "refused": 0}
disk_stats: dict = {}       # the disk cache's own counts for these entries (corrupt, foreign...)
last_bypass = [""]          # the last reason a graph had no key (tests read it)


def enabled() -> bool:
    """Whether graphs go through this cache: on unless `PYFUSER_GRAPH_CACHE=0` (false, no,
    off), torch's `force_disable_caches` or the plan cache's switches turn it off."""
    if os.environ.get("PYFUSER_GRAPH_CACHE", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    forced = getattr(getattr(torch.compiler, "config", None), "force_disable_caches", False)
    return not forced and plan_store.enabled()


# ---- compiling through the cache -----------------------------------------------------------------
_PARTS: list = []          # [the parts] once looked up, [None] where this torch lacks one
missing = [""]             # what this torch lacks (tests read it)


def _torch_parts():
    """torch's internal pieces this cache uses, looked up once per process (`_look_up`), or
    None where this torch lacks one: the cache is then off, said in one logged line."""
    if not _PARTS:
        try:
            _PARTS.append(_look_up())
        except (ImportError, AttributeError, TypeError) as e:
            _PARTS.append(None)
            missing[0] = f"{type(e).__name__}: {e}"
            log.warning("pyfuser graph cache: off: torch %s lacks a piece it uses (%s); graphs "
                        "are compiled without it", torch.__version__, missing[0])
    return _PARTS[0]


def _look_up():
    """Every torch internal the cache touches, imported or read here so that a torch without
    one turns the cache off before any graph goes through it (ImportError, AttributeError,
    TypeError: a changed signature)."""
    import types
    from torch._functorch._aot_autograd import autograd_cache as ac
    from torch._functorch._aot_autograd.schemas import SerializableAOTDispatchCompiler
    from torch._inductor import config as inductor_config
    from torch._subclasses import FakeTensorMode
    from torch._subclasses.fake_tensor import FakeTensor
    from torch.fx._graph_pickler import GraphPickler, Options
    from torch.fx.experimental.symbolic_shapes import ShapeEnv
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import _disable_current_modes
    try:
        from torch._functorch._aot_autograd.aot_autograd_result import \
            deserialize_bundled_cache_entry
    except ImportError:
        from torch._functorch._aot_autograd.autograd_cache import \
            deserialize_bundled_cache_entry
    from torch import _guards
    from torch._functorch import config as functorch_config
    from . import graph_cache_entry
    Options(ops_filter=None, node_metadata_key_filter=None)     # the filter dump_graph passes
    cfg = functorch_config
    for name in ("bundled_autograd_cache", "force_non_lazy_backward_lowering",
                 "enable_autograd_cache", "patch", "save_config"):
        getattr(cfg, name)
    for owner, names in ((ac.AOTAutogradCache, ("save", "_lookup")),
                         (ac, ("autograd_cache_key",)),
                         (GraphPickler, ("dumps", "loads")),
                         (inductor_config, ("save_config_portable",)),
                         (_guards.TracingContext, ("try_get",)),
                         (torch._ops, ("OpOverload", "OpOverloadPacket", "HigherOrderOperator")),
                         (torch._dynamo, ("disable",)),
                         (torch._C, ("_len_torch_dispatch_stack",)),
                         (torch._C._functorch, ("peek_interpreter_stack",))):
        for name in names:
            getattr(owner, name)
    return types.SimpleNamespace(ac=ac, Serializable=SerializableAOTDispatchCompiler,
                                 deserialize=deserialize_bundled_cache_entry,
                                 entry=graph_cache_entry,
                                 also=(FakeTensorMode, FakeTensor, ShapeEnv, StorageWeakRef,
                                       _disable_current_modes))   # used by the key, the entry


def compile(gm, example_inputs, make_aot, opts: dict):  # noqa: A001
    """The backend's compile of one Dynamo graph through the cache (module docstring).
    `make_aot(wrap)` builds the AotAutograd callable, its compilers passed through `wrap`.
    Called only where `enabled()`."""
    parts = _torch_parts()
    if parts is None:
        last_bypass[0] = f"this torch lacks {missing[0]}"
        stats["bypass"] += 1
        return make_aot(None)(gm, example_inputs)
    key, why = key_for(gm, example_inputs, opts)
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
    from . import compile_graph as CG
    n_compiled = len(CG._COMPILED)
    try:
        with _no_modes():
            entry = pickle.loads(data)
        if not isinstance(entry, tuple) or len(entry) != 2 or entry[0] != FORMAT:
            raise ValueError("another format")
        fn = parts.deserialize(entry[1])
    except Exception as e:  # noqa: BLE001 - a bad entry: compile as if it were absent
        stats["refused"] += 1
        log.info("pyfuser graph cache: entry %s refused (%s: %s); compiled again", key,
                 type(e).__name__, e)
        _remove(key)
        del CG._COMPILED[n_compiled:]           # what the failed rebuild compiled is not used
        return None, True
    stats["hits"] += 1
    return parts.entry.disable(fn, "do not trace AOT-compiled graph"), False


def _no_modes():
    from torch.utils._python_dispatch import _disable_current_modes
    return _disable_current_modes()


def _compile_and_store(gm, example_inputs, make_aot, key, parts):
    ac, Serializable, entry_mod = parts.ac, parts.Serializable, parts.entry
    Out = entry_mod.GraphOutputCode
    captured: list = []
    unsafe: list = []

    def wrap(kind, compile_fn):
        def fn(g, example):
            try:
                data = entry_mod.dump_graph(g)
            except Exception as e:  # noqa: BLE001 - not picklable: compile, store nothing
                unsafe.append(f"the {kind} graph does not pickle: {type(e).__name__}: {e}")
                data = None
            if entry_mod.examples_differ(g, example):   # a rebuilt graph's would be its own
                unsafe.append(f"the {kind} graph's example inputs are strided otherwise than its "
                              "placeholders")
            meta = getattr(torch._guards.TracingContext.try_get(), "fw_metadata", None)
            if getattr(meta, "bw_donated_idxs", ()) is None:
                # none donated (donated_buffer is patched off below), said as [] (the
                # backward's retain_graph check takes None for "some")
                meta.bw_donated_idxs = []
            compiled, extra = compile_fn(g, example)
            if data is not None and entry_mod.layout(compiled) is not None:
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
    # no donated buffers: the backward is compiled here, before any backward() says whether it
    # retains the graph, and one compiled with donated saved tensors refuses retain_graph=True
    # (the lazy compile without this cache sees the flag and donates none then); pyfuser's
    # backward reuses no saved tensor's memory, so nothing is lost
    donate = {"donated_buffer": False} if hasattr(cfg, "donated_buffer") else {}
    with cfg.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True,
                   enable_autograd_cache=True, **donate), \
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
