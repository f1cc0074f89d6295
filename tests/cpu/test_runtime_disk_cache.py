"""The on-disk kernel cache: round trip, bypass, damaged entries, concurrent writers."""
import multiprocessing as mp
import os

import pytest

from pyfuser.runtime import disk_cache as dc


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE", raising=False)


def test_round_trip_and_default_dir(monkeypatch, tmp_path):
    key = dc.make_key("src", "sm_90", ("-O3",), (13, 0))
    assert dc.load(key) is None
    assert dc.store(key, b"payload\0bytes")
    assert dc.load(key) == b"payload\0bytes"
    assert os.path.dirname(dc.entry_path(key)) == str(tmp_path / "cache")
    monkeypatch.delenv("PYFUSER_CACHE_DIR")
    assert dc.cache_dir().endswith(os.path.join(".cache", "pyfuser"))


def test_key_covers_every_part():
    base = ("src", "sm_90", ("-a",), (13, 0))
    keys = {dc.make_key(*base), dc.make_key("src2", *base[1:]), dc.make_key("src", "sm_80", *base[2:]),
            dc.make_key("src", "sm_90", ("-b",), (13, 0)), dc.make_key("src", "sm_90", ("-a",), (13, 1))}
    assert len(keys) == 5
    # no ambiguity from concatenation
    assert dc.make_key("ab", "c") != dc.make_key("a", "bc")


def test_bypass(monkeypatch):
    key = dc.make_key("bypass")
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    assert not dc.store(key, b"x")
    assert not os.path.exists(dc.entry_path(key))
    monkeypatch.delenv("PYFUSER_DISABLE_DISK_CACHE")
    dc.store(key, b"x")
    monkeypatch.setenv("PYFUSER_DISABLE_DISK_CACHE", "1")
    assert dc.load(key) is None


@pytest.mark.parametrize("damage", ["truncate_header", "truncate_payload", "flip_byte", "bad_magic",
                                    "empty", "longer"])
def test_damaged_entry_is_ignored_and_removed(damage):
    key = dc.make_key("damaged", damage)
    dc.store(key, b"A" * 1000)
    path = dc.entry_path(key)
    blob = open(path, "rb").read()
    blob = {"truncate_header": blob[:20], "truncate_payload": blob[:-1],
            "flip_byte": blob[:500] + bytes([blob[500] ^ 1]) + blob[501:],
            "bad_magic": b"XXXXXXXX" + blob[8:], "empty": b"", "longer": blob + b"!"}[damage]
    open(path, "wb").write(blob)
    before = dc.stats["corrupt"]
    assert dc.load(key) is None
    assert dc.stats["corrupt"] == before + 1
    assert not os.path.exists(path)
    assert dc.store(key, b"A" * 1000) and dc.load(key) == b"A" * 1000


def test_unreadable_entry_is_a_miss(tmp_path):
    key = dc.make_key("dir")
    os.makedirs(dc.entry_path(key))  # a directory where the file should be
    assert dc.load(key) is None


def test_unwritable_dir_never_raises(monkeypatch, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(blocker / "sub"))
    assert dc.store(dc.make_key("x"), b"x") is False
    assert dc.load(dc.make_key("x")) is None


def _writer(args):
    cache, wid, n = args
    os.environ["PYFUSER_CACHE_DIR"] = cache
    bad = 0
    for i in range(n):
        shared = dc.make_key("shared", i % 5)
        payload = (b"shared-%d-" % (i % 5)) * 2000
        dc.store(shared, payload)
        own = dc.make_key("own", wid, i)
        dc.store(own, b"own-%d-%d" % (wid, i))
        got = dc.load(shared)
        if got is not None and got != payload:
            bad += 1
        if dc.load(own) != b"own-%d-%d" % (wid, i):
            bad += 1
    return bad


