"""The graph cache's fallbacks (frontend/fx/graph_cache.py): a damaged or refused entry is
compiled again with the reason logged, a failure through the cache compiles without it, the
switch off never enters it nor changes the plan cache's keys, and a torch lacking one of the
internals it uses turns it off with one warning; every result equals eager's."""
from __future__ import annotations

import copy
import logging
import os
import pickle
import sys

import pytest
import torch

from pyfuser.frontend.fx import graph_cache, graph_cache_entry
from pyfuser.runtime import disk_cache
from graph_cache_cases import _eager, _model, _same, _stats, _train
from test_compile_cache import _fresh_process_state  # noqa: E402 - tests/cpu is on the path

pytestmark = pytest.mark.usefixtures("graph_cache_on")


def _damaged(how: str, data: bytes, key: str) -> bytes:
    if how == "flipped byte":
        out = bytearray(data)
        out[len(out) // 2] ^= 0xFF
        return bytes(out)
    if how == "truncated":
        return data[:len(data) // 2]
    if how == "empty":
        return b""
    if how == "not a pickle":                   # a well-formed entry holding garbage
        return disk_cache.encode(b"\x80\x04garbage", key, graph_cache.NAME)
    if how == "another format":
        return disk_cache.encode(pickle.dumps((graph_cache.FORMAT + 1, None)), key,
                                 graph_cache.NAME)
    raise AssertionError(how)


# how -> what says why it was not used: the disk cache's checksum, or the entry's refusal
_DAMAGE = {"flipped byte": "damaged entry", "truncated": "damaged entry",
           "empty": "damaged entry", "not a pickle": "refused", "another format": "refused"}


@pytest.mark.parametrize("how", sorted(_DAMAGE))
def test_a_damaged_entry_is_compiled_again_with_a_logged_reason(how, caplog):
    """A damaged, truncated or foreign entry is never used and never a crash: the graph is
    compiled as without the cache (the cold compile's results), the reason logged at INFO."""
    base = _model()
    x = torch.randn(4, 16)
    cold = _train(copy.deepcopy(base), x, steps=1)
    d = disk_cache.cache_dir()
    paths = [os.path.join(d, n) for n in os.listdir(d) if n.endswith(disk_cache.GRAPH_SUFFIX)]
    assert len(paths) == 2
    for path in paths:
        with open(path, "rb") as f:
            data = f.read()
        with open(path, "wb") as f:
            f.write(_damaged(how, data, os.path.basename(path)[:-len(disk_cache.GRAPH_SUFFIX)]))
    _fresh_process_state()
    with caplog.at_level(logging.INFO, logger="pyfuser"):
        warm = _train(copy.deepcopy(base), x, steps=1)
    s = _stats()
    assert s["hits"] == 0, s
    _same(warm, cold, exact=True)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert sum(_DAMAGE[how] in m for m in said) == 2, said
    if _DAMAGE[how] == "refused":
        assert s["refused"] == 2 and not any(os.path.exists(p) for p in paths), s
    else:                                     # a miss: compiled and stored again
        assert s["stores"] == 4 and all(os.path.exists(p) for p in paths), s


def test_an_entry_that_does_not_rebuild_is_refused(monkeypatch):
    base = _model()
    x = torch.randn(4, 16)
    cold = _train(copy.deepcopy(base), x, steps=1)
    _fresh_process_state()

    def broken(*a, **k):
        raise RuntimeError("simulated")
    monkeypatch.setattr(graph_cache_entry, "recompile", broken)
    warm = _train(copy.deepcopy(base), x, steps=1)
    s = _stats()
    assert s["hits"] == 0 and s["refused"] == 2, s
    _same(warm, cold)


def test_a_failure_through_the_cache_compiles_without_it(monkeypatch):
    def broken(*a, **k):
        raise RuntimeError("simulated")
    monkeypatch.setattr(graph_cache, "_compile_and_store", broken)
    base = _model()
    x = torch.randn(4, 16)
    got = _train(copy.deepcopy(base), x, steps=1)
    s = _stats()
    assert s["stores"] == 0 and s["bypass"] == 2 and "simulated" in graph_cache.last_bypass[0]
    _same(got, _eager(copy.deepcopy(base), x, steps=1))


def test_on_by_default():
    """Unset, PYFUSER_GRAPH_CACHE means on; the plan cache's switches still turn it off."""
    import os
    from unittest import mock
    with mock.patch.dict(os.environ):
        os.environ.pop("PYFUSER_GRAPH_CACHE", None)
        assert graph_cache.enabled()
        os.environ["PYFUSER_GRAPH_CACHE"] = "1"
        assert graph_cache.enabled()
        os.environ["PYFUSER_DISABLE_PLAN_CACHE"] = "1"       # the plan cache's switch too
        assert not graph_cache.enabled()


@pytest.mark.parametrize("value", ["0", "off", "False"])
def test_switched_off_the_cache_is_not_entered(value, monkeypatch):
    """With PYFUSER_GRAPH_CACHE=0 the backend never enters the cache's code (no key, no
    torch internals): what it compiles is AOTAutograd's compile as without this module."""
    monkeypatch.setenv("PYFUSER_GRAPH_CACHE", value)

    def entered(*a, **k):
        raise AssertionError("the graph cache was entered while off")
    for name in ("compile", "_torch_parts", "key_for"):
        monkeypatch.setattr(graph_cache, name, entered)
    base = _model()
    x = torch.randn(4, 16)
    got = _train(copy.deepcopy(base), x, steps=1)
    _same(got, _eager(copy.deepcopy(base), x, steps=1))
    assert not graph_cache.enabled()
    d = disk_cache.cache_dir()
    assert not [n for n in (os.listdir(d) if os.path.isdir(d) else [])
                if n.endswith(disk_cache.GRAPH_SUFFIX)]


def test_the_switch_does_not_change_the_plan_cache_keys(monkeypatch):
    """PYFUSER_GRAPH_CACHE only places AOTAutograd's results: regions' plans and CUBINs stored
    with it on are found with it off."""
    from pyfuser.runtime import plan_store
    on = plan_store.environment("interpret")
    monkeypatch.delenv("PYFUSER_GRAPH_CACHE")
    assert plan_store.environment("interpret") == on


def _lacks_lookup(monkeypatch):
    from torch._functorch._aot_autograd import autograd_cache as ac
    monkeypatch.delattr(ac.AOTAutogradCache, "_lookup")


def _lacks_graph_pickler(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.fx._graph_pickler", None)    # ImportError


def _lacks_metadata_filter(monkeypatch):
    import dataclasses
    import torch.fx._graph_pickler as gp

    @dataclasses.dataclass
    class OldOptions:                           # a torch whose Options has no such field
        ops_filter: object = None
    monkeypatch.setattr(gp, "Options", OldOptions)


@pytest.mark.parametrize("lack", [_lacks_lookup, _lacks_graph_pickler, _lacks_metadata_filter])
def test_a_torch_without_a_piece_compiles_without_the_cache(lack, monkeypatch, caplog):
    """A torch lacking an internal the cache uses (an attribute, a module, a signature) turns
    the cache off with one logged line; every graph compiles as without it, correctly."""
    lack(monkeypatch)
    base = _model()
    x = torch.randn(4, 16)
    with caplog.at_level(logging.INFO, logger="pyfuser"):
        got = _train(copy.deepcopy(base), x, steps=1)
    _same(got, _eager(copy.deepcopy(base), x, steps=1))
    s = _stats()
    assert s["bypass"] == 2 and s["stores"] == 0 and s["misses"] == 0, s
    said = [r for r in caplog.records if "graph cache" in r.getMessage()]
    assert len(said) == 1 and "lacks" in said[0].getMessage(), [r.getMessage() for r in said]
    assert graph_cache.missing[0] and graph_cache._PARTS == [None]
