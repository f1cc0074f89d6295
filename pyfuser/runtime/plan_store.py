"""Plans on disk: what a new process needs to run a Fusion it has seen without segmenting it,
scheduling its kernels or printing their CUDA source again.

A *snapshot* of a Fusion is the Fusion itself, its segmentation (segment/segmenter.py) and the
kernel plans its executors hold (signature -> KernelPlan, codegen/kernel.py), pickled as one
object graph, so the identities between them (a plan's fusion is its executor's, a segment's
fusion is the one the plans were made for) survive. `restore` gives the segmentation back to
the Fusion and each plan to a new executor (`FusionExecutor.adopt`), whose CUBIN comes from
the CUBIN disk cache (keyed by the plan's source) in the background. Frontends key and store
snapshots (the torch.compile backend: frontend/fx/plan_cache.py) in the disk cache's directory
(`disk_cache.PLAN_SUFFIX` entries: atomic writes, checksums, privacy as for CUBINs).

What a key must hold besides the frontend's own description of the Fusion (`environment()`):
the hash of pyfuser's source (any change to the code invalidates every plan), Python's and
torch's versions, the executor mode, the target (the GPU's name, arch and SM count; the CPU
interpreter's arch) and every `PYFUSER_*` variable but those that only place or switch caches,
set the thread count or progress output (schedulers read tuning knobs from the environment).

Pickling (`dumps`/`loads`):
- a Fusion is stored without the runtime's caches on it (`_pyfuser_*` attributes: executors,
  segmentation, analyses such as the reduction graph), as any change to it would drop them;
- the op tables' entries (ir/ops.py OPS, REDUCTIONS, RANDOM_OPS) are stored by name and looked
  up on load (they hold lambdas, and are singletons);
- functions local to a pyfuser function (launch-configuration closures) are stored as the
  qualified name and first line of their code, looked up in the current source (the source
  hash in the key makes them the same code), with their defaults and cell contents;
- a dict attribute keyed by `id()` of objects (schedulers' work maps) means nothing in another
  process: it is replaced by a `StaleIdMap`, which raises on any use, so a plan that needed one
  after planning would fail loudly, never look up a wrong object (none does: tested on the
  model corpus).

Invariant: a snapshot is restored only into a process whose key is equal, so everything in it
was made by this very code for these very inputs' facts; a payload that does not unpickle or
does not have the expected shape is refused by the caller (which compiles as if it were absent).
`PYFUSER_DISABLE_PLAN_CACHE=1` (or `PYFUSER_DISABLE_DISK_CACHE=1`) turns plans on disk off;
so does `PYFUSER_DUMP` (the dumps of segmentation and planning must show).
"""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import io
import os
import pickle
import sys
import types

from . import disk_cache

FORMAT = 1
_CACHE_PREFIX = "_pyfuser_"   # ir/fusion.py RUNTIME_CACHE_PREFIX: derived caches on a Fusion
_ID_KEY_MIN = 1 << 32         # id() of a heap object on a 64-bit system is above this
# variables that do not change what is planned: cache placement and switches, threads, output
_ENV_IGNORED = frozenset({
    "PYFUSER_CACHE_DIR", "PYFUSER_CACHE_LOCK_TIMEOUT", "PYFUSER_DISABLE_DISK_CACHE",
    "PYFUSER_DISABLE_PLAN_CACHE", "PYFUSER_COMPILE_THREADS", "PYFUSER_PROGRESS",
    "PYFUSER_DUMP_DIR", "PYFUSER_POISON_OUTPUTS", "PYFUSER_NATIVE", "PYFUSER_LAUNCH_MODE",
    "PYFUSER_INTERP_RACECHECK", "PYFUSER_GRAPH_CACHE"})

stats = {"hits": 0, "misses": 0, "stores": 0, "corrupt": 0, "foreign": 0, "errors": 0,
         "refused": 0, "unpicklable": 0, "restored_plans": 0}


class PlanStoreError(RuntimeError):
    """A plan loaded from disk was asked for something only its planning process had."""


def enabled() -> bool:
    off = os.environ.get("PYFUSER_DISABLE_PLAN_CACHE", "").strip().lower() in (
        "1", "true", "yes", "on")
    return disk_cache.enabled() and not off and not os.environ.get("PYFUSER_DUMP")


