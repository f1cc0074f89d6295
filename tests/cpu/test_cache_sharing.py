"""One disk cache shared by several processes (the ranks of a job on one host): each kernel is
compiled by one process while the others wait for its entry and load it; the per-key lock
(disk_cache.key_lock) excludes, times out, and never stays with a dead process; a damaged entry is
rebuilt once and overwritten; with the cache off every process compiles for itself.

The races run in spawned processes (tests/cpu/cache_workers.py) started together behind a
barrier. "Exactly one compile per kernel" is checked by counting: every process needs each of the
K kernels (compiled by NVRTC or loaded), the directory starts empty (so each kernel is compiled at
least once), and the NVRTC compiles of all processes add up to K.
"""
from __future__ import annotations

import importlib.util
import multiprocessing as mp
import os
import threading
import time

import pytest

import cache_workers as W
from pyfuser.runtime import disk_cache as dc

pytestmark = pytest.mark.multiprocess


def _has_nvrtc() -> bool:
    try:
        return importlib.util.find_spec("cuda.bindings.nvrtc") is not None
    except ModuleNotFoundError:
        return False


nvrtc_needed = pytest.mark.skipif(not _has_nvrtc(), reason="cuda-bindings (NVRTC) is not installed")

SPAWN = mp.get_context("spawn")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE", raising=False)
    monkeypatch.delenv("PYFUSER_CACHE_LOCK_TIMEOUT", raising=False)


def _race(target, n, *args, timeout=120):
    """Run target(*args, barrier, queue, worker_id) in n spawned processes; their reports by id."""
    barrier, queue = SPAWN.Barrier(n), SPAWN.Queue()
    procs = [SPAWN.Process(target=target, args=(*args, barrier, queue, i)) for i in range(n)]
    for p in procs:
        p.start()
    try:
        reports = dict(queue.get(timeout=timeout) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    errors = [r["error"] for r in reports.values() if "error" in r]
    assert not errors, errors[0]
    assert [p.exitcode for p in procs] == [0] * n
    return [reports[i] for i in range(n)]


def _entries(cache) -> list:
    return [n for n in os.listdir(cache) if n.endswith(dc.SUFFIX)]


# ---- the lock helper ---------------------------------------------------------------------------
def test_lock_is_held_and_its_file_removed_on_release():
    key = dc.make_key("lock basics")
    with dc.key_lock(key) as lock:
        assert lock.held and not lock.timed_out
        assert os.path.exists(dc.lock_path(key))
        assert os.stat(dc.lock_path(key)).st_mode & 0o077 == 0
    assert not lock.held and not os.path.exists(dc.lock_path(key))
    assert os.listdir(dc.cache_dir()) == []


def test_a_second_holder_waits_then_times_out():
    key = dc.make_key("busy")
    before = dc.stats["lock_timeouts"]
    with dc.key_lock(key):
        result = {}

        def other():            # another thread opens its own file description: it is excluded
            with dc.key_lock(key, timeout=0.2) as lock:
                result.update(held=lock.held, timed_out=lock.timed_out, waited=lock.waited_s)
        t = threading.Thread(target=other)
        t.start()
        t.join(10)
    assert result == {"held": False, "timed_out": True, "waited": result["waited"]}
    assert 0.2 <= result["waited"] < 5
    assert dc.stats["lock_timeouts"] == before + 1


def test_a_waiter_gets_the_lock_when_the_holder_releases():
    key = dc.make_key("handoff")
    first = dc.key_lock(key).__enter__()
    got = {}

    def waiter():
        with dc.key_lock(key, timeout=30) as lock:
            got.update(held=lock.held, waited=lock.waited_s,
                       file=os.path.exists(dc.lock_path(key)))
    before = dc.stats["lock_waits"]
    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.3)
    assert t.is_alive()                      # still waiting while the first one holds it
    first.__exit__(None, None, None)         # deletes its lock file, then releases
    t.join(10)
    # the waiter won the old (deleted) file's lock, saw it was gone and took the path's new file
    assert got["held"] and got["file"] and got["waited"] >= 0.3
    assert dc.stats["lock_waits"] == before + 1
    assert not os.path.exists(dc.lock_path(key))