def test_concurrent_writers_and_readers(tmp_path):
    cache = str(tmp_path / "cache")
    ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
    with ctx.Pool(4) as pool:
        bad = pool.map(_writer, [(cache, w, 40) for w in range(4)])
    assert bad == [0, 0, 0, 0]
    names = os.listdir(cache)
    assert not [n for n in names if n.endswith(".tmp")], "temp files left behind"
    assert len(names) == 5 + 4 * 40
    os.environ["PYFUSER_CACHE_DIR"] = cache
    for i in range(5):
        assert dc.load(dc.make_key("shared", i)) == (b"shared-%d-" % i) * 2000


def test_clear():
    dc.store(dc.make_key("a"), b"a")
    dc.store(dc.make_key("b"), b"b")
    assert dc.clear() == 2
    assert dc.load(dc.make_key("a")) is None


# ----- an entry proves it is the kernel asked for -------------------------------------------
def test_entry_copied_from_another_key_is_rejected():
    a, b = dc.make_key("kernel a"), dc.make_key("kernel b")
    dc.store(a, b"cubin of a", "kern_a")
    with open(dc.entry_path(a), "rb") as f:
        blob = f.read()
    with open(dc.entry_path(b), "wb") as f:        # valid checksum, but written for key a
        f.write(blob)
    before = dc.stats["foreign"]
    assert dc.load(b, "kern_a") is None
    assert dc.stats["foreign"] == before + 1 and not os.path.exists(dc.entry_path(b))
    assert dc.load(a, "kern_a") == b"cubin of a"


def test_forged_entry_with_valid_checksum_for_another_kernel_is_rejected():
    key = dc.make_key("src", "sm_90", "kern")
    os.makedirs(dc.cache_dir(), mode=0o700, exist_ok=True)
    with open(dc.entry_path(key), "wb") as f:
        f.write(dc.encode(b"someone else's cubin", key, "other_kernel"))
    assert dc.load(key, "kern") is None
    assert not os.path.exists(dc.entry_path(key))
    with open(dc.entry_path(key), "wb") as f:      # right kernel name, entry for another key
        f.write(dc.encode(b"x", dc.make_key("elsewhere"), "kern"))
    assert dc.load(key, "kern") is None


def test_entries_of_the_old_format_are_recompiled():
    import hashlib
    import struct
    key = dc.make_key("old")
    os.makedirs(dc.cache_dir(), mode=0o700, exist_ok=True)
    payload = b"v1 payload"
    with open(dc.entry_path(key), "wb") as f:
        f.write(struct.pack("<8sQ32s", b"PFCUBIN1", len(payload),
                            hashlib.sha256(payload).digest()) + payload)
    assert dc.load(key) is None and not os.path.exists(dc.entry_path(key))


# ----- the directory is private to its user ---------------------------------------------------
def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_cache_dir_is_created_private():
    dc.store(dc.make_key("p"), b"p")
    assert _mode(dc.cache_dir()) == 0o700
    assert _mode(dc.entry_path(dc.make_key("p"))) & 0o077 == 0


@pytest.mark.parametrize("op", ["load", "store"])
def test_shared_cache_dir_of_this_user_is_repaired(op, tmp_path, monkeypatch):
    d = tmp_path / f"shared_{op}"
    d.mkdir(mode=0o777)
    os.chmod(d, 0o777)
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(d))
    if op == "load":
        assert dc.load(dc.make_key("r")) is None
    else:
        assert dc.store(dc.make_key("r"), b"r")
    assert _mode(d) == 0o700


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_cache_dir_of_another_user_is_refused(tmp_path, monkeypatch):
    d = tmp_path / "theirs"
    d.mkdir(mode=0o700)
    monkeypatch.setenv("PYFUSER_CACHE_DIR", str(d))
    key = dc.make_key("t")
    with open(d / (key + dc.SUFFIX), "wb") as f:
        f.write(dc.encode(b"planted", key, ""))
    real = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: real + 12345)
    before = dc.stats["refused"]
    assert dc.load(key) is None                    # never read from a directory not ours
    assert dc.store(key, b"mine") is False
    assert dc.stats["refused"] == before + 1
    assert os.path.exists(d / (key + dc.SUFFIX))   # and nothing of theirs is touched