# ---- keys ----------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def source_hash() -> str:
    """sha256 over pyfuser's Python sources (paths and contents)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    h = hashlib.sha256()
    for d, dirs, files in os.walk(root):
        dirs[:] = sorted(x for x in dirs if x != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(d, f)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                with open(path, "rb") as fh:
                    h.update(fh.read())
                h.update(b"\0")
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _device_facts(index: int) -> tuple:
    import torch
    p = torch.cuda.get_device_properties(index)
    return (p.name, p.major, p.minor, p.multi_processor_count)


def environment(mode: str, device=None) -> tuple:
    """Everything besides the Fusion that a plan depends on (see the module docstring)."""
    import torch
    from . import nvrtc
    if mode == "cuda":
        index = device.index if getattr(device, "index", None) is not None else \
            torch.cuda.current_device()
        target = ("cuda",) + _device_facts(index) + (os.environ.get("PYFUSER_ARCH", ""),)
    else:
        target = (mode, nvrtc.default_arch())
    env = tuple(sorted((k, v) for k, v in os.environ.items()
                       if k.startswith("PYFUSER_") and k not in _ENV_IGNORED))
    return ("pyfuser-plans", FORMAT, source_hash(), sys.version, torch.__version__, target, env)


def make_key(description, mode: str, device=None) -> str:
    return disk_cache.make_key(repr(description), environment(mode, device))


# ---- storing and loading ------------------------------------------------------------------------
def store(key: str, payload: bytes, name: str) -> bool:
    return enabled() and disk_cache.store(key, payload, name, disk_cache.PLAN_SUFFIX, stats)


def load(key: str, name: str) -> bytes | None:
    if not enabled():
        return None
    return disk_cache.load(key, name, disk_cache.PLAN_SUFFIX, stats)


def remove(key: str) -> None:
    try:
        os.remove(disk_cache.entry_path(key, disk_cache.PLAN_SUFFIX))
    except OSError:
        pass


# ---- snapshots ---------------------------------------------------------------------------------
def snapshot(fusion) -> dict:
    """The Fusion, its cached segmentation (or None) and its kernels' plans (see the module
    docstring): {"fusion", "sf", "fusions", "plans": [(index into fusions, mode, sig, plan)]}."""
    from ..segment.segmenter import _ATTR as SEG_ATTR
    from .dispatch import _ATTR as EX_ATTR
    holder = fusion.__dict__.get(SEG_ATTR)
    sf = holder.value if holder is not None else None
    fusions = [fusion]
    if sf is not None:
        fusions += [s.fusion for s in sf.segments
                    if s.kind == "kernel" and s.fusion is not None and s.fusion is not fusion]
    plans = []
    for i, f in enumerate(fusions):
        for mode, ex in sorted((f.__dict__.get(EX_ATTR) or {}).items()):
            if ex is not None:
                plans += [(i, mode, sig, plan) for sig, plan in ex.plans().items()]
    return {"fusion": fusion, "sf": sf, "fusions": fusions, "plans": plans}


def restore(snap: dict, arch: str | None = None) -> int:
    """Give a loaded snapshot's segmentation back to its Fusion and its plans to executors
    (their CUBINs fetched in the background); returns the number of plans adopted."""
    from ..segment.segmenter import adopt
    from .dispatch import _segment_executor
    fusion, sf, fusions = snap["fusion"], snap["sf"], snap["fusions"]
    if sf is not None:
        adopt(fusion, sf)
    n = 0
    for i, mode, sig, plan in snap["plans"]:
        ex = _segment_executor(fusions[i], mode)
        if ex is not None and ex.adopt(sig, plan, arch):
            n += 1
    disk_cache._count("restored_plans", n, stats)
    return n


# ---- pickling ----------------------------------------------------------------------------------
def _tables():
    from ..ir import ops
    return {"OPS": ops.OPS, "REDUCTIONS": ops.REDUCTIONS, "RANDOM_OPS": ops.RANDOM_OPS}


@functools.lru_cache(maxsize=None)
def _table_index() -> dict:
    return {id(v): (t, k) for t, table in _tables().items() for k, v in table.items()}


def _table_entry(table: str, name: str):
    return _tables()[table][name]


def _find_code(code, qualname: str, line: int):
    """The code object of function `qualname` defined at `line`, among those nested in `code`."""
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            q = getattr(c, "co_qualname", None)          # Python 3.11+
            same = q == qualname if q is not None else c.co_name == qualname.rsplit(".", 1)[-1]
            if same and c.co_firstlineno == line:
                return c
            found = _find_code(c, qualname, line)
            if found is not None:
                return found
    return None


def _local_function(module: str, qualname: str, line: int, defaults, kwdefaults, cells, attrs):
    """Rebuild a function local to a pyfuser function from its code in the current source."""
    mod = sys.modules.get(module) or __import__(module, fromlist=["_"])
    outer = mod
    for part in qualname.split(".<locals>.")[0].split("."):
        outer = getattr(outer, part)
    code = _find_code(outer.__code__, qualname, line)
    if code is None:
        raise PlanStoreError(f"no function {qualname} at line {line} in {module}")
    fn = types.FunctionType(code, mod.__dict__, code.co_name, defaults,
                            tuple(types.CellType(c) for c in cells) if cells is not None else None)
    fn.__kwdefaults__ = kwdefaults
    fn.__qualname__ = qualname
    fn.__dict__.update(attrs)
    return fn


class StaleIdMap(dict):
    """Stands for a dict keyed by id() of another process's objects (see the module docstring):
    any use raises PlanStoreError."""

    def _stale(self, *args, **kwargs):
        raise PlanStoreError("a plan loaded from disk used a map keyed by object ids of the "
                             "process that made it")

    __getitem__ = get = __contains__ = __iter__ = __len__ = keys = values = items = _stale
    __setitem__ = __delitem__ = pop = setdefault = update = _stale

    def __reduce__(self):
        return (StaleIdMap, ())

    def __repr__(self) -> str:
        return "StaleIdMap()"


@functools.lru_cache(maxsize=None)
def _fusion_class():
    from ..ir.fusion import Fusion
    return Fusion


def _id_keyed(v) -> bool:
    return type(v) is dict and bool(v) and all(type(k) is int and k >= _ID_KEY_MIN for k in v)


class _Pickler(pickle.Pickler):
    def reducer_override(self, obj):
        if type(obj) is types.FunctionType:
            if "<locals>" in obj.__qualname__ and obj.__module__.startswith("pyfuser."):
                cells = None if obj.__closure__ is None else tuple(
                    StaleIdMap() if _id_keyed(c.cell_contents) else c.cell_contents
                    for c in obj.__closure__)
                return (_local_function, (obj.__module__, obj.__qualname__,
                                          obj.__code__.co_firstlineno, obj.__defaults__,
                                          obj.__kwdefaults__, cells, dict(obj.__dict__)))
            return NotImplemented
        where = _table_index().get(id(obj))
        if where is not None:
            return (_table_entry, where)
        if isinstance(obj, _fusion_class()):
            # the runtime's caches on a Fusion (_pyfuser_*: executors, segmentation, analyses)
            # are left behind; restore() gives back the ones a snapshot carries
            rv = list(obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL))
            if len(rv) > 2 and isinstance(rv[2], dict):
                rv[2] = {k: v for k, v in rv[2].items() if not k.startswith(_CACHE_PREFIX)}
                return tuple(rv)
            raise pickle.PicklingError("a Fusion whose state is not a dict")
        d = getattr(obj, "__dict__", None)
        # (the type test first: most values are not dicts, and a call per value was a third of
        # pickling a model's plans)
        if type(d) is dict and type(obj).__module__.startswith("pyfuser.") and \
                any(type(v) is dict and _id_keyed(v) for v in d.values()):
            rv = list(obj.__reduce_ex__(pickle.HIGHEST_PROTOCOL))
            if len(rv) > 2 and isinstance(rv[2], dict):
                rv[2] = {k: StaleIdMap() if _id_keyed(v) else v for k, v in rv[2].items()}
                return tuple(rv)
            raise pickle.PicklingError(f"{type(obj).__name__}: a map keyed by object ids in a "
                                       "state that cannot be rewritten")
        return NotImplemented


def dumps(obj) -> bytes:
    """Pickle a snapshot (PicklingError, RecursionError... for what cannot be stored)."""
    with _quiet_gc():
        buf = io.BytesIO()
        _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
        return buf.getvalue()


def loads(data: bytes):
    with _quiet_gc():
        return pickle.loads(data)


@contextlib.contextmanager
def _quiet_gc():
    """Deep object graphs (a raised recursion limit) and no garbage collection meanwhile: a
    snapshot is thousands of new objects, each batch of which would otherwise start a
    collection that walks every object of the process (torch's and Dynamo's included: most of
    the time of a load in a model's process)."""
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 50000))
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
        sys.setrecursionlimit(old)