def test_lock_of_a_killed_process_does_not_block():
    key = dc.make_key("dead holder")
    ready, release, queue = SPAWN.Event(), SPAWN.Event(), SPAWN.Queue()
    p = SPAWN.Process(target=W.hold_lock, args=(dc.cache_dir(), key, ready, release, queue))
    p.start()
    assert ready.wait(60)
    assert queue.get(timeout=10) == ("held", True)
    with dc.key_lock(key, timeout=0.1) as lock:
        assert not lock.held and lock.timed_out           # held by the live process
    p.kill()
    p.join(30)
    assert os.path.exists(dc.lock_path(key))              # its lock file stays behind ...
    with dc.key_lock(key, timeout=5) as lock:             # ... and blocks no one
        assert lock.held and lock.waited_s < 1
    assert not os.path.exists(dc.lock_path(key))


@pytest.mark.skipif("fork" not in mp.get_all_start_methods(), reason="needs fork")
def test_a_child_forked_while_the_lock_is_held_does_not_keep_it():
    """A child forked during a compile (a DataLoader worker) shares the lock's open file; a
    waiter already blocked on that file gets the lock when the holder releases, not when the
    child exits."""
    key = dc.make_key("forked")
    got = {}

    def waiter():
        with dc.key_lock(key, timeout=10) as lock:
            got.update(held=lock.held, waited=lock.waited_s)
    first = dc.key_lock(key).__enter__()
    child = mp.get_context("fork").Process(target=time.sleep, args=(30,))
    child.start()
    try:
        t = threading.Thread(target=waiter)
        t.start()
        time.sleep(0.3)                          # the waiter polls the held file
        first.__exit__(None, None, None)
        t.join(15)
        assert got["held"] and got["waited"] < 5, got
    finally:
        child.kill()
        child.join()


def test_lock_excludes_racing_processes(tmp_path):
    key = dc.make_key("counter")
    counter = tmp_path / "counter"
    counter.write_text("0")
    os.makedirs(dc.cache_dir(), mode=0o700, exist_ok=True)
    reports = _race(W.count_under_lock, 6, dc.cache_dir(), key, str(counter))
    assert int(counter.read_text()) == 6 * 3                # no lost update
    spans = sorted(s for r in reports for s in r["spans"])
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), "two holders at once"
    assert not os.path.exists(dc.lock_path(key))


@pytest.mark.parametrize("how", ["disabled", "timeout_zero"])
def test_no_lock_without_a_cache_or_with_no_wait(how, monkeypatch):
    key = dc.make_key("off")
    if how == "disabled":
        monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
        with dc.key_lock(key) as lock:
            assert not lock.held
        assert not os.path.exists(dc.cache_dir())
    else:
        monkeypatch.setenv("PYFUSER_CACHE_LOCK_TIMEOUT", "0")
        assert dc.lock_timeout() == 0
        with dc.key_lock(key) as a:
            with dc.key_lock(key) as b:
                assert a.held and not b.held and b.timed_out and b.waited_s < 1


def test_lock_timeout_setting(monkeypatch):
    assert dc.lock_timeout() == dc.DEFAULT_LOCK_TIMEOUT_S
    monkeypatch.setenv("PYFUSER_CACHE_LOCK_TIMEOUT", "2.5")
    assert dc.lock_timeout() == 2.5
    monkeypatch.setenv("PYFUSER_CACHE_LOCK_TIMEOUT", "soon")
    assert dc.lock_timeout() == dc.DEFAULT_LOCK_TIMEOUT_S


def test_clear_removes_lock_files_too():
    key = dc.make_key("stale")
    dc.store(key, b"x")
    open(dc.lock_path(key), "w").close()       # as a killed holder leaves it
    assert dc.clear() == 2 and os.listdir(dc.cache_dir()) == []


