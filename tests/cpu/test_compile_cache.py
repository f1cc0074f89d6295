"""Compile time of the torch.compile backend: kernels planned ahead of the first call and
compiled by NVRTC in background threads (nvrtc.compile_async), and regions' plans on disk
(frontend/fx/plan_cache.py, runtime/plan_store.py) that a new process loads instead of lowering,
segmenting and planning again; corrupted, foreign or stale entries are refused and compiled
again; the switches turn it off."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
import torch.nn.functional as F

import pyfuser
from pyfuser.frontend.fx import compile_graph as CG
from pyfuser.frontend.fx import compiled_graphs, reset_compiled
from pyfuser.runtime import dispatch, disk_cache, nvrtc, plan_store

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class Block(torch.nn.Module):
    """Pointwise ops, a layer norm and a softmax (reductions), forward and backward."""

    def __init__(self, d=16):
        super().__init__()
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)
        self.norm = torch.nn.LayerNorm(d)

    def forward(self, x):
        h = F.gelu(self.up(x)) * 0.5
        y = self.norm(x + self.down(h))
        return torch.softmax(y * 2.0, dim=-1) + torch.tanh(y)


def _fresh_process_state():
    """What a new process would not have: Dynamo's graphs, lowered regions, executors."""
    torch._dynamo.reset()
    reset_compiled()
    CG.clear_cache()
    dispatch.clear_caches()


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("PYFUSER_DISABLE_DISK_CACHE", "PYFUSER_DISABLE_PLAN_CACHE", "PYFUSER_DUMP"):
        monkeypatch.delenv(var, raising=False)
    _fresh_process_state()
    yield
    nvrtc.wait_all()
    _fresh_process_state()


class Counts:
    """Counts lowerings, segmentations and plannings (the Python work the plans on disk skip)."""

    def __init__(self, monkeypatch):
        from pyfuser.codegen import api
        from pyfuser.segment import segmenter
        self.n = {"lower": 0, "segment": 0, "plan": 0}
        for owner, attr, name in ((CG, "lower_region", "lower"), (segmenter, "_segment", "segment"),
                                  (api, "plan_kernel", "plan")):
            monkeypatch.setattr(owner, attr, self._counting(getattr(owner, attr), name))
        self.nvrtc0 = nvrtc.stats["nvrtc"]

    def _counting(self, fn, name):
        def wrapped(*a, **k):
            self.n[name] += 1
            return fn(*a, **k)
        return wrapped

    @property
    def nvrtc(self) -> int:
        return nvrtc.stats["nvrtc"] - self.nvrtc0


def _run(model, x):
    """Inference forward and one training step through the backend; returns (forward, grads)."""
    cm = pyfuser.compile(model)
    with torch.no_grad():
        fwd = cm(x)
    out = cm(x)
    out.square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return fwd, grads


def _eager(model, x):
    with torch.no_grad():
        fwd = model(x)
    model(x).square().mean().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    for p in model.parameters():
        p.grad = None
    return fwd, grads


def _check(got, want):
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for g, w in zip(got[1], want[1]):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)


def _plan_files():
    d = disk_cache.cache_dir()
    return sorted(n for n in os.listdir(d) if n.endswith(disk_cache.PLAN_SUFFIX)) \
        if os.path.isdir(d) else []


# ---- concurrency ---------------------------------------------------------------------------------
def test_nvrtc_compile_releases_the_gil():
    """A thread compiling a kernel leaves the GIL to the others: the main thread keeps running
    Python while NVRTC works (what makes the compile threads overlap the planning)."""
    body = "".join(f"  x = tanhf(x) * 1.0001f + {i}.0f; x = sinf(x) * x;\n" for i in range(3))
    src = ('extern "C" __global__ void gil_probe(float* a) {\n  float x = a[0];\n'
           f"{body}  a[0] = x;\n}}\n")
    opts = nvrtc.build_options("sm_90")
    done, gaps = threading.Event(), []

    def compile_it():
        t0 = time.perf_counter()
        nvrtc._compile(src, "gil_probe", "sm_90", opts, "probe")
        gaps.append(time.perf_counter() - t0)
        done.set()

    th = threading.Thread(target=compile_it)
    last, worst = time.perf_counter(), 0.0
    th.start()
    while not done.is_set():
        now = time.perf_counter()
        worst, last = max(worst, now - last), now
    th.join()
    took = gaps[0]
    assert took > 0.05, f"the probe kernel compiled too fast to tell ({took:.3f} s)"
    # holding the GIL through nvrtcCompileProgram would stall this loop for the whole compile
    assert worst < 0.5 * took, (worst, took)


