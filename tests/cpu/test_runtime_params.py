"""Kernel argument packing: C layout of mixed parameters, value extraction, no silent narrowing."""
import ctypes
import struct

import pytest
import torch

from pyfuser.codegen.kernel import Param
from pyfuser.errors import ExecuteError
from pyfuser.ir import DataType, Fusion, Scalar
from pyfuser.runtime.params import CTYPES_CTYPES, ParamPacker, c_layout

MIXED = ["void*", "int", "void*", "double", "bool", "int64_t", "float", "uint32_t", "bool",
         "double", "int"]


def test_layout_matches_the_c_abi():
    fmt, offsets, size = c_layout(MIXED)

    class S(ctypes.Structure):
        _fields_ = [(f"f{i}", CTYPES_CTYPES[c]) for i, c in enumerate(MIXED)]

    assert offsets == [getattr(S, f"f{i}").offset for i in range(len(MIXED))]
    assert size == ctypes.sizeof(S)
    assert struct.calcsize(fmt) == size
    assert offsets[:4] == [0, 8, 16, 24]   # the int is padded to 8 before the next pointer


def test_small_layouts():
    assert c_layout([]) == ("<", [], 0)
    assert c_layout(["int"])[1:] == ([0], 8)
    assert c_layout(["bool", "float"])[1:] == ([0, 4], 8)
    with pytest.raises(ExecuteError, match="half"):
        c_layout(["half"])


def _fusion_scalars():
    f = Fusion()
    with f:
        s = Scalar(DataType.Double, None, f)
        k = Scalar(DataType.Int, 7, f)
    return s, k


def test_values_and_packing():
    s, k = _fusion_scalars()
    a = torch.randn(3, 5)[:, 1:]
    out = torch.empty(3, 4, dtype=torch.float64)
    params = [Param("p0", "void*", ("ptr", 0)), Param("n", "int", ("numel", 1)),
              Param("p1", "void*", ("ptr", 1)), Param("alpha", "double", ("scalar", s)),
              Param("flag", "bool", ("scalar", k)), Param("st", "int64_t", ("stride", 0, 0)),
              Param("sz", "int", ("size", 0, 1)), Param("c", "float", ("scalar", k))]
    pk = ParamPacker(params)
    vals = pk.values([a, out], {s: 2.5})
    assert vals == (a.data_ptr(), 12, out.data_ptr(), 2.5, True, 5, 4, 7.0)
    blob = pk.pack([a, out], {s: 2.5})
    assert len(blob) == pk.size
    assert struct.unpack_from("<Q", blob, pk.offsets[0])[0] == a.data_ptr()
    assert struct.unpack_from("<i", blob, pk.offsets[1])[0] == 12
    assert struct.unpack_from("<d", blob, pk.offsets[3])[0] == 2.5
    assert struct.unpack_from("<q", blob, pk.offsets[5])[0] == 5
    buf = ctypes.create_string_buffer(pk.size)
    pk.pack_into(buf, [a, out], {s: 2.5})
    assert buf.raw == blob
    assert "alpha" in pk.describe()


def test_no_silent_narrowing():
    s, _ = _fusion_scalars()
    pk = ParamPacker([Param("n", "int", ("scalar", s))])
    with pytest.raises(ExecuteError, match="'n'.*int"):
        pk.pack([], {s: 2 ** 31})
    pk = ParamPacker([Param("u", "uint32_t", ("scalar", s))])
    with pytest.raises(ExecuteError, match="'u'"):
        pk.pack([], {s: -1})
    pk = ParamPacker([Param("f", "float", ("scalar", s))])
    with pytest.raises(ExecuteError, match="'f'"):
        pk.pack([], {s: 1e300})


def test_unknown_source_is_rejected():
    with pytest.raises(ExecuteError, match="unknown source"):
        ParamPacker([Param("x", "int", ("magic", 0))])