def test_an_entry_torn_by_a_crash_is_a_miss_and_is_rebuilt():
    """Entries are not fsynced: after a power loss the renamed entry may hold fewer bytes than
    were written (or none). Such an entry fails its checksum: a miss, deleted, stored again."""
    key = dc.make_key("torn")
    payload = b"y" * 4096
    assert dc.store(key, payload)
    path = dc.entry_path(key)
    with open(path, "rb") as f:
        whole = f.read()
    for torn in (whole[:len(whole) // 2], b""):
        with open(path, "wb") as f:
            f.write(torn)
        assert dc.load(key) is None and not os.path.exists(path)
        assert dc.store(key, payload) and dc.load(key) == payload


def test_a_damaged_entry_replaced_meanwhile_is_not_deleted(monkeypatch):
    """A reader that saw a damaged entry must not delete the good one another process has just
    written over it."""
    key = dc.make_key("replaced")
    dc.store(key, b"good")
    path = dc.entry_path(key)
    with open(path, "wb") as f:
        f.write(b"damaged")
    real_parse = dc.parse

    def parse_then_rewrite(blob):       # another process stores the good entry meanwhile
        dc.store(key, b"good")
        return real_parse(blob)
    monkeypatch.setattr(dc, "parse", parse_then_rewrite)
    assert dc.load(key) is None
    monkeypatch.setattr(dc, "parse", real_parse)
    assert dc.load(key) == b"good"


# ---- compile_cuda across processes -------------------------------------------------------------
@nvrtc_needed
def test_racing_processes_compile_each_kernel_once():
    from pyfuser.runtime import nvrtc
    k, n = 4, 8
    reports = _race(W.compile_sources, n, dc.cache_dir(), k)
    assert sum(r["nvrtc"] for r in reports) == k, reports
    assert all(r["nvrtc"] + r["disk"] == k for r in reports)
    assert all(r["lock_timeouts"] == 0 for r in reports)
    assert all(r["cubins"] == reports[0]["cubins"] for r in reports)
    assert len(_entries(dc.cache_dir())) == k + 1            # + the NVRTC version entry
    assert nvrtc.kernel_entries() == k
    assert not [f for f in os.listdir(dc.cache_dir()) if f.endswith((".lock", ".tmp"))]


@nvrtc_needed
def test_damaged_entry_is_rebuilt_once_and_overwritten():
    from pyfuser.runtime import nvrtc
    src, name = W.kernel_source(0)
    good = nvrtc.compile_cuda(src, name, arch="sm_90")
    path = dc.entry_path(good.key)
    blob = open(path, "rb").read()
    with open(path, "wb") as f:                      # a torn write: half the entry
        f.write(blob[:len(blob) // 2])
    reports = _race(W.compile_sources, 4, dc.cache_dir(), 1)
    assert sum(r["nvrtc"] for r in reports) == 1, reports
    assert all(r["cubins"][name] == good.cubin for r in reports)
    assert dc.load(good.key, name) is not None        # overwritten with a whole entry


@nvrtc_needed
def test_cache_off_every_process_compiles():
    reports = _race(W.compile_sources, 2, None, 2)
    assert [r["nvrtc"] for r in reports] == [2, 2]
    assert all(r["disk"] == 0 for r in reports)
    assert not os.path.exists(dc.cache_dir())


@nvrtc_needed
def test_default_cache_dir_is_shared_too(tmp_path, monkeypatch):
    """Without PYFUSER_CACHE_DIR the default ~/.cache/pyfuser is used, the same way."""
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("PYFUSER_CACHE_DIR")
    default = dc.cache_dir()
    assert default == str(home / ".cache" / "pyfuser")
    reports = _race(W.compile_sources, 3, default, 2)
    assert sum(r["nvrtc"] for r in reports) == 2
    assert len(_entries(default)) == 3


# ---- the whole pipeline: 8 processes fuse the same programs on the CPU ------------------------
@nvrtc_needed
def test_eight_processes_fuse_the_same_programs_into_one_cache():
    reports = _race(W.run_fusions, 8, dc.cache_dir(), timeout=240)
    kernels = reports[0]["kernels"]
    assert kernels >= 3
    assert all(r["errors"] == [] for r in reports), reports
    assert all(r["kernels"] == kernels and r["nvrtc"] + r["disk"] == kernels for r in reports)
    assert sum(r["nvrtc"] for r in reports) == kernels, [r["nvrtc"] for r in reports]
    assert all(r["lock_timeouts"] == 0 for r in reports)
    assert len(_entries(dc.cache_dir())) == kernels + 1