def _binaries():
    """(kernel name, source, sha256 of the CUBIN) of every kernel the compiled graphs ran."""
    from pyfuser.segment.segmenter import segment
    out = set()
    for g in compiled_graphs():
        for r in g.regions:
            fusions = [r.fusion] + [s.fusion for s in segment(r.fusion).segments
                                    if s.kind == "kernel"]
            for f in fusions:
                for ex in (f.__dict__.get(dispatch._ATTR) or {}).values():
                    for e in (ex._plans.values() if ex is not None else ()):
                        if e.binary is not None:
                            out.add((e.kernel.name, e.kernel.source,
                                     hashlib.sha256(e.binary.cubin).hexdigest()))
    return out


def test_concurrent_compile_gives_the_same_kernels_as_serial(monkeypatch, tmp_path):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 5, 16)
    want = _eager(model, x)
    kernels = {}
    for threads in ("0", "3"):
        monkeypatch.setenv("PYFUSER_COMPILE_THREADS", threads)
        monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / f"cache{threads}"))
        _fresh_process_state()
        counts = Counts(monkeypatch)
        _check(_run(model, x), want)
        kernels[threads] = _binaries()
        assert counts.nvrtc == len({(n, s) for n, s, _ in kernels[threads]}) > 3
    assert kernels["0"] == kernels["3"]


