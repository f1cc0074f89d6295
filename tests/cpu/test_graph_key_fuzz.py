"""A seeded fuzz of the graphed calls' signature key (frontend/fx/cuda_graphs.py): random
argument lists (tensors of random shapes, strides, dtypes and storage offsets, views of one
storage, ints negative and past 32 bits, floats with -0.0 / NaN / infinities, bools, None)
through the native runner's `graph_key` and `GraphedInference.python_key`. Two lists get equal
native keys exactly when their Python keys are equal, for every pair; the native key is bytes
or, for an int past int64 alone, None; it never raises."""
from __future__ import annotations

import math
import random
import struct

import pytest
import torch

from pyfuser.frontend.fx.cuda_graphs import GraphedInference

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64,
          torch.int32, torch.int8, torch.uint8, torch.bool]
INTS = [0, 1, -1, 2, 3, 7, -7, 2 ** 31 - 1, 2 ** 31, -2 ** 31, 2 ** 32, 2 ** 63 - 1, -2 ** 63,
        123456789012]
FLOATS = [0.0, -0.0, 1.0, 1.5, -1.5, 3.0, math.inf, -math.inf, math.nan, 1e-300, 5e-324,
          1e300]


@pytest.fixture(scope="module")
def mod():
    from pyfuser.runtime import native
    m = native.build()
    if m is None or not hasattr(m, "graph_key"):
        pytest.skip("the native runner is not built here")
    return m


class _AnyDevice:
    any_device = True


def _graphed(static_idx, keyed):
    g = GraphedInference(lambda args: args, static_idx=static_idx, backend=_AnyDevice())
    g.keyed_by_address = keyed
    return g


def _tensor(r: random.Random, pool: list) -> torch.Tensor:
    """A fresh tensor, a view of a pooled one (same storage: other offsets, strides), or a
    pooled one itself (same address)."""
    roll = r.random()
    if pool and roll < 0.25:
        return r.choice(pool)
    if pool and roll < 0.5:
        base = r.choice(pool)
        if base.dim() >= 1 and base.shape[0] > 1:
            v = base[r.randint(0, 1):]
            return v.transpose(0, -1) if v.dim() >= 2 and r.random() < 0.5 else v
        return base.view(base.shape)
    rank = r.randint(0, 3)
    shape = tuple(r.choice([0, 1, 2, 3, 5]) for _ in range(rank))
    dt = r.choice(DTYPES)
    t = torch.zeros(shape, dtype=dt)
    kind = r.random()
    if rank >= 2 and kind < 0.2:
        t = t.transpose(0, 1)
    elif rank >= 1 and kind < 0.35:
        t = torch.zeros((shape[0] + 2,) + shape[1:], dtype=dt)[2:]       # offset 2 rows
    elif rank >= 1 and kind < 0.45:
        t = torch.zeros(shape[:-1] + (1,), dtype=dt).expand(shape)     # stride 0
    elif rank >= 1 and kind < 0.55:
        t = torch.zeros(shape[:-1] + (shape[-1] * 2,), dtype=dt)[..., ::2]
    pool.append(t)
    return t


def _float(r: random.Random) -> float:
    if r.random() < 0.1:     # a NaN with another payload or sign
        bits = 0x7FF8000000000000 | r.choice([1, 2, 1 << 40]) | r.choice([0, 1 << 63])
        return struct.unpack("<d", struct.pack("<Q", bits))[0]
    return r.choice(FLOATS)


def _arg(r: random.Random, pool: list):
    roll = r.random()
    if roll < 0.45:
        return _tensor(r, pool)
    if roll < 0.6:
        return r.choice(INTS + [2 ** 64, -2 ** 63 - 1, 10 ** 30])
    if roll < 0.8:
        return _float(r)
    if roll < 0.9:
        return r.choice([True, False])
    return None


def _lists(r: random.Random, n: int) -> list:
    """n argument lists, many of them near copies of each other (the pairs that must compare
    equal, or differ in one place)."""
    pool: list = []
    out: list = []
    for _ in range(n):
        if out and r.random() < 0.15:
            args = [_twin(a) for a in r.choice(out)]
        elif out and r.random() < 0.6:
            args = list(r.choice(out))
            if args and r.random() < 0.8:
                args[r.randrange(len(args))] = _arg(r, pool)
            if r.random() < 0.1:
                args = args[:-1] if args and r.random() < 0.5 else args + [_arg(r, pool)]
        else:
            args = [_arg(r, pool) for _ in range(r.randint(0, 5))]
        out.append(args)
    return out


def _twin(a):
    """A float of the same value and other bits (a NaN of another sign or payload, the other
    zero); anything else as it is."""
    if type(a) is not float:
        return a
    if a != a:
        bits = struct.unpack("<Q", struct.pack("<d", a))[0] ^ (1 << 63)
        return struct.unpack("<d", struct.pack("<Q", bits))[0]
    return -a if a == 0 else a


def _big(a) -> bool:
    return type(a) is int and not -2 ** 63 <= a < 2 ** 63


@pytest.mark.parametrize("seed", range(8))
def test_native_and_python_graph_keys_agree(mod, seed):
    r = random.Random(4100 + seed)
    lists = _lists(r, 120)
    static = frozenset(i for i in range(6) if r.random() < 0.4)
    for keyed in (False, True):
        g = _graphed(static, keyed)
        nat, py = [], []
        for args in lists:
            mask = bytes(1 if keyed and i in static else 0 for i in range(len(args)))
            k = mod.graph_key(args, mask, True)
            p = g.python_key(args)
            assert p is not None
            if any(_big(a) for a in args):
                assert k is None, args
            else:
                assert isinstance(k, bytes), args
            nat.append(k)
            py.append(p)
        idx = [i for i, k in enumerate(nat) if k is not None]
        equal_pairs = 0
        for i in idx:
            for j in idx:
                assert (nat[i] == nat[j]) == (py[i] == py[j]), (keyed, lists[i], lists[j])
                equal_pairs += i != j and nat[i] == nat[j]
        assert equal_pairs > 0          # the draw makes equal keys of distinct lists


def test_python_key_tells_nans_apart_by_their_bits(mod):
    """float.hex gives 'nan' for every NaN: the Python key took a NaN of the other sign (or
    another payload) for the same argument, where graph_key (by the bits) does not."""
    g = _graphed(frozenset(), False)
    nan = float("nan")
    other = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    for a, b in ((nan, -nan), (nan, other), (0.0, -0.0)):
        assert g.python_key([a]) != g.python_key([b])
        assert mod.graph_key([a], b"", True) != mod.graph_key([b], b"", True)
    assert g.python_key([nan]) == g.python_key([float("nan")])


def test_graph_key_takes_other_sequences_and_odd_arguments_without_raising(mod):
    """A tuple or list of arguments; a mask shorter than the list; arguments the key does not
    take (an object, a sparse tensor, a tensor subclass parameter is a tensor) give None or
    bytes, never an exception."""
    t = torch.zeros(3)
    assert mod.graph_key((t, 1), b"", True) == mod.graph_key([t, 1], bytes(2), True)
    assert mod.graph_key([t, 1], b"\x01", True) != mod.graph_key([t, 1], b"", True)
    assert mod.graph_key([object()], b"", True) is None
    assert mod.graph_key([t.to_sparse()], b"", True) is None
    assert mod.graph_key([torch.zeros(2, device="meta")], b"", True) is not None
    p = torch.nn.Parameter(torch.zeros(3))
    assert mod.graph_key([p], b"", True) == mod.graph_key([t], b"", True)
    assert mod.graph_key([], b"", True) == mod.graph_key((), b"", False)