def test_kernels_are_planned_when_the_graph_is_compiled(monkeypatch):
    """compile_graph plans every region's kernels from the example values (prepare), so the
    first call plans nothing: its signatures are the prepared ones."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 5, 16)
    counts = Counts(monkeypatch)
    planned = []
    orig = CG._prepare

    def spy(fused):
        orig(fused)
        planned.append(counts.n["plan"])
    monkeypatch.setattr(CG, "_prepare", spy)
    cm = pyfuser.compile(model)
    with torch.no_grad():
        got = cm(x)
    assert planned and planned[-1] == counts.n["plan"] > 0   # nothing planned by the call
    torch.testing.assert_close(got, _eager(model, x)[0], rtol=1e-5, atol=1e-5)


# ---- plans on disk -------------------------------------------------------------------------------
def test_warm_start_loads_the_plans_and_skips_lowering_and_planning(monkeypatch):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 5, 16)
    want = _eager(model, x)
    cold = Counts(monkeypatch)
    _check(_run(model, x), want)
    assert cold.n["lower"] > 0 and cold.n["plan"] > 0 and cold.nvrtc > 0
    files = _plan_files()
    assert files and plan_store.stats["stores"] >= len(files)
    _fresh_process_state()
    hits = plan_store.stats["hits"]
    warm = Counts(monkeypatch)
    _check(_run(model, x), want)
    assert warm.n == {"lower": 0, "segment": 0, "plan": 0}, warm.n
    assert warm.nvrtc == 0
    assert plan_store.stats["hits"] - hits >= len(files)


class TwoSizes(torch.nn.Module):
    """One region form at two sizes (a strided convolution between): its regions share one
    lowered Fusion, whose executors plan a kernel for each size (a ResNet's layers)."""

    def __init__(self):
        super().__init__()
        self.c1 = torch.nn.Conv2d(2, 2, 3, padding=1, bias=False)
        self.c2 = torch.nn.Conv2d(2, 2, 3, stride=2, padding=1, bias=False)

    def forward(self, x):
        x = torch.relu(self.c1(x) * 2 + 1)
        return torch.relu(self.c2(x) * 2 + 1)


def test_a_warm_start_plans_nothing_for_a_region_form_seen_at_two_sizes(monkeypatch):
    torch.manual_seed(0)
    model, x = TwoSizes(), torch.randn(2, 2, 8, 8)
    want = _eager(model, x)
    cold = Counts(monkeypatch)
    _check(_run(model, x), want)
    assert cold.n["plan"] > cold.n["lower"] > 0, cold.n     # fewer forms than kernels
    _fresh_process_state()
    warm = Counts(monkeypatch)
    _check(_run(model, x), want)
    assert warm.n == {"lower": 0, "segment": 0, "plan": 0}, warm.n
    assert warm.nvrtc == 0


WARM_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    sys.path.insert(0, {tests!r})
    from test_compile_cache import Block, Counts, _run, _eager
    class MP:                      # monkeypatch.setattr without pytest
        def setattr(self, owner, attr, value):
            setattr(owner, attr, value)
    torch.manual_seed(0)
    device = {device!r}
    model, x = Block().to(device), torch.randn(3, 5, 16, device=device)
    want = _eager(model, x)
    counts = Counts(MP())
    got = _run(model, x)
    from pyfuser.runtime import plan_store
    from pyfuser.frontend.fx import compiled_graphs
    ok = torch.allclose(got[0], want[0], rtol=1e-5, atol=1e-5) and all(
        torch.allclose(g, w, rtol=1e-4, atol=1e-5) for g, w in zip(got[1], want[1]))
    kernels = sum(g.kernels() for g in compiled_graphs())
    print("RESULT", json.dumps(dict(counts.n, nvrtc=counts.nvrtc, equal=bool(ok), kernels=kernels,
                                    **{{"store_" + k: v for k, v in plan_store.stats.items()}})))
""")


def _process(env, device="cpu") -> dict:
    """Run WARM_SCRIPT (the Block's forward and training step beside eager) in a new process."""
    code = WARM_SCRIPT.format(tests=os.path.join(ROOT, "tests", "cpu"), device=device)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert lines, out.stdout[-2000:] + out.stderr[-4000:]
    return json.loads(lines[-1][7:])


def test_a_new_process_reuses_the_plans_and_matches_eager(tmp_path):
    env = dict(os.environ, PYFUSER_CACHE_DIR=str(tmp_path / "shared"),
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cold = _process(env)
    assert cold["equal"] and cold["lower"] > 0 and cold["plan"] > 0 and cold["nvrtc"] > 0
    assert cold["store_stores"] > 0
    warm = _process(env)
    assert warm["equal"]
    assert (warm["lower"], warm["segment"], warm["plan"], warm["nvrtc"]) == (0, 0, 0, 0), warm
    assert warm["store_hits"] == cold["store_stores"] and warm["store_restored_plans"] > 0


def _corrupt_all(how):
    d = disk_cache.cache_dir()
    for name in _plan_files():
        path = os.path.join(d, name)
        with open(path, "rb") as f:
            blob = f.read()
        with open(path, "wb") as f:
            f.write(how(blob))


def test_a_damaged_entry_is_refused_and_the_region_compiled_again(monkeypatch):
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 5, 16)
    want = _eager(model, x)
    _check(_run(model, x), want)
    n = len(_plan_files())
    _corrupt_all(lambda b: b[:-7] + bytes(c ^ 0x5A for c in b[-7:]))     # checksum mismatch
    _fresh_process_state()
    bad = disk_cache.stats["corrupt"], plan_store.stats["corrupt"]
    counts = Counts(monkeypatch)
    _check(_run(model, x), want)
    assert plan_store.stats["corrupt"] - bad[1] >= n
    assert disk_cache.stats["corrupt"] == bad[0]         # the CUBINs' counters are their own
    assert counts.n["lower"] > 0 and counts.n["plan"] > 0
    assert len(_plan_files()) == n                       # written again
    _fresh_process_state()
    counts = Counts(monkeypatch)
    _check(_run(model, x), want)
    assert counts.n["lower"] == counts.n["plan"] == 0


def test_a_well_formed_entry_that_does_not_fit_is_refused_with_the_reason(monkeypatch, caplog):
    """A payload with a valid checksum that does not unpickle, or holds another region's plans,
    is refused (logged with the reason), and the region lowered again."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 5, 16)
    want = _eager(model, x)
    _check(_run(model, x), want)
    d = disk_cache.cache_dir()
    files = _plan_files()
    assert len(files) >= 2
    entries = {}
    for name in files:
        with open(os.path.join(d, name), "rb") as f:
            entries[name] = disk_cache.parse(f.read())
    # first entry: garbage pickle; the others: the next one's payload under their own key
    first = files[0]
    key, nm, _ = entries[first]
    with open(os.path.join(d, first), "wb") as f:
        f.write(disk_cache.encode(b"\x80\x05not a pickle", key, nm))
    for a, b in zip(files[1:], files[2:] + files[1:2]):
        key, nm, _ = entries[a]
        with open(os.path.join(d, a), "wb") as f:
            f.write(disk_cache.encode(entries[b][2], key, nm))
    _fresh_process_state()
    refused = plan_store.stats["refused"]
    counts = Counts(monkeypatch)
    with caplog.at_level(logging.INFO, logger="pyfuser"):
        _check(_run(model, x), want)
    assert plan_store.stats["refused"] - refused == len(files)
    text = caplog.text
    assert "does not load" in text and "written for another region" in text
    assert counts.n["lower"] >= len(files)


def test_stale_entries_are_not_used(monkeypatch):
    """Another pyfuser source, or another value of a tuning knob, is another key."""
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 5, 16)
    want = _eager(model, x)
    _check(_run(model, x), want)
    n = len(_plan_files())
    for change in ("source", "knob"):
        _fresh_process_state()
        if change == "source":
            monkeypatch.setattr(plan_store, "source_hash", lambda: "another version")
        else:
            monkeypatch.setenv("PYFUSER_PW_BLOCK", "64")
        counts = Counts(monkeypatch)
        _check(_run(model, x), want)
        assert counts.n["lower"] > 0 and counts.n["plan"] > 0, change
        assert len(_plan_files()) > n
        n = len(_plan_files())


@pytest.mark.parametrize("switch", ["PYFUSER_DISABLE_PLAN_CACHE", "PYFUSER_DISABLE_DISK_CACHE"])
def test_switches_turn_the_plans_on_disk_off(monkeypatch, switch):
    monkeypatch.setenv(switch, "1")
    torch.manual_seed(0)
    model, x = Block(), torch.randn(3, 5, 16)
    want = _eager(model, x)
    _check(_run(model, x), want)
    assert _plan_files() == []
    _fresh_process_state()
    counts = Counts(monkeypatch)
    _check(_run(model, x), want)
    assert counts.n["lower"] > 0 and counts.n["plan"] > 0


def test_maps_keyed_by_object_ids_do_not_survive_pickling():
    """A dict attribute keyed by id() of objects (a scheduler's work map) comes back as a
    StaleIdMap that raises on use, never as a map of another process's addresses; other dicts
    come back as they were."""
    from pyfuser.segment.segmented_fusion import SegmentRun
    objs = [object(), object()]
    r = SegmentRun("kernel", None, [], None)
    r.ids = {id(o): k for k, o in enumerate(objs)}
    r.names = {"a": 1, 7: 2}
    back = plan_store.loads(plan_store.dumps(r))
    assert back.names == r.names and back.kind == "kernel"
    assert isinstance(back.ids, plan_store.StaleIdMap)
    with pytest.raises(plan_store.PlanStoreError):
        back.ids.get(id(objs[0]))
    with pytest.raises(plan_store.PlanStoreError):
        len(back.ids)


def test_local_functions_are_rebuilt_from_the_current_source():
    """A launch-configuration closure pickles as a reference to its code plus its cells."""
    from pyfuser.codegen.api import _pointwise_launch
    from pyfuser.schedule.pointwise_heuristics import PointwiseParams
    from types import SimpleNamespace
    params = PointwiseParams(kind="1d", vec=4, block=128, unroll=2, groups=[[0, 1]])
    fn = _pointwise_launch(SimpleNamespace(params=params), 0)
    back = plan_store.loads(plan_store.dumps(fn))
    assert back.__code__ is fn.__code__ and back is not fn
    t = [torch.empty(64, 100)]
    assert str(back(None, t)) == str(fn(None, t))
